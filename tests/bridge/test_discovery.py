"""Discovery of downstream MCP servers: sources in order, every client's format, problems, aliases, the CLI."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.bridge.discovery import Discovery, Problem, ServerSpec, discover, for_tenants
from mcp_sandbox.bridge.listing import describe, describe_json
from mcp_sandbox.cli import main
from mcp_sandbox.config import CodeModeSettings, ConfigFile, Settings, load_settings
from mcp_sandbox.errors import ConfigError

SAMPLES = Path(__file__).parent / "samples"


def _source(settings: Settings) -> tuple[CodeModeSettings, ConfigFile | Path | None]:
    """What discovery reads of ``settings``: the code-mode piece and the config file, as the loader read it."""
    return settings.code_mode, settings.config_read or settings.config_file


class World:
    """A fake home and project directory under tmp_path, and the settings and env to discover in."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.home = tmp_path / "home" / "ada"
        self.cwd = tmp_path / "work" / "app"
        self.home.mkdir(parents=True)
        self.cwd.mkdir(parents=True)
        self.env: dict[str, str] = {}
        self.settings = Settings.of(state_dir=tmp_path / "state")

    def copy(self, sample: str, destination: Path) -> Path:
        """Copy a sample file, filling in this world's project directory where it says @CWD@."""
        text = (SAMPLES / sample).read_text(encoding="utf-8")
        text = text.replace("@CWD@", json.dumps(str(self.cwd))[1:-1])
        return self.write(destination, text)

    def write(self, destination: Path, text: str) -> Path:
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(text, encoding="utf-8")
        return destination

    def write_json(self, destination: Path, data: object) -> Path:
        return self.write(destination, json.dumps(data, indent=2))

    def servers_file(self, servers: Mapping[str, object], name: str = "servers.json") -> Path:
        """A generic file holding ``servers``, set as the explicit servers_config."""
        path = self.write_json(self.root / name, {"mcpServers": servers})
        self.configure(servers_config=path)
        return path

    def configure(self, **changes: Any) -> None:
        self.settings = self.settings.replace(**changes)

    def discover(self, platform: str = "linux") -> Discovery:
        return discover(*_source(self.settings), home=self.home, cwd=self.cwd, env=self.env, platform=platform)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def install_every_sample(world: World) -> None:
    world.copy("mcp-sandbox.toml", world.root / "mcp-sandbox.toml")
    world.configure(config_file=world.root / "mcp-sandbox.toml")
    world.copy("mcps_research.json", world.home / "MCPs" / "research.json")
    world.copy("claude.json", world.home / ".claude.json")
    world.copy("claude_code_project.mcp.json", world.cwd / ".mcp.json")
    world.copy("claude_desktop_config.json", world.home / ".config" / "Claude" / "claude_desktop_config.json")
    world.copy("cursor_mcp.json", world.home / ".cursor" / "mcp.json")
    world.copy("vscode_mcp.json", world.cwd / ".vscode" / "mcp.json")
    world.copy("vscode_settings.json", world.home / ".config" / "Code" / "User" / "settings.json")
    world.copy("windsurf_mcp_config.json", world.home / ".codeium" / "windsurf" / "mcp_config.json")
    world.env.update(
        HOME=str(world.home),
        INTERNAL_TOKEN="internal-SECRET",
        EXA_API_KEY="exa-SECRET",
        STRIPE_SECRET_KEY="sk_live_SECRET",
        FIGMA_TOKEN="figd_SECRET",
    )


# --- every client's format, all at once ---------------------------------------------------------


def test_every_clients_real_config_loads_in_the_documented_order(world: World) -> None:
    install_every_sample(world)

    found = world.discover()

    assert list(found.servers) == [
        "git",  # our TOML
        "internal_api",
        "arxiv",  # ~/MCPs
        "exa",
        "playwright",  # ~/.claude.json, this project
        "sentry",  # ./.mcp.json
        "dbhub",
        "notion",  # ~/.claude.json, user scope
        "memory",
        "filesystem",  # Claude Desktop
        "github",
        "linear",  # Cursor
        "stripe",
        "fetch",  # ./.vscode/mcp.json
        "workspace_files",
        "context7",  # VS Code settings.json
        "time",
        "brave_search",  # Windsurf
        "figma",
    ]
    assert [(p.source.name, p.server) for p in found.problems] == [("mcp.json", "perplexity")]
    assert {(p.server, p.reason) for p in found.skipped} == {
        ("sandbox", "starts mcp-sandbox itself"),
        ("github", f"shadowed by the entry in {world.home / '.config/Claude/claude_desktop_config.json'}"),
        ("puppeteer", "disabled"),
    }


