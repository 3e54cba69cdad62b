"""Which downstream MCP servers exist: the explicit file, our ``[servers]``, the user's MCP clients.

Sources, in order. The first entry of a server name wins; a later entry of the same name is
*shadowed* and listed in :attr:`Discovery.skipped`. ``~`` is the home directory, ``./`` the
current directory, ``~/.config`` is ``$XDG_CONFIG_HOME`` when that is set::

    1. servers_config (--servers-config, MCP_SANDBOX_SERVERS_CONFIG, MCP_SERVERS_CONFIG)
                                     a JSON file; a problem when it is set but missing
    2. [servers.<name>] tables of our TOML config file (--config, MCP_SANDBOX_CONFIG)
       -- with discover_servers = false, nothing below is read --
    3. ~/MCPs/*.json
    4. ~/.config/mcp/servers/*.json
    5. ./mcp-servers/*.json
    6. Claude Code     ~/.claude.json projects["<cwd>"].mcpServers   (local scope)
                       ./.mcp.json                                   (project scope)
                       ~/.claude.json mcpServers                     (user scope)
    7. Claude Desktop  ~/.config/Claude/claude_desktop_config.json
                       (macOS: ~/Library/Application Support/Claude/claude_desktop_config.json)
    8. Cursor          ./.cursor/mcp.json, then ~/.cursor/mcp.json
    9. VS Code         ./.vscode/mcp.json, then the user's ~/.config/Code/User/mcp.json, then
                       "mcp": {"servers": ...} in ~/.config/Code/User/settings.json
                       (macOS: ~/Library/Application Support/Code/User/)
   10. Windsurf        ~/.codeium/windsurf/mcp_config.json

Directories are read in file-name order, ``*.json`` only, skipping names that start with a dot.
A file is read once even when two sources name it. Every JSON file may hold comments and trailing
commas (VS Code's JSONC).

Entries live under ``mcpServers`` (Claude, Cursor, Windsurf) or ``servers`` (VS Code); the generic
files of 1, 3, 4 and 5 may use either. An entry is either stdio (``command``, ``args``, ``env``,
``cwd``, the latter relative to the file's directory) or HTTP (``url``, Windsurf's ``serverUrl``,
``headers``), optionally with ``type`` (``stdio``, ``http``, ``sse``, ``streamable-http``: all
but ``stdio`` mean HTTP at the given URL). ``disabled: true`` skips an entry. ``allowTools`` and
``denyTools`` (``allow_tools``/``deny_tools`` in TOML) list the tools sandboxed code may call.

``${VAR}``, ``${env:VAR}`` and ``${VAR:-default}`` expand from the environment in command, args,
env values, cwd, url and header values (``${workspaceFolder}`` and ``${userHome}`` as in VS Code);
an entry with a variable that does not resolve (VS Code's ``${input:...}`` included) is not loaded.

A ``[servers.<name>]`` table with no ``command`` or ``url``, only ``allow_tools``, ``deny_tools``
or ``disabled``, is a policy for the server of that name, whichever source defines it. Allow lists
intersect and deny lists add up.

An entry that would start mcp-sandbox itself (a command named ``mcp-sandbox``; an argument
``mcp-sandbox``, ``mcp_sandbox``, ``.../mcp-sandbox``, ``mcp-sandbox@<version>``, or ``-m
mcp_sandbox...``) is skipped. The first entry of a name claims it even when it is disabled,
malformed or mcp-sandbox itself: a later entry never stands in for it silently.

Each server gets an *alias*, the Python identifier by which sandboxed code knows it: the name in
lower case, each run of characters outside ``[a-z0-9_]`` turned into ``_``, ``_`` stripped from
both ends, ``s_`` before a leading digit, ``server`` if nothing is left, ``_`` after a keyword, and
``_2``, ``_3``, ... after an alias already given.

Nothing here raises for a bad user file: malformed files and entries become problems (:class:`Problem`),
and the other files and entries still load.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
import os
import re
import sys
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from types import MappingProxyType
from typing import Any, Literal

from mcp_sandbox.config import Settings
from mcp_sandbox.errors import ConfigError

__all__ = ["Discovery", "Problem", "ServerSpec", "discover"]


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


# Arguments whose value is masked when a command line is shown (``--api-key X``, ``--token=X``).
_SECRET_FLAG = re.compile(r"^--?[\w-]*(key|token|secret|passw(or)?d|auth|credential)[\w-]*$", re.IGNORECASE)


def _mask_url(text: str) -> str:
    """Mask a URL's password and query values, which often carry API keys."""
    if "://" not in text:
        return text
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        return text
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{userinfo}@{host}"
    query = re.sub(r"=[^&;]*", "=***", parts.query)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _mask_args(args: Iterable[str]) -> list[str]:
    shown: list[str] = []
    secret_next = False
    for arg in args:
        flag, eq, _ = arg.partition("=")
        if secret_next:
            shown.append("***")
        elif eq and _SECRET_FLAG.match(flag):
            shown.append(f"{flag}=***")
        else:
            shown.append(_mask_url(arg))
        secret_next = not eq and bool(_SECRET_FLAG.match(arg))
    return shown


