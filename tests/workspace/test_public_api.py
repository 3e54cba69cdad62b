"""The workspace package's public names: a test that fails when they change by accident."""

from __future__ import annotations

import mcp_sandbox.workspace as workspace


def test_the_workspace_package_exports_exactly_its_documented_names() -> None:
    assert sorted(workspace.__all__) == [
        "ConversationRecord",
        "ExecutionRecord",
        "FileEntry",
        "Listing",
        "METADATA_FILE",
        "Metadata",
        "OpenFile",
        "PendingWrite",
        "RESERVED_PREFIX",
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
    for name in workspace.__all__:
        assert hasattr(workspace, name)