def test_claude_desktop_stdio_servers_keep_command_args_and_env(world: World) -> None:
    install_every_sample(world)

    github = world.discover().servers["github"]

    assert github.transport == "stdio"
    assert github.command == "docker"
    assert github.args == (
        "run",
        "-i",
        "--rm",
        "-e",
        "GITHUB_PERSONAL_ACCESS_TOKEN",
        "ghcr.io/github/github-mcp-server",
    )
    assert dict(github.env) == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_desktopSECRET0123456789"}
    assert github.url is None
    assert github.source == world.home / ".config" / "Claude" / "claude_desktop_config.json"


def test_claude_code_reads_only_this_projects_local_servers(world: World) -> None:
    install_every_sample(world)

    found = world.discover()

    assert found.servers["playwright"].args == ("@playwright/mcp@latest",)
    assert found.by_name("another-project-only") is None


def test_claude_code_http_servers_have_a_url_and_no_command(world: World) -> None:
    install_every_sample(world)

    notion = world.discover().servers["notion"]

    assert notion.transport == "http"
    assert notion.url == "https://mcp.notion.com/mcp"
    assert notion.command is None


def test_variables_expand_from_the_environment_including_defaults_and_cursors_env_prefix(world: World) -> None:
    install_every_sample(world)

    found = world.discover()

    assert found.servers["memory"].env["MEMORY_FILE_PATH"] == f"{world.home}/.local/share/claude-memory.json"
    assert found.servers["dbhub"].args[-1] == "postgres://dev:dev@localhost:5432/app"  # DATABASE_URL unset
    assert found.servers["stripe"].args[-1] == "--api-key=sk_live_SECRET"
    assert found.servers["exa"].url == "https://mcp.exa.ai/mcp?exaApiKey=exa-SECRET"
    assert found.servers["workspace_files"].args[-1] == str(world.cwd)


def test_windsurf_server_url_and_headers_make_an_http_server(world: World) -> None:
    install_every_sample(world)

    figma = world.discover().servers["figma"]

    assert figma.transport == "http"
    assert figma.url == "https://mcp.figma.com/mcp"
    assert dict(figma.headers) == {"Authorization": "Bearer figd_SECRET"}


def test_vscode_settings_with_comments_trailing_commas_and_urls_parse(world: World) -> None:
    install_every_sample(world)

    found = world.discover()

    assert found.servers["context7"].url == "https://mcp.context7.com/mcp"
    assert found.servers["time"].args == ("mcp-server-time", "--local-timezone=Europe/Berlin")


def test_vscode_input_variables_make_the_entry_a_problem_that_names_the_input(world: World) -> None:
    install_every_sample(world)

    (problem,) = world.discover().problems

    assert problem.server == "perplexity"
    assert "${input:perplexity-key}" in problem.reason


def test_a_relative_cwd_is_resolved_against_the_files_directory(world: World) -> None:
    install_every_sample(world)

    found = world.discover()

    assert found.servers["arxiv"].cwd == world.home / "MCPs" / ".." / "research"
    assert found.servers["git"].cwd == Path("/srv/repos/app")


def test_a_toml_table_with_only_tool_lists_restricts_the_server_of_that_name_elsewhere(world: World) -> None:
    install_every_sample(world)

    github = world.discover().servers["github"]

    assert github.allow_tools == frozenset({"get_issue", "list_issues", "search_code", "delete_repository"})
    assert github.permits("get_issue")
    assert not github.permits("delete_repository")  # denied, though allowed
    assert not github.permits("create_issue")  # not allowed


def test_load_settings_leaves_the_servers_table_to_discovery(world: World) -> None:
    toml = world.copy("mcp-sandbox.toml", world.root / "mcp-sandbox.toml")
    settings = load_settings({"state_dir": str(world.root / "state")}, env={}, config_file=toml)

    found = discover(*_source(settings), home=world.home, cwd=world.cwd, env={"INTERNAL_TOKEN": "t"}, platform="linux")

    assert settings.limits.timeout == 45
    assert list(found.servers) == ["git", "internal_api"]


def test_discovery_takes_the_servers_the_loader_read_and_reads_the_file_again_only_when_asked(world: World) -> None:
    toml = world.copy("mcp-sandbox.toml", world.root / "mcp-sandbox.toml")
    settings = load_settings({"state_dir": str(world.root / "state")}, env={}, config_file=toml)
    toml.write_text('[servers.later]\ncommand = "later"\n')  # changed after the start
    env = {"INTERNAL_TOKEN": "t"}

    found = discover(*_source(settings), home=world.home, cwd=world.cwd, env=env, platform="linux")
    reread = discover(
        settings.code_mode, settings.config_file, home=world.home, cwd=world.cwd, env=env, platform="linux"
    )

    assert list(found.servers) == ["git", "internal_api"] and toml in found.searched  # as loaded: not read again
    assert list(reread.servers) == ["later"]  # SIGHUP's reload reads the file anew


