"""Reading MCP client config files into server entries, not yet checked.

JSON files are read tolerantly: a byte order mark, comments and trailing commas (VS Code's JSONC)
are accepted, and a parse error names its line and column. Our TOML file, parsed by
:mod:`mcp_sandbox.config` as at start, gives its ``[servers]`` tables, each an entry or a tool
policy. :class:`Scan` reads the files that :func:`mcp_sandbox.bridge.discovery.discover` names,
each once, and turns every unreadable file or malformed section into a :class:`Problem` instead
of raising.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mcp_sandbox.bridge.server_entries import Entry, InvalidEntry, Policy, is_policy, read_policy
from mcp_sandbox.bridge.server_spec import Problem
from mcp_sandbox.config import parse_config_file
from mcp_sandbox.errors import ConfigError

__all__ = ["Scan"]


_JSONC_COMMENT = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\n]*|/\*.*?\*/', re.DOTALL)
_JSONC_TRAILING_COMMA = re.compile(r'"(?:[^"\\]|\\.)*"|,(?=\s*[]}])', re.DOTALL)


def _blank(match: re.Match[str]) -> str:
    # Strings stay; comments and trailing commas become spaces, so line and column numbers hold.
    text = match.group()
    return text if text.startswith('"') else re.sub(r"[^\r\n]", " ", text)


class _Unreadable(Exception):
    """A file could not be read or parsed (the message is the reason)."""


def _parse_json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        pass
    tolerant = _JSONC_TRAILING_COMMA.sub(_blank, _JSONC_COMMENT.sub(_blank, text))
    try:
        return json.loads(tolerant)
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    except (ValueError, RecursionError) as exc:
        raise _Unreadable("invalid JSON") from exc


_GENERIC: tuple[tuple[str, ...], ...] = (("mcpServers",), ("servers",))
_MCP_SERVERS: tuple[tuple[str, ...], ...] = (("mcpServers",),)


class Scan:
    """Collects entries, policies, problems and searched paths, source by source."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.policies: dict[str, Policy] = {}
        self.problems: list[Problem] = []
        self.searched: list[Path] = []
        self._seen: set[Path] = set()

    def _problem(self, source: Path, reason: str, server: str | None = None) -> None:
        self.problems.append(Problem(source, reason, server))

    def _read(self, path: Path, *, required: bool = False) -> str | None:
        """The text of ``path``; None when it is absent, already read, or unreadable (a problem)."""
        self.searched.append(path)
        try:
            if not path.exists():
                if required:
                    self._problem(path, "the file does not exist")
                return None
            real = path.resolve()
            if real in self._seen:
                return None
            self._seen.add(real)
            return path.read_text(encoding="utf-8-sig")
        except OSError as exc:
            self._problem(path, f"cannot read: {exc.strerror or exc}")
        except UnicodeDecodeError:
            self._problem(path, "cannot read: not UTF-8 text")
        return None

    def _json(self, path: Path, *, required: bool = False) -> dict[str, Any] | None:
        text = self._read(path, required=required)
        if text is None:
            return None
        try:
            data = _parse_json(text)
        except _Unreadable as exc:
            self._problem(path, str(exc))
            return None
        if not isinstance(data, dict):
            self._problem(path, "the top level is not a JSON object")
            return None
        return data

    def _section(self, path: Path, data: dict[str, Any], keys: tuple[str, ...]) -> bool:
        """Add the entries under ``data[keys[0]][keys[1]]...``; whether that section exists."""
        section: object = data
        for key in keys:
            if not isinstance(section, dict) or key not in section:
                return False
            section = section[key]
        if not isinstance(section, dict):
            self._problem(path, f"{'.'.join(keys)}: not an object")
            return True
        self.entries.extend(Entry(str(name), body, path, toml=False) for name, body in section.items())
        return True

    def json_file(
        self,
        path: Path,
        sections: tuple[tuple[str, ...], ...] = _MCP_SERVERS,
        *,
        generic: bool = False,
        required: bool = False,
    ) -> None:
        """Add the entries of a JSON file; a generic one must have a server section."""
        data = self._json(path, required=required)
        if data is None:
            return
        found = [self._section(path, data, keys) for keys in sections]  # every section, no short cut
        if generic and not any(found):
            self._problem(path, 'no "mcpServers" or "servers" object')

    def generic_file(self, path: Path, *, required: bool = False) -> None:
        """Add the entries of a file of ours, under ``mcpServers``, ``servers`` or both."""
        self.json_file(path, _GENERIC, generic=True, required=required)

    def json_directory(self, directory: Path) -> None:
        self.searched.append(directory)
        try:
            if not directory.is_dir():
                return
            paths = sorted(
                (path for path in directory.iterdir() if path.suffix == ".json" and not path.name.startswith(".")),
                key=lambda path: path.name,
            )
        except OSError as exc:
            self._problem(directory, f"cannot list: {exc.strerror or exc}")
            return
        for path in paths:
            self.generic_file(path)

    def claude_code(self, user_file: Path, project_file: Path, project: str) -> None:
        # Claude Code's own precedence: local scope, then project scope, then user scope.
        data = self._json(user_file)
        if data is not None:
            self._section(user_file, data, ("projects", project, "mcpServers"))
        self.json_file(project_file)
        if data is not None:
            self._section(user_file, data, ("mcpServers",))

    def toml_file(self, path: Path) -> None:
        text = self._read(path)
        if text is None:
            return
        try:
            servers = parse_config_file(text, path).servers
        except ConfigError as exc:
            self._problem(path, str(exc))
            return
        self._toml_servers(path, servers)

    def toml_read(self, path: Path, servers: object) -> None:
        """The ``[servers]`` table of ``path`` as the settings' loader read it: the file is not read again."""
        self.searched.append(path)
        self._seen.add(path.resolve())
        self._toml_servers(path, servers)

    def _toml_servers(self, path: Path, servers: object) -> None:
        if servers is None:
            return
        if not isinstance(servers, dict):
            self._problem(path, "servers: not a table")
            return
        for name, body in servers.items():
            if is_policy(body):
                self._policy(path, name, body)
            else:
                self.entries.append(Entry(name, body, path, toml=True))

    def _policy(self, path: Path, name: str, body: dict[str, Any]) -> None:
        try:
            self.policies[name] = read_policy(path, body)
        except InvalidEntry as exc:
            self._problem(path, str(exc), name)
