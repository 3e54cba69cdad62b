"""Workspaces: host directories the sandbox sees as ``/workspace``, their files, quotas,
retention and metadata index."""

import importlib
import typing

if typing.TYPE_CHECKING:
    from mcp_sandbox.workspace.executions import ExecutionRecord
    from mcp_sandbox.workspace.files import FileEntry, Listing, OpenFile, Usage
    from mcp_sandbox.workspace.metadata import METADATA_FILE, ConversationRecord, Metadata
    from mcp_sandbox.workspace.names import RESERVED_PREFIX, check_conversation_id, check_filename
    from mcp_sandbox.workspace.removal import remove_tree
    from mcp_sandbox.workspace.retention import SweepReport, sweep
    from mcp_sandbox.workspace.secret import derive_key, load_secret
    from mcp_sandbox.workspace.store import WorkspaceStore
    from mcp_sandbox.workspace.writing import PendingWrite

# Imported on first use: a run without a conversation needs only removal (its scratch directory),
# not the metadata database, the store or retention (bench/startup.py).
_HOMES = {
    "files": ("FileEntry", "Listing", "OpenFile", "Usage"),
    "executions": ("ExecutionRecord",),
    "metadata": ("METADATA_FILE", "ConversationRecord", "Metadata"),
    "names": ("RESERVED_PREFIX", "check_conversation_id", "check_filename"),
    "removal": ("remove_tree",),
    "retention": ("SweepReport", "sweep"),
    "secret": ("derive_key", "load_secret"),
    "store": ("WorkspaceStore",),
    "writing": ("PendingWrite",),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> typing.Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'mcp_sandbox.workspace' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mcp_sandbox.workspace.{module}"), name)


__all__ = [
    "METADATA_FILE",
    "RESERVED_PREFIX",
    "ConversationRecord",
    "ExecutionRecord",
    "FileEntry",
    "Listing",
    "Metadata",
    "OpenFile",
    "PendingWrite",
    "SweepReport",
    "Usage",
    "WorkspaceStore",
    "check_conversation_id",
    "check_filename",
    "derive_key",
    "load_secret",
    "remove_tree",
    "sweep",
]