def test_macos_reads_claude_desktop_and_vscode_from_application_support(world: World) -> None:
    support = world.home / "Library" / "Application Support"
    world.copy("claude_desktop_config.json", support / "Claude" / "claude_desktop_config.json")
    world.copy("vscode_settings.json", support / "Code" / "User" / "settings.json")

    assert list(world.discover(platform="darwin").servers) == ["filesystem", "github", "context7", "time"]
    assert list(world.discover(platform="linux").servers) == []


# --- precedence -------------------------------------------------------------------------------


def _json_source(where: Callable[[World], Path], *keys: str) -> Callable[[World, dict[str, Any]], Path]:
    def add(world: World, entry: dict[str, Any]) -> Path:
        path = where(world)
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        section = data
        for key in keys:
            section = section.setdefault(str(world.cwd) if key == "@CWD@" else key, {})
        section["shared"] = entry
        return world.write_json(path, data)

    return add


def _explicit_source(world: World, entry: dict[str, Any]) -> Path:
    return world.servers_file({"shared": entry})


def _toml_source(world: World, entry: dict[str, Any]) -> Path:
    args = ", ".join(json.dumps(arg) for arg in entry["args"])
    path = world.write(world.root / "mcp-sandbox.toml", f'[servers.shared]\ncommand = "server"\nargs = [{args}]\n')
    world.configure(config_file=path)
    return path


# Every source, in the documented order.
SOURCES: list[tuple[str, Callable[[World, dict[str, Any]], Path]]] = [
    ("servers_config", _explicit_source),
    ("toml", _toml_source),
    ("~/MCPs", _json_source(lambda w: w.home / "MCPs" / "a.json", "mcpServers")),
    ("~/.config/mcp/servers", _json_source(lambda w: w.home / ".config/mcp/servers/a.json", "servers")),
    ("./mcp-servers", _json_source(lambda w: w.cwd / "mcp-servers" / "a.json", "mcpServers")),
    (
        "claude code local",
        _json_source(lambda w: w.home / ".claude.json", "projects", "@CWD@", "mcpServers"),
    ),
    ("claude code project", _json_source(lambda w: w.cwd / ".mcp.json", "mcpServers")),
    ("claude code user", _json_source(lambda w: w.home / ".claude.json", "mcpServers")),
    ("claude desktop", _json_source(lambda w: w.home / ".config/Claude/claude_desktop_config.json", "mcpServers")),
    ("./claude_code_config.json", _json_source(lambda w: w.cwd / "claude_code_config.json", "mcpServers")),
    ("./claude_desktop_config.json", _json_source(lambda w: w.cwd / "claude_desktop_config.json", "mcpServers")),
    ("cursor project", _json_source(lambda w: w.cwd / ".cursor/mcp.json", "mcpServers")),
    ("cursor user", _json_source(lambda w: w.home / ".cursor/mcp.json", "mcpServers")),
    ("vscode workspace", _json_source(lambda w: w.cwd / ".vscode/mcp.json", "servers")),
    ("vscode user mcp.json", _json_source(lambda w: w.home / ".config/Code/User/mcp.json", "servers")),
    ("vscode settings", _json_source(lambda w: w.home / ".config/Code/User/settings.json", "mcp", "servers")),
    ("windsurf", _json_source(lambda w: w.home / ".codeium/windsurf/mcp_config.json", "mcpServers")),
]


def _place(world: World, sources: list[tuple[str, Callable[[World, dict[str, Any]], Path]]]) -> list[Path]:
    return [add(world, {"command": "server", "args": [label]}) for label, add in sources]


@pytest.mark.parametrize("first", range(len(SOURCES)), ids=[label for label, _ in SOURCES])
def test_the_first_source_defining_a_name_wins_and_every_later_one_is_shadowed(world: World, first: int) -> None:
    paths = _place(world, SOURCES[first:])

    found = world.discover()

    assert list(found.servers) == ["shared"]
    assert found.servers["shared"].args == (SOURCES[first][0],)
    assert found.servers["shared"].source == paths[0]
    assert [skip.source for skip in found.skipped] == paths[1:]
    assert all(skip.reason == f"shadowed by the entry in {paths[0]}" for skip in found.skipped)
    assert found.problems == ()


def test_every_candidate_path_is_searched_in_the_documented_order_whether_it_exists_or_not(world: World) -> None:
    world.servers_file({})
    world.configure(config_file=world.root / "absent.toml")
    (world.home / "MCPs").mkdir()
    world.write_json(world.home / "MCPs" / "b.json", {"servers": {}})
    world.write_json(world.home / "MCPs" / "a.json", {"servers": {}})
    world.write(world.home / "MCPs" / ".#a.json", "an editor's lock file")
    world.write(world.home / "MCPs" / "notes.txt", "not JSON")
    home, cwd, config = world.home, world.cwd, world.home / ".config"

    found = world.discover()

    assert found.searched == (
        world.root / "servers.json",
        world.root / "absent.toml",
        home / "MCPs",
        home / "MCPs" / "a.json",
        home / "MCPs" / "b.json",
        config / "mcp" / "servers",
        cwd / "mcp-servers",
        home / ".claude.json",
        cwd / ".mcp.json",
        config / "Claude" / "claude_desktop_config.json",
        cwd / "claude_code_config.json",
        cwd / "claude_desktop_config.json",
        cwd / ".cursor" / "mcp.json",
        home / ".cursor" / "mcp.json",
        cwd / ".vscode" / "mcp.json",
        config / "Code" / "User" / "mcp.json",
        config / "Code" / "User" / "settings.json",
        home / ".codeium" / "windsurf" / "mcp_config.json",
    )
    assert found.problems == ()


