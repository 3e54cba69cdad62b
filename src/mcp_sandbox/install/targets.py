"""The MCP clients ``install`` knows: where each keeps its servers, and the entry it wants.

Checked against each client's documentation: Claude Code's user scope is the top-level
``mcpServers`` of ``~/.claude.json`` (what ``claude mcp add --scope user`` writes); Claude
Desktop on Linux reads ``~/.config/Claude/claude_desktop_config.json``; Cursor ``~/.cursor/mcp.json``;
VS Code the ``servers`` of the user profile's ``mcp.json`` (``~/.config/Code/User/mcp.json``; a
workspace's is ``.vscode/mcp.json``, given with ``--path``), where ``type`` is required.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CLIENTS", "Client"]


def _config_home(home: Path, env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_CONFIG_HOME", "")
    return Path(xdg) if os.path.isabs(xdg) else home / ".config"


@dataclass(frozen=True, slots=True)
class Client:
    """One client: its config file, the key holding its servers, and whether entries carry ``type``."""

    name: str
    label: str
    locate: Callable[[Path, Mapping[str, str]], Path]
    key: str
    typed: bool

    def entry(self, command: str, args: Sequence[str]) -> dict[str, Any]:
        """The server entry for a stdio server started by ``command args``."""
        entry: dict[str, Any] = {"type": "stdio"} if self.typed else {}
        entry.update({"command": command, "args": list(args)})
        return entry


CLIENTS: Mapping[str, Client] = {
    client.name: client
    for client in (
        Client("claude-code", "Claude Code (user scope)", lambda home, env: home / ".claude.json", "mcpServers", True),
        Client(
            "claude-desktop",
            "Claude Desktop",
            lambda home, env: _config_home(home, env) / "Claude" / "claude_desktop_config.json",
            "mcpServers",
            False,
        ),
        Client("cursor", "Cursor", lambda home, env: home / ".cursor" / "mcp.json", "mcpServers", False),
        Client(
            "vscode",
            "VS Code (user profile)",
            lambda home, env: _config_home(home, env) / "Code" / "User" / "mcp.json",
            "servers",
            True,
        ),
    )
}