@dataclass(frozen=True, slots=True, repr=False)
class ServerSpec:
    """One downstream MCP server: how to start or reach it, and which of its tools are allowed.

    Exactly one of ``command`` (stdio) and ``url`` (Streamable HTTP) is set. ``env`` and
    ``headers`` hold credentials: the repr shows their keys only.

    Raises:
        ConfigError: neither or both of ``command`` and ``url`` are given.
    """

    alias: str
    name: str
    source: Path
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=_empty)
    cwd: Path | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=_empty)
    allow_tools: frozenset[str] | None = None
    deny_tools: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"server {self.name!r}: give exactly one of command and url")
        # Copies, so that a caller's dict changed later does not change the spec.
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    @property
    def target(self) -> str:
        """The command line or URL, for display: passwords, query values and secret flags masked."""
        if self.command is None:
            return _mask_url(self.url or "")
        return " ".join(_quote(word) for word in [self.command, *_mask_args(self.args)])

    def permits(self, tool: str) -> bool:
        """Whether sandboxed code may call ``tool`` (its name as the server lists it)."""
        if tool in self.deny_tools:
            return False
        return self.allow_tools is None or tool in self.allow_tools

    def __repr__(self) -> str:
        where = f"command={self.target!r}" if self.command is not None else f"url={self.target!r}"
        allow = None if self.allow_tools is None else sorted(self.allow_tools)
        return (
            f"ServerSpec(alias={self.alias!r}, name={self.name!r}, {where}, env_keys={sorted(self.env)!r}, "
            f"header_keys={sorted(self.headers)!r}, cwd={self.cwd!r}, allow_tools={allow!r}, "
            f"deny_tools={sorted(self.deny_tools)!r}, source={self.source!r})"
        )