def test_with_discover_servers_off_only_the_explicit_file_and_our_toml_are_read(world: World) -> None:
    install_every_sample(world)
    explicit = world.servers_file({"explicit": {"command": "server"}})
    world.configure(discover_servers=False)

    found = world.discover()

    assert list(found.servers) == ["explicit", "git", "internal_api"]
    assert found.searched == (explicit, world.root / "mcp-sandbox.toml")
    # The github policy matches nothing now, and says so.
    assert [(p.server, p.source.name) for p in found.problems] == [("github", "mcp-sandbox.toml")]


def test_a_file_two_sources_name_is_read_once(world: World) -> None:
    world.cwd = world.home  # ./.cursor/mcp.json is ~/.cursor/mcp.json
    world.copy("cursor_mcp.json", world.home / ".cursor" / "mcp.json")
    world.env["STRIPE_SECRET_KEY"] = "sk"

    found = world.discover()

    assert list(found.servers) == ["linear", "stripe"]
    assert found.skipped == ()


# --- problems ---------------------------------------------------------------------------------


def test_a_missing_explicit_servers_config_is_a_problem(world: World) -> None:
    world.configure(servers_config=world.root / "nowhere.json")

    found = world.discover()

    assert found.problems == (Problem(world.root / "nowhere.json", "the file does not exist"),)


def test_malformed_json_is_reported_with_its_line_and_column_and_other_files_still_load(world: World) -> None:
    broken = world.write(world.home / "MCPs" / "a-broken.json", '{\n  "mcpServers": {\n    "x": {"command": "x"}\n')
    world.copy("mcps_research.json", world.home / "MCPs" / "b.json")
    world.env["EXA_API_KEY"] = "k"

    found = world.discover()

    assert list(found.servers) == ["arxiv", "exa"]
    (problem,) = found.problems
    assert problem.source == broken
    assert problem.server is None
    assert problem.reason.startswith("invalid JSON at line 4, column 1:")


def test_line_numbers_of_jsonc_errors_count_the_comments(world: World) -> None:
    settings = world.home / ".config" / "Code" / "User" / "settings.json"
    world.write(settings, '{\n  /* one\n     two */\n  // three\n  "mcp": {"servers": {}}}\n  "x": 1\n}\n')

    (problem,) = world.discover().problems

    assert problem.source == settings
    assert problem.reason.startswith("invalid JSON at line 6, column 3:")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param("[]", "the top level is not a JSON object", id="a list"),
        pytest.param('{"mcpServers": []}', "mcpServers: not an object", id="servers not an object"),
        pytest.param('{"other": {}}', 'no "mcpServers" or "servers" object', id="no servers"),
        pytest.param("\xff", "cannot read: not UTF-8 text", id="not utf-8"),
    ],
)
def test_a_generic_file_without_a_server_object_is_a_problem(world: World, content: str, reason: str) -> None:
    path = world.home / "MCPs" / "a.json"
    path.parent.mkdir()
    path.write_bytes(content.encode("latin-1"))

    assert world.discover().problems == (Problem(path, reason),)


