"""Workspaces: host directories the sandbox sees as ``/workspace``, their files, quotas,
retention and metadata index."""

from mcp_sandbox.workspace.files import FileEntry, Listing, OpenFile, Usage
from mcp_sandbox.workspace.metadata import METADATA_FILE, ConversationRecord, ExecutionRecord, Metadata
from mcp_sandbox.workspace.names import RESERVED_PREFIX, check_conversation_id, check_filename
from mcp_sandbox.workspace.removal import remove_tree
from mcp_sandbox.workspace.retention import SweepReport, sweep
from mcp_sandbox.workspace.secret import derive_key, load_secret
from mcp_sandbox.workspace.store import WorkspaceStore
from mcp_sandbox.workspace.writing import PendingWrite

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
