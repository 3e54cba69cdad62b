"""Workspaces: host directories the sandbox sees as ``/workspace``."""

from mcp_sandbox.workspace.removal import remove_tree

__all__ = ["remove_tree"]
