"""The piece of the settings that makes several servers one service: the shared database, the object
store, and this replica's address and lease.

A frozen piece of :class:`~mcp_sandbox.config.settings.Settings`, its fields declared with
:func:`~.fields.setting`; it checks its own values when made. The flat keys (``database_url``,
``MCP_SANDBOX_REPLICA_URL``, ...) are the same as before they were gathered here.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_sandbox.config.fields import (
    DURATION,
    check_fields,
    database_url,
    duration,
    http_url,
    object_store_url,
    setting,
)

__all__ = ["ReplicaSettings"]


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """Replicas: the metadata database and object store they share, this one's URL and lease."""

    database_url: str | None = setting(
        None,
        (
            "Where the metadata index lives (tenants, conversations, their files, the run history): "
            "`postgresql://user:password@host:port/db`, else the SQLite file in `state_dir` "
            "([Deploying](deployment.md#the-metadata-database)); also shares the server secret between replicas."
        ),
        check=database_url,
        secret=True,
    )
    object_store_url: str | None = setting(
        None,
        (
            "Where conversations' workspaces are kept for every replica: `s3://bucket/prefix` on an "
            "S3-compatible store, the endpoint and credentials from the standard AWS environment "
            "(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`); "
            "else local disk only ([Scaling](scaling.md#workspaces-in-object-storage))."
        ),
        check=object_store_url,
    )
    replica_url: str | None = setting(
        None,
        (
            "HTTP only, with `database_url`: the base URL the other replicas reach this one at; each"
            " conversation is run by one replica, and calls landing elsewhere are forwarded to it"
            " ([Scaling out](scaling.md#leases-and-forwarding))."
        ),
        check=http_url,
    )
    replica_lease: float = setting(
        15.0,
        (
            "With `replica_url`: how long a replica's hold on a conversation lasts unless renewed (every third"
            " of it); a replica that died is replaced after at most this."
        ),
        check=duration,
        unit=DURATION,
    )

    def __post_init__(self) -> None:
        check_fields(self)