def test_an_unreadable_file_is_a_problem(world: World) -> None:
    (world.home / ".codeium" / "windsurf" / "mcp_config.json").mkdir(parents=True)

    (problem,) = world.discover().problems

    assert problem.source == world.home / ".codeium" / "windsurf" / "mcp_config.json"
    assert problem.reason.startswith("cannot read:")


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        pytest.param("npx", "not an object", id="not an object"),
        pytest.param({"command": "npx", "args": "-y server"}, "args: must be a list of strings", id="args a string"),
        pytest.param({"command": "npx", "args": ["-y", 3]}, "args: must be a list of strings", id="args not strings"),
        pytest.param({"command": "npx", "env": {"PORT": 80}}, "env: must be an object of strings", id="env values"),
        pytest.param({"command": "npx", "env": ["A=1"]}, "env: must be an object of strings", id="env a list"),
        pytest.param({"url": "https://x.example", "headers": "A: b"}, "headers: must be an object of strings"),
        pytest.param({"args": ["x"]}, "needs a command (stdio) or a url (HTTP)", id="neither"),
        pytest.param({"command": "npx", "url": "https://x.example"}, "give command or url, not both", id="both"),
        pytest.param({"type": "stdio", "url": "https://x.example"}, "type stdio needs a command", id="stdio url"),
        pytest.param({"type": "sse", "command": "npx"}, "type sse needs a url", id="sse command"),
        pytest.param({"type": "websocket", "url": "wss://x"}, "type: must be stdio, http, sse or streamable-http"),
        pytest.param({"url": "file:///etc/passwd"}, "url: must be an http:// or https:// URL", id="file url"),
        pytest.param({"command": ""}, "command: is empty", id="empty command"),
        pytest.param({"command": "npx", "disabled": "yes"}, "disabled: must be true or false", id="disabled"),
        pytest.param({"command": "npx", "allowTools": "read"}, "allowTools: must be a list of tool names"),
    ],
)
def test_a_malformed_entry_is_a_problem_and_the_rest_of_its_file_loads(
    world: World, entry: object, reason: str
) -> None:
    path = world.servers_file({"before": {"command": "a"}, "bad": entry, "after": {"url": "https://b.example/mcp"}})

    found = world.discover()

    assert list(found.servers) == ["before", "after"]
    assert found.problems == (Problem(path, reason, "bad"),)


def test_an_unknown_key_in_a_toml_server_table_is_a_problem(world: World) -> None:
    toml = world.write(
        world.root / "c.toml", '[servers.a]\ncommand = "a"\nallowTools = ["x"]\n[servers.b]\nurl = "http://b"\n'
    )
    world.configure(config_file=toml)

    found = world.discover()

    assert list(found.servers) == ["b"]
    assert found.problems == (Problem(toml, "unknown key(s): allowTools", "a"),)


def test_an_unresolvable_variable_names_the_variable_and_never_prints_a_value(world: World) -> None:
    world.env = {"SET_TOKEN": "s3cret-value"}
    path = world.servers_file(
        {
            "api": {
                "url": "https://api.example/mcp",
                "headers": {"Authorization": "Bearer ${MISSING_TOKEN}", "X-Other": "${SET_TOKEN}"},
            },
            "ok": {"command": "ok", "env": {"TOKEN": "${SET_TOKEN}"}},
        }
    )

    found = world.discover()

    assert list(found.servers) == ["ok"]
    (problem,) = found.problems
    assert (problem.source, problem.server) == (path, "api")
    assert "MISSING_TOKEN" in problem.reason
    assert "headers.Authorization" in problem.reason
    assert "s3cret-value" not in problem.reason


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("${A}", "alpha"),
        ("${env:A}/x", "alpha/x"),
        ("${A:-default}", "alpha"),
        ("${UNSET:-default}", "default"),
        ("${EMPTY:-default}", "default"),
        ("${EMPTY}", ""),
        ("${UNSET:-}", ""),
        ("$A and $$ stay", "$A and $$ stay"),
        ("${A}${A}", "alphaalpha"),
    ],
)
def test_variables_expand_in_every_field_that_may_hold_one(world: World, text: str, expanded: str) -> None:
    world.env = {"A": "alpha", "EMPTY": ""}
    world.servers_file(
        {
            "stdio": {"command": f"/bin/{text}", "args": [text], "env": {"K": text}, "cwd": f"/srv/{text}"},
            "http": {"url": f"https://h.example/{text}", "headers": {"K": text}},
        }
    )

    found = world.discover()

    stdio, http = found.servers["stdio"], found.servers["http"]
    assert (stdio.command, stdio.args, dict(stdio.env), stdio.cwd) == (
        f"/bin/{expanded}",
        (expanded,),
        {"K": expanded},
        Path(f"/srv/{expanded}"),
    )
    assert (http.url, dict(http.headers)) == (f"https://h.example/{expanded}", {"K": expanded})


def test_a_variable_in_a_value_is_not_expanded_again(world: World) -> None:
    world.env = {"A": "${B}", "B": "bee"}
    world.servers_file({"s": {"command": "s", "args": ["${A}"]}})

    assert world.discover().servers["s"].args == ("${B}",)