def _quote(word: str) -> str:
    # Like shlex.quote, but leaves the common characters of paths, URLs and flags alone.
    if word and re.fullmatch(r"[\w@%+=:,./~*-]+", word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


@dataclass(frozen=True, slots=True)
class Problem:
    """A file or entry that was not loaded, and why (never with a secret value in ``reason``)."""

    source: Path
    reason: str
    server: str | None = None

    def __str__(self) -> str:
        return (
            f"{self.source}: {self.server}: {self.reason}"
            if self.server is not None
            else f"{self.source}: {self.reason}"
        )


@dataclass(frozen=True, slots=True)
class Discovery:
    """What :func:`discover` found.

    Attributes:
        servers: alias -> server, in discovery order.
        problems: malformed files and entries.
        skipped: entries deliberately not loaded (shadowed, disabled, mcp-sandbox itself).
        searched: every path looked at, in order, whether it exists or not.
    """

    servers: Mapping[str, ServerSpec] = field(default_factory=lambda: MappingProxyType({}))
    problems: tuple[Problem, ...] = ()
    skipped: tuple[Problem, ...] = ()
    searched: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", MappingProxyType(dict(self.servers)))

    def by_name(self, name_or_alias: str) -> ServerSpec | None:
        """The server with this alias or else with this name (as written in its file), if any."""
        spec = self.servers.get(name_or_alias)
        if spec is not None:
            return spec
        return next((spec for spec in self.servers.values() if spec.name == name_or_alias), None)


# --- reading files ----------------------------------------------------------------------------

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


@dataclass(frozen=True, slots=True)
class _Entry:
    """A server entry as found, not yet checked."""

    name: str
    body: object
    source: Path
    toml: bool


@dataclass(frozen=True, slots=True)
class _Policy:
    """A ``[servers.<name>]`` table that only restricts a server defined elsewhere."""

    source: Path
    allow: frozenset[str] | None
    deny: frozenset[str]
    disabled: bool


_GENERIC: tuple[tuple[str, ...], ...] = (("mcpServers",), ("servers",))
_MCP_SERVERS: tuple[tuple[str, ...], ...] = (("mcpServers",),)
_POLICY_KEYS = frozenset({"allow_tools", "deny_tools", "disabled"})


class _Scan:
    """Collects entries, policies, problems and searched paths, source by source."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.policies: dict[str, _Policy] = {}
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
        self.entries.extend(_Entry(str(name), body, path, toml=False) for name, body in section.items())
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
            self.json_file(path, _GENERIC, generic=True)

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
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            self._problem(path, f"invalid TOML: {exc}")
            return
        servers = data.get("servers")
        if servers is None:
            return
        if not isinstance(servers, dict):
            self._problem(path, "servers: not a table")
            return
        for name, body in servers.items():
            if isinstance(body, dict) and "command" not in body and "url" not in body and body.keys() <= _POLICY_KEYS:
                self._policy(path, name, body)
            else:
                self.entries.append(_Entry(name, body, path, toml=True))

    def _policy(self, path: Path, name: str, body: dict[str, Any]) -> None:
        if not body:
            self._problem(path, "needs a command or url (or allow_tools/deny_tools for a server found elsewhere)", name)
            return
        try:
            policy = _Policy(
                path,
                _names(body, "allow_tools"),
                _names(body, "deny_tools") or frozenset(),
                _flag(body, "disabled"),
            )
        except _Invalid as exc:
            self._problem(path, str(exc), name)
            return
        self.policies[name] = policy


# --- checking entries -------------------------------------------------------------------------


class _Invalid(Exception):
    """An entry is malformed (the message is the reason, without any value from the entry)."""


def _names(body: Mapping[str, Any], key: str) -> frozenset[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Invalid(f"{key}: must be a list of tool names")
    return frozenset(value)


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise _Invalid(f"{key}: must be true or false")
    return value


def _string(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise _Invalid(f"{key}: must be a string")
    return value


def _strings(body: Mapping[str, Any], key: str) -> list[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Invalid(f"{key}: must be a list of strings")
    return value


def _table(body: Mapping[str, Any], key: str) -> dict[str, str]:
    value = body.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
        raise _Invalid(f"{key}: must be an object of strings")
    return value


_TOML_KEYS = frozenset({"command", "args", "env", "cwd", "url", "headers"}) | _POLICY_KEYS
_HTTP_TYPES = frozenset({"http", "sse", "streamable-http", "streamableHttp"})
_VARIABLE = re.compile(r"\$\{([^{}]*)\}")
_NAMED = re.compile(r"(?:env:)?([A-Za-z_]\w*)(?::-(.*))?", re.DOTALL)


@dataclass(slots=True)
class _Expander:
    """Expands ``${...}`` from the environment, collecting what does not resolve."""

    env: Mapping[str, str]
    predefined: Mapping[str, str]
    unresolved: list[str] = field(default_factory=list)

    def __call__(self, text: str, where: str) -> str:
        return _VARIABLE.sub(lambda match: self._value(match, where), text)

    def _value(self, match: re.Match[str], where: str) -> str:
        inner = match.group(1)
        named = _NAMED.fullmatch(inner)
        if named is None:
            kind = "VS Code input" if inner.startswith("input:") else "unsupported variable"
            self.unresolved.append(f"{kind} {match.group()} (in {where})")
            return ""
        name, default = named.groups()
        value = self.env.get(name)
        if value is None:
            value = self.predefined.get(name)
        if default is not None and not value:
            value = default
        if value is None:
            self.unresolved.append(f"environment variable {name} is not set (in {where})")
            return ""
        return value


def _launches_us(command: str, args: tuple[str, ...]) -> bool:
    if PurePath(command).name == "mcp-sandbox":
        return True
    for index, arg in enumerate(args):
        # mcp-sandbox, mcp_sandbox, mcp-sandbox@latest, mcp-sandbox==0.1 (uvx, pipx), .../bin/mcp-sandbox
        if re.fullmatch(r"mcp[-_]sandbox(\[[^]]*\])?([@=<>~!].*)?", arg) or arg.endswith("/mcp-sandbox"):
            return True
        if arg == "-m" and index + 1 < len(args) and args[index + 1].startswith("mcp_sandbox."):
            return True
    return False


@dataclass(frozen=True, slots=True)
class _Skip:
    reason: str


def _check(entry: _Entry, expand: _Expander, home: Path) -> ServerSpec | _Skip:
    """The server an entry describes (alias still empty), or why it is skipped.

    Raises:
        _Invalid: the entry is malformed or a variable does not resolve.
    """
    body = entry.body
    if not isinstance(body, dict):
        raise _Invalid("not an object")
    if entry.toml:
        unknown = sorted(set(body) - _TOML_KEYS)
        if unknown:
            raise _Invalid(f"unknown key(s): {', '.join(unknown)}")
    if _flag(body, "disabled"):
        return _Skip("disabled")

    command = _string(body, "command")
    args = _strings(body, "args")
    env = _table(body, "env")
    cwd = _string(body, "cwd")
    headers = _table(body, "headers")
    url = _string(body, "url")
    if not entry.toml:
        server_url = _string(body, "serverUrl")  # Windsurf
        if url is not None and server_url is not None:
            raise _Invalid("give url or serverUrl, not both")
        url = url if url is not None else server_url
    allow_key, deny_key = ("allow_tools", "deny_tools") if entry.toml else ("allowTools", "denyTools")
    allow = _names(body, allow_key)
    deny = _names(body, deny_key) or frozenset()

    kind = None if entry.toml else _string(body, "type")
    if kind is not None and kind != "stdio" and kind not in _HTTP_TYPES:
        raise _Invalid("type: must be stdio, http, sse or streamable-http")
    if command is not None and url is not None:
        raise _Invalid("give command or url, not both")
    if command is None and url is None:
        raise _Invalid("needs a command (stdio) or a url (HTTP)")
    if kind == "stdio" and command is None:
        raise _Invalid("type stdio needs a command")
    if kind in _HTTP_TYPES and url is None:
        raise _Invalid(f"type {kind} needs a url")

    if command is not None:
        command = expand(command, "command")
        if not command:
            raise _Invalid("command: is empty")
    expanded_args = tuple(expand(arg, f"args[{index}]") for index, arg in enumerate(args))
    env = {key: expand(value, f"env.{key}") for key, value in env.items()}
    headers = {key: expand(value, f"headers.{key}") for key, value in headers.items()}
    cwd = None if cwd is None else expand(cwd, "cwd")
    if url is not None:
        url = expand(url, "url")
    if expand.unresolved:
        raise _Invalid("; ".join(expand.unresolved))
    if url is not None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise _Invalid("url: must be an http:// or https:// URL")
    if command is not None and _launches_us(command, expanded_args):
        return _Skip("starts mcp-sandbox itself")

    directory: Path | None = None
    if cwd is not None:
        if cwd == "~" or cwd.startswith("~/"):
            cwd = str(home / cwd[2:])
        directory = entry.source.parent / cwd
    return ServerSpec(
        alias="",
        name=entry.name,
        source=entry.source,
        command=command,
        args=expanded_args,
        env=env,
        cwd=directory,
        url=url,
        headers=headers,
        allow_tools=allow,
        deny_tools=deny,
    )


def _restrict(spec: ServerSpec, policy: _Policy) -> ServerSpec:
    """Apply a ``[servers.<name>]`` policy: allow lists intersect, deny lists add up."""
    allow = spec.allow_tools
    if policy.allow is not None:
        allow = policy.allow if allow is None else allow & policy.allow
    return dataclasses.replace(spec, allow_tools=allow, deny_tools=spec.deny_tools | policy.deny)


def _alias(name: str, taken: Mapping[str, object]) -> str:
    base = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    if not base:
        base = "server"
    elif base[0].isdigit():
        base = f"s_{base}"
    if keyword.iskeyword(base):
        base += "_"
    alias, number = base, 2
    while alias in taken:
        alias, number = f"{base}_{number}", number + 1
    return alias


# --- the sources, in order --------------------------------------------------------------------


def _scan(settings: Settings, home: Path, cwd: Path, env: Mapping[str, str], platform: str) -> _Scan:
    scan = _Scan()
    if settings.servers_config is not None:
        scan.json_file(cwd / settings.servers_config, _GENERIC, generic=True, required=True)
    if settings.config_file is not None:
        scan.toml_file(cwd / settings.config_file)
    if not settings.discover_servers:
        return scan

    xdg = env.get("XDG_CONFIG_HOME", "")
    config_home = Path(xdg) if os.path.isabs(xdg) else home / ".config"
    if platform == "darwin":
        claude_desktop = home / "Library" / "Application Support" / "Claude"
        vscode_user = home / "Library" / "Application Support" / "Code" / "User"
    else:
        claude_desktop = config_home / "Claude"
        vscode_user = config_home / "Code" / "User"

    scan.json_directory(home / "MCPs")
    scan.json_directory(config_home / "mcp" / "servers")
    scan.json_directory(cwd / "mcp-servers")
    scan.claude_code(home / ".claude.json", cwd / ".mcp.json", str(cwd))
    scan.json_file(claude_desktop / "claude_desktop_config.json")
    scan.json_file(cwd / ".cursor" / "mcp.json")
    scan.json_file(home / ".cursor" / "mcp.json")
    scan.json_file(cwd / ".vscode" / "mcp.json", (("servers",),))
    scan.json_file(vscode_user / "mcp.json", (("servers",),))
    scan.json_file(vscode_user / "settings.json", (("mcp", "servers"),))
    scan.json_file(home / ".codeium" / "windsurf" / "mcp_config.json")
    return scan


def discover(
    settings: Settings,
    *,
    home: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
) -> Discovery:
    """Find the downstream MCP servers configured for this user, in the order of the module docstring.

    Never raises for a missing, unreadable or malformed file or entry: those are in
    :attr:`Discovery.problems`, and everything else still loads.

    Args:
        settings: ``servers_config``, ``config_file`` and ``discover_servers`` are read.
        home: the home directory (``Path.home()``, which honours ``$HOME``).
        cwd: the current directory, for project-scoped files (``Path.cwd()``).
        env: variables for ``${VAR}`` (``os.environ``).
        platform: ``sys.platform``; ``"darwin"`` selects the macOS paths, anything else Linux's.
    """
    home = Path.home() if home is None else home
    cwd = Path.cwd() if cwd is None else cwd
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    scan = _scan(settings, home, cwd, env, platform)

    predefined = {"workspaceFolder": str(cwd), "userHome": str(home)}
    servers: dict[str, ServerSpec] = {}
    problems = scan.problems
    skipped: list[Problem] = []
    claimed: dict[str, Path] = {}  # name -> the file of its first entry, which wins whatever it holds
    for entry in scan.entries:
        if entry.name in claimed:
            skipped.append(Problem(entry.source, f"shadowed by the entry in {claimed[entry.name]}", entry.name))
            continue
        claimed[entry.name] = entry.source
        policy = scan.policies.get(entry.name)
        if policy is not None and policy.disabled:
            skipped.append(Problem(entry.source, f"disabled by [servers.{entry.name}] in {policy.source}", entry.name))
            continue
        try:
            checked = _check(entry, _Expander(env, predefined), home)
        except _Invalid as exc:
            problems.append(Problem(entry.source, str(exc), entry.name))
            continue
        if isinstance(checked, _Skip):
            skipped.append(Problem(entry.source, checked.reason, entry.name))
            continue
        if policy is not None:
            checked = _restrict(checked, policy)
        alias = _alias(entry.name, servers)
        servers[alias] = dataclasses.replace(checked, alias=alias)
    for name, policy in scan.policies.items():
        if name not in claimed:
            problems.append(Problem(policy.source, "a tool policy for a server that no source defines", name))
    return Discovery(servers, tuple(problems), tuple(skipped), tuple(scan.searched))
