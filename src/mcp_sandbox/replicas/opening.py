"""What replicas need at start: the object store, reached once."""

from __future__ import annotations

import logging

from mcp_sandbox.replicas.mirror import Mirror
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.workspace import WorkspaceStore

__all__ = ["open_mirror"]

logger = logging.getLogger(__name__)


def open_mirror(url: str, workspaces: WorkspaceStore, grace: float = 0.0) -> Mirror:
    """The mirror into the store at ``url``, reached once: an unreachable store is a start-up
    error, never a silent fall-back to local disk; packs no index names are swept once ``grace`` old.

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
    return Mirror(objects, workspaces, grace)