# --- skipped ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param({"command": "/home/ada/src/mcp-sandbox/.venv/bin/mcp-sandbox", "args": ["serve"]}, id="venv bin"),
        pytest.param({"command": "uvx", "args": ["mcp-sandbox", "serve"]}, id="uvx"),
        pytest.param({"command": "python3", "args": ["-m", "mcp_sandbox", "serve"]}, id="python -m"),
        pytest.param({"command": "uvx", "args": ["mcp-sandbox@latest", "serve"]}, id="uvx at version"),
        pytest.param({"command": "python", "args": ["-m", "mcp_sandbox.cli", "serve"]}, id="python -m cli"),
        pytest.param({"command": "${HOME}/bin/mcp-sandbox"}, id="after expansion"),
        pytest.param({"command": "uv", "args": ["run", "--directory", "/src/mcp-sandbox", "serve"]}, id="uv run dir"),
    ],
)
def test_an_entry_that_starts_mcp_sandbox_itself_is_skipped(world: World, entry: dict[str, Any]) -> None:
    world.env = {"HOME": str(world.home)}
    path = world.servers_file({"sandbox": entry, "other": {"command": "other"}})

    found = world.discover()

    assert list(found.servers) == ["other"]
    assert found.skipped == (Problem(path, "starts mcp-sandbox itself", "sandbox"),)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param({"command": "uvx", "args": ["mcp-sandbox-lite"]}, id="a longer name"),
        pytest.param({"command": "npx", "args": ["-y", "@acme/mcp-sandbox-tools"]}, id="an npm package"),
        pytest.param({"command": "mcp-sandboxed"}, id="a command with the prefix"),
    ],
)
def test_a_server_that_only_resembles_mcp_sandbox_loads(world: World, entry: dict[str, Any]) -> None:
    world.servers_file({"lookalike": entry})

    assert list(world.discover().servers) == ["lookalike"]


def test_disabled_entries_are_skipped_and_enabled_ones_load(world: World) -> None:
    path = world.servers_file({"off": {"command": "off", "disabled": True}, "on": {"command": "on", "disabled": False}})
    toml = world.write(world.root / "c.toml", '[servers.toml-off]\ncommand = "x"\ndisabled = true\n')
    world.configure(config_file=toml)

    found = world.discover()

    assert list(found.servers) == ["on"]
    assert found.skipped == (Problem(path, "disabled", "off"), Problem(toml, "disabled", "toml-off"))


def test_a_disabled_entry_still_shadows_a_later_entry_of_its_name(world: World) -> None:
    path = world.servers_file({"github": {"command": "gh", "disabled": True}})
    world.copy("claude_desktop_config.json", world.home / ".config" / "Claude" / "claude_desktop_config.json")

    found = world.discover()

    assert found.by_name("github") is None
    assert found.skipped[0] == Problem(path, "disabled", "github")
    assert found.skipped[1].reason == f"shadowed by the entry in {path}"


def test_a_toml_policy_can_disable_a_server_found_elsewhere(world: World) -> None:
    toml = world.write(world.root / "c.toml", "[servers.github]\ndisabled = true\n")
    world.configure(config_file=toml)
    desktop = world.copy("claude_desktop_config.json", world.home / ".config/Claude/claude_desktop_config.json")

    found = world.discover()

    assert list(found.servers) == ["filesystem"]
    assert Problem(desktop, f"disabled by [servers.github] in {toml}", "github") in found.skipped


# --- policy -----------------------------------------------------------------------------------


def test_a_toml_policy_applies_to_the_explicit_file_too_and_allow_lists_intersect(world: World) -> None:
    toml = world.write(world.root / "c.toml", '[servers.s]\nallow_tools = ["a", "b"]\ndeny_tools = ["c"]\n')
    world.configure(config_file=toml)
    world.servers_file({"s": {"command": "s", "allowTools": ["b", "c", "d"], "denyTools": ["d"]}})

    spec = world.discover().servers["s"]

    assert (spec.allow_tools, spec.deny_tools) == (frozenset("b"), frozenset("cd"))
    assert [tool for tool in "abcde" if spec.permits(tool)] == ["b"]


def test_a_toml_policy_limits_a_server_to_some_tenants_and_gives_each_its_own_instance(world: World) -> None:
    toml = world.write(world.root / "c.toml", '[servers.s]\ntenants = ["alice", "bob"]\nper_tenant = true\n')
    world.configure(config_file=toml)
    # A client config cannot open a server to tenants: only our TOML says who shares what.
    world.servers_file({"s": {"command": "s", "args": ["--db", "/srv/{tenant}.db"], "tenants": ["mallory"]}})

    spec = world.discover().servers["s"]

    assert (spec.tenants, spec.per_tenant) == (frozenset({"alice", "bob"}), True)
    assert [tenant for tenant in ("alice", "bob", "mallory") if spec.serves(tenant)] == ["alice", "bob"]
    assert spec.instance_for("alice").args == ("--db", "/srv/alice.db")


def test_with_several_tenants_an_entry_that_says_nothing_is_per_tenant_and_sharing_is_said(world: World) -> None:
    toml = world.write(
        world.root / "c.toml",
        '[servers.common]\nper_tenant = false\n[servers.named]\ntenants = ["alice", "bob"]\n',
    )
    world.configure(config_file=toml)
    world.servers_file({name: {"command": name} for name in ("plain", "common", "named")})

    found = world.discover()
    one, several = for_tenants(found, 1).servers, for_tenants(found, 2).servers

    assert found.servers["plain"].per_tenant is None  # unsaid until the number of tenants is known
    assert {alias: spec.per_tenant for alias, spec in several.items()} == {
        "plain": True,
        "common": False,
        "named": False,
    }
    assert not any(spec.per_tenant for spec in one.values())  # one tenant: one process, as before


