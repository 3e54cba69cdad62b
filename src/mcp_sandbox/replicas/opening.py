"""What replicas need at start: the secret they share, and the object store reached once."""

from __future__ import annotations

import logging

from mcp_sandbox.config import Settings
from mcp_sandbox.replicas.mirror import Mirror
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.workspace import Metadata, WorkspaceStore, load_secret

__all__ = ["open_mirror", "replicas_secret"]

logger = logging.getLogger(__name__)


def replicas_secret(settings: Settings, metadata: Metadata) -> bytes:
    """This server's secret (``state_dir/secret``); with ``database_url``, the one the first replica
    of the database stored there, so every replica names workspaces and signs links alike.

    Raises:
        ConfigError: the secret file is unusable. WorkspaceError: the database refused.
    """
    local = load_secret(settings.paths.state_dir)
    return local if settings.paths.database_url is None else metadata.shared_secret(local)


def open_mirror(url: str, workspaces: WorkspaceStore) -> Mirror:
    """The mirror into the store at ``url``, reached once: an unreachable store is a start-up
    error, never a silent fall-back to local disk.

    Raises:
        ConfigError: boto3 is missing, or the store cannot be reached.
    """
    objects = ObjectStore(url)
    try:
        objects.check()
    except BaseException:
        objects.close()
        raise
    logger.info("workspaces mirrored to the object store %s", url)
    return Mirror(objects, workspaces)
