"""Replicas: several servers behind one load balancer, sharing state through the metadata database and an object store.

:mod:`.leases` gives each conversation one owner replica at a time; :mod:`.forward` sends a call
that lands elsewhere to that owner, signed with the shared secret (:mod:`.signing`);
:mod:`.mirror` keeps each conversation's workspace in S3-compatible storage (:mod:`.objects`).
"""