def test_a_toml_policy_with_tenants_that_are_not_a_list_is_a_problem(world: World) -> None:
    toml = world.write(world.root / "c.toml", '[servers.s]\ntenants = "alice"\n')
    world.configure(config_file=toml)
    world.servers_file({"s": {"command": "s"}})

    found = world.discover()

    assert any("tenants: must be a list of tenant names" in problem.reason for problem in found.problems)


def test_a_toml_policy_for_a_name_no_source_defines_is_a_problem(world: World) -> None:
    toml = world.write(world.root / "c.toml", '[servers.gihtub]\ndeny_tools = ["x"]\n')
    world.configure(config_file=toml)

    found = world.discover()

    assert found.problems == (Problem(toml, "a tool policy for a server that no source defines", "gihtub"),)


def test_an_empty_toml_server_table_is_a_problem(world: World) -> None:
    toml = world.write(world.root / "c.toml", "[servers.empty]\n")
    world.configure(config_file=toml)

    (problem,) = world.discover().problems

    assert (problem.source, problem.server) == (toml, "empty")


def test_permits_every_tool_without_lists_and_deny_wins_over_allow() -> None:
    everything = ServerSpec(alias="a", name="a", source=Path("/f.json"), command="a")
    some = ServerSpec(
        alias="a",
        name="a",
        source=Path("/f.json"),
        command="a",
        allow_tools=frozenset({"x", "y"}),
        deny_tools=frozenset({"y"}),
    )

    assert everything.permits("anything")
    assert some.permits("x")
    assert not some.permits("y")
    assert not some.permits("z")


def test_a_server_spec_needs_exactly_one_of_command_and_url() -> None:
    with pytest.raises(ConfigError):
        ServerSpec(alias="a", name="a", source=Path("/f.json"))
    with pytest.raises(ConfigError):
        ServerSpec(alias="a", name="a", source=Path("/f.json"), command="a", url="https://a.example")


def test_a_server_spec_copies_the_mappings_it_is_given() -> None:
    env = {"A": "1"}
    spec = ServerSpec(alias="a", name="a", source=Path("/f.json"), command="a", env=env)
    env["A"] = "2"

    assert spec.env == {"A": "1"}


# --- aliases ----------------------------------------------------------------------------------


def test_names_become_unique_python_identifiers_in_discovery_order(world: World) -> None:
    names = [
        "GitHub",
        "brave-search",
        "my server (prod)",
        "2fa",
        "class",
        "---",
        "__init__",
        "a-b",
        "a_b",
        "A B",
        "Café",
    ]
    world.servers_file({name: {"command": "x"} for name in names})

    found = world.discover()

    assert {alias: spec.name for alias, spec in found.servers.items()} == {
        "github": "GitHub",
        "brave_search": "brave-search",
        "my_server_prod": "my server (prod)",
        "s_2fa": "2fa",
        "class_": "class",
        "server": "---",
        "init": "__init__",
        "a_b": "a-b",
        "a_b_2": "a_b",
        "a_b_3": "A B",
        "caf": "Café",
    }
    assert all(alias.isidentifier() for alias in found.servers)


def test_a_collision_suffix_never_takes_an_alias_already_given(world: World) -> None:
    world.servers_file({"a_b_2": {"command": "x"}, "a-b": {"command": "x"}, "a_b": {"command": "x"}})

    assert list(world.discover().servers) == ["a_b_2", "a_b", "a_b_3"]


def test_by_name_finds_a_server_by_alias_or_by_its_written_name(world: World) -> None:
    world.servers_file({"Brave Search": {"command": "x"}})

    found = world.discover()

    assert found.by_name("brave_search") is found.by_name("Brave Search") is found.servers["brave_search"]
    assert found.by_name("brave-search") is None


# --- what is shown ----------------------------------------------------------------------------


def test_the_repr_of_a_server_shows_env_and_header_keys_but_no_secret(world: World) -> None:
    install_every_sample(world)
    found = world.discover()

    shown = repr(found)

    for secret in (
        "ghp_desktopSECRET",
        "BSA_windsurfSECRET",
        "figd_SECRET",
        "internal-SECRET",
        "exa-SECRET",
        "sk_live",
    ):
        assert secret not in shown
    assert "GITHUB_PERSONAL_ACCESS_TOKEN" in repr(found.servers["github"])
    assert "'Authorization'" in repr(found.servers["figma"])


def test_the_target_masks_url_passwords_query_values_and_secret_flags() -> None:
    spec = ServerSpec(
        alias="db",
        name="db",
        source=Path("/f.json"),
        command="npx",
        args=("--dsn", "postgres://app:hunter2@db:5432/app", "--token", "t0k", "--api-key=k3y", "--verbose"),
    )
    http = ServerSpec(alias="h", name="h", source=Path("/f.json"), url="https://u:pw@h.example/mcp?key=abc&x=1")

    assert spec.target == "npx --dsn postgres://app:***@db:5432/app --token *** --api-key=*** --verbose"
    assert http.target == "https://u:***@h.example/mcp?key=***&x=***"


