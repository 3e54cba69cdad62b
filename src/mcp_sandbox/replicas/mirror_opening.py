"""What replicas need at start: the object store, reached once."""

from __future__ import annotations

import logging

from mcp_sandbox.config import ReplicaSettings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.replicas.mirror import Mirror
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.workspace import WorkspaceStore

__all__ = ["open_mirror"]

logger = logging.getLogger(__name__)

# An owner stalled past its lease may still be writing a pack its index is about to name (.indexing).
SWEEP_LEASES = 4


def open_mirror(replicas: ReplicaSettings, workspaces: WorkspaceStore) -> Mirror:
    """The mirror into the store at ``object_store_url``, reached once: an unreachable store is a
    start-up error, never a silent fall-back to local disk. Among replicas, packs no index names are
    swept once :data:`SWEEP_LEASES` lease times old.

    Raises:
        ConfigError: boto3 is missing, or the store cannot be reached.
    """
    url = replicas.object_store_url
    if url is None:
        raise ConfigError("object_store_url is not set")
    objects = ObjectStore(url)
    try:
        objects.check()
    except BaseException:
        objects.close()
        raise
    logger.info("workspaces mirrored to the object store %s", url)
    lease = replicas.replica_lease if replicas.replica_url is not None else 0.0
    return Mirror(objects, workspaces, SWEEP_LEASES * lease)
