"""Which downstream MCP servers exist: the explicit file, our ``[servers]``, the user's MCP clients.

The sources are read in a fixed order and the first entry of a server name wins; a later one is
shadowed and listed in :attr:`Discovery.skipped`. Malformed files and entries become problems
(:class:`Problem`) and never stop the others loading. Each server gets an alias, the identifier
sandboxed code knows it by. The user's specification (every source, entry formats, variable
expansion, policy-only tables, aliases) is docs/code-mode.md, "Discovery in detail".

This module holds the order of the sources and :func:`discover`; :mod:`.config_files` reads the
files, :mod:`.server_entries` checks each entry, and :mod:`.server_spec` holds :class:`ServerSpec`
and :class:`Problem` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from mcp_sandbox.bridge.config_files import Scan
from mcp_sandbox.bridge.server_entries import Expander, InvalidEntry, Skip, alias_for, check_entry, restrict
from mcp_sandbox.bridge.server_spec import Problem, ServerSpec
from mcp_sandbox.config import CodeModeSettings, ConfigFile

__all__ = ["Discovery", "Problem", "ServerSpec", "discover", "for_tenants"]


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


# --- the sources, in order --------------------------------------------------------------------


def _scan(
    code_mode: CodeModeSettings,
    config: ConfigFile | Path | None,
    home: Path,
    cwd: Path,
    env: Mapping[str, str],
    platform: str,
) -> Scan:
    scan = Scan()
    if code_mode.servers_config is not None:
        scan.generic_file(cwd / code_mode.servers_config, required=True)
    if isinstance(config, ConfigFile):  # the loader's parse of the file: never read twice
        scan.toml_read(cwd / config.path, config.servers)
    elif config is not None:
        scan.toml_file(cwd / config)
    if not code_mode.discover_servers:
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
    scan.json_file(cwd / "claude_code_config.json")
    scan.json_file(cwd / "claude_desktop_config.json")
    scan.json_file(cwd / ".cursor" / "mcp.json")
    scan.json_file(home / ".cursor" / "mcp.json")
    scan.json_file(cwd / ".vscode" / "mcp.json", (("servers",),))
    scan.json_file(vscode_user / "mcp.json", (("servers",),))
    scan.json_file(vscode_user / "settings.json", (("mcp", "servers"),))
    scan.json_file(home / ".codeium" / "windsurf" / "mcp_config.json")
    return scan


def discover(
    code_mode: CodeModeSettings,
    config: ConfigFile | Path | None = None,
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
        code_mode: its ``servers_config`` and ``discover_servers`` are read.
        config: the TOML file the settings came from, whose ``[servers]`` are read: as the loader
            parsed it (``Settings.config_read``), or read here when it is a path (SIGHUP's reload).
        home: the home directory (``Path.home()``, which honours ``$HOME``).
        cwd: the current directory, for project-scoped files (``Path.cwd()``).
        env: variables for ``${VAR}`` (``os.environ``).
        platform: ``sys.platform``; ``"darwin"`` selects the macOS paths, anything else Linux's.
    """
    home = Path.home() if home is None else home
    cwd = Path.cwd() if cwd is None else cwd
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    scan = _scan(code_mode, config, home, cwd, env, platform)

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
            checked = check_entry(entry, Expander(env, predefined), home)
        except InvalidEntry as exc:
            problems.append(Problem(entry.source, str(exc), entry.name))
            continue
        if isinstance(checked, Skip):
            skipped.append(Problem(entry.source, checked.reason, entry.name))
            continue
        if policy is not None:
            checked = restrict(checked, policy)
        alias = alias_for(entry.name, servers)
        servers[alias] = dataclasses.replace(checked, alias=alias)
    for name, policy in scan.policies.items():
        if name not in claimed:
            problems.append(Problem(policy.source, "a tool policy for a server that no source defines", name))
    return Discovery(servers, tuple(problems), tuple(skipped), tuple(scan.searched))


def for_tenants(discovery: Discovery, tenant_count: int) -> Discovery:
    """``discovery`` for a server of ``tenant_count`` tenants: every ``per_tenant`` decided
    (:meth:`ServerSpec.separate`), so the running server never reads an unsaid one as shared."""
    servers = {
        alias: dataclasses.replace(spec, per_tenant=spec.separate(tenant_count))
        for alias, spec in discovery.servers.items()
    }
    return dataclasses.replace(discovery, servers=servers)