def test_describe_lists_servers_problems_and_skipped_entries_without_secrets(world: World) -> None:
    install_every_sample(world)
    found = world.discover()

    text = describe(found, {"github": 42})

    lines = text.splitlines()
    assert lines[0].split() == ["ALIAS", "NAME", "TRANSPORT", "TOOLS", "COMMAND", "/", "URL", "SOURCE"]
    github = next(line for line in lines if line.startswith("github "))
    assert github.split()[:5] == ["github", "github", "stdio", "42", "docker"]
    assert github.endswith(str(world.home / ".config/Claude/claude_desktop_config.json"))
    notion = next(line for line in lines if line.startswith("notion "))
    assert notion.split()[2:5] == ["http", "-", "https://mcp.notion.com/mcp"]
    assert "Problems:" in lines and "Skipped:" in lines
    assert any("perplexity" in line and "${input:perplexity-key}" in line for line in lines)
    assert "SECRET" not in text and "sk_live" not in text


def test_describe_lists_the_paths_searched_when_nothing_is_found(world: World) -> None:
    found = world.discover()

    text = describe(found)

    assert text.splitlines()[0] == "No downstream MCP servers found. Searched:"
    assert f"  {world.home / '.claude.json'}" in text.splitlines()


def test_describe_json_carries_the_same_facts(world: World) -> None:
    install_every_sample(world)
    found = world.discover()

    document = json.loads(describe_json(found, {"github": 3}))

    assert [server["alias"] for server in document["servers"]] == list(found.servers)
    github = next(server for server in document["servers"] if server["alias"] == "github")
    assert github["tools"] == 3
    assert github["env_keys"] == ["GITHUB_PERSONAL_ACCESS_TOKEN"]
    assert github["allow_tools"] == ["delete_repository", "get_issue", "list_issues", "search_code"]
    assert len(document["problems"]) == len(found.problems)
    assert len(document["skipped"]) == len(found.skipped)
    assert document["searched"] == [str(path) for path in found.searched]
    assert "SECRET" not in json.dumps(document)


# --- the command ------------------------------------------------------------------------------


@pytest.fixture
def isolated(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """The process environment of ``main``: HOME and cwd in the world, no stray settings."""
    for name in list(os.environ):
        if name.startswith(("MCP_SANDBOX_", "MCP_BRIDGE_", "MCP_SERVERS_", "XDG_")):
            monkeypatch.delenv(name)
    for name in ("FIGMA_TOKEN", "STRIPE_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(world.home))
    monkeypatch.chdir(world.cwd)
    return world


def test_the_servers_command_prints_each_server_and_the_problems_and_exits_zero(
    isolated: World, capsys: pytest.CaptureFixture[str]
) -> None:
    explicit = isolated.copy("windsurf_mcp_config.json", isolated.root / "servers.json")
    isolated.copy("cursor_mcp.json", isolated.home / ".cursor" / "mcp.json")

    # --no-start: these sample servers are not installed (starting them would reach for npm).
    code = main(
        ["servers", "--no-start", "--servers-config", str(explicit), "--state-dir", str(isolated.root / "state")]
    )

    out = capsys.readouterr().out
    assert code == 0
    assert "brave_search" in out and "@modelcontextprotocol/server-brave-search" in out
    assert "linear" in out and "https://mcp.linear.app/sse" in out
    # FIGMA_TOKEN and STRIPE_SECRET_KEY are not set: problems, printed with the file
    assert f"{explicit}: figma: environment variable FIGMA_TOKEN is not set" in out
    assert f"{isolated.home / '.cursor' / 'mcp.json'}: stripe:" in out
    assert f"{explicit}: puppeteer: disabled" in out
    assert "BSA_windsurfSECRET42" not in out


def test_the_servers_command_prints_json(isolated: World, capsys: pytest.CaptureFixture[str]) -> None:
    explicit = isolated.copy("claude_desktop_config.json", isolated.root / "servers.json")

    code = main(
        [
            "servers",
            "--json",
            "--no-start",
            "--servers-config",
            str(explicit),
            "--state-dir",
            str(isolated.root / "state"),
        ]
    )

    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(s["alias"], s["transport"], s["tools"]) for s in document["servers"]] == [
        ("filesystem", "stdio", None),
        ("github", "stdio", None),
    ]
    assert document["skipped"] == [
        {"source": str(explicit), "server": "sandbox", "reason": "starts mcp-sandbox itself"}
    ]
    assert document["searched"][0] == str(explicit)
    assert str(isolated.home / ".claude.json") in document["searched"]  # HOME, not the real home
