"""``mcp-sandbox install CLIENT``: real config files in a temporary home, edited in place.

Each test runs the command as a user would (``main([...])`` with ``HOME`` pointing at a fresh
directory) and reads the file back: the entry is there, everything else is byte for byte what it
was, the old file is kept as a backup, and a second run changes nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_sandbox.cli import main
from mcp_sandbox.install.jsonedit import JsonEditError, load, set_member

# `install` writes an entry only where the server would start: the runtime built (`make runtime`) and
# the backend's probe passing (a real sandbox started), so these are not the fast lane's.
pytestmark = [pytest.mark.anyio, pytest.mark.sandbox]

THIS_SERVER = str(Path(sys.prefix) / "bin" / "mcp-sandbox")

VSCODE_JSONC = """\
// My servers, by hand.
{
\t"servers": {
\t\t"git": { "type": "stdio", "command": "uvx", "args": ["mcp-server-git"] }, // keep me
\t\t/* the time server */
\t\t"time": {
\t\t\t"type": "stdio",
\t\t\t"command": "uvx",
\t\t\t"args": ["mcp-server-time"],
\t\t},
\t},
\t"inputs": [],
}
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("MCP_SANDBOX_CONFIG", raising=False)
    return tmp_path


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.bak-*"))


def test_vscode_keeps_comments_trailing_commas_tabs_and_other_servers(home: Path) -> None:
    path = home / ".config" / "Code" / "User" / "mcp.json"
    path.parent.mkdir(parents=True)
    path.write_text(VSCODE_JSONC)

    assert main(["install", "vscode"]) == 0

    text = path.read_text()
    data = load(text)
    assert data["servers"]["sandbox"] == {"type": "stdio", "command": THIS_SERVER, "args": ["serve"]}
    assert set(data["servers"]) == {"git", "time", "sandbox"}
    # Only the new member was added: the original text is there in two unchanged pieces.
    head, _, tail = VSCODE_JSONC.partition('\t},\n\t"inputs"')
    assert text.startswith(head) and text.endswith('\t},\n\t"inputs"' + tail)
    assert '\t\t"sandbox": {\n\t\t\t"type": "stdio",' in text  # indented with the file's tabs
    [backup] = backups(path)
    assert backup.read_text() == VSCODE_JSONC


def test_a_second_install_changes_nothing_and_makes_no_backup(home: Path) -> None:
    path = home / ".cursor" / "mcp.json"
    assert main(["install", "cursor"]) == 0
    first = path.read_text()
    assert main(["install", "cursor"]) == 0
    assert path.read_text() == first
    assert backups(path) == []  # the file did not exist, and the second run wrote nothing


def test_claude_code_one_line_file_keeps_its_other_settings_and_mode(home: Path) -> None:
    path = home / ".claude.json"
    original = (
        '{"numStartups":12,"mcpServers":{"time":{"command":"uvx","args":["mcp-server-time"]}},'
        '"projects":{"/src/app":{"mcpServers":{}}}}'
    )
    path.write_text(original)
    path.chmod(0o600)

    assert main(["install", "claude-code"]) == 0

    data = json.loads(path.read_text())
    assert data["mcpServers"]["sandbox"] == {"type": "stdio", "command": THIS_SERVER, "args": ["serve"]}
    assert data["mcpServers"]["time"] == {"command": "uvx", "args": ["mcp-server-time"]}
    assert data["numStartups"] == 12 and data["projects"] == {"/src/app": {"mcpServers": {}}}
    assert "\n" not in path.read_text()  # still one line
    assert path.stat().st_mode & 0o777 == 0o600
    assert [b.read_text() for b in backups(path)] == [original]


def test_an_outdated_entry_is_replaced_in_place(home: Path) -> None:
    path = home / ".config" / "Claude" / "claude_desktop_config.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        '{\n    "mcpServers": {\n        "sandbox": {"command": "/old/bin/mcp-sandbox", "args": ["serve"]},\n'
        '        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]}\n    },\n'
        '    "globalShortcut": ""\n}\n'
    )
    assert main(["install", "claude-desktop"]) == 0
    data = json.loads(path.read_text())
    assert data["mcpServers"]["sandbox"] == {"command": THIS_SERVER, "args": ["serve"]}
    assert list(data["mcpServers"]) == ["sandbox", "memory"]  # same place, same order
    assert data["globalShortcut"] == ""
    assert '        "memory": {"command": "npx"' in path.read_text()


def test_xdg_config_home_moves_claude_desktop_and_vscode(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    assert main(["install", "claude-desktop"]) == 0
    assert main(["install", "vscode", "--name", "sbx"]) == 0
    assert "sandbox" in json.loads((home / "xdg" / "Claude" / "claude_desktop_config.json").read_text())["mcpServers"]
    assert "sbx" in json.loads((home / "xdg" / "Code" / "User" / "mcp.json").read_text())["servers"]


def test_a_file_that_is_not_json_is_refused_and_left_alone(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = home / ".cursor" / "mcp.json"
    path.parent.mkdir()
    path.write_text('{"mcpServers": {"a": {"command": "x"}}\n')  # one brace short
    assert main(["install", "cursor"]) == 1
    assert path.read_text() == '{"mcpServers": {"a": {"command": "x"}}\n'
    assert backups(path) == []
    err = capsys.readouterr().err
    assert "line 2" in err and '"mcpServers"' in err  # where it broke, and the entry to add by hand


def test_servers_that_is_not_an_object_is_refused(home: Path) -> None:
    path = home / ".cursor" / "mcp.json"
    path.parent.mkdir()
    path.write_text('{"mcpServers": []}')
    assert main(["install", "cursor"]) == 1
    assert path.read_text() == '{"mcpServers": []}'


def test_print_writes_nothing_and_shows_the_claude_mcp_add_form(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "claude-code", "--print"]) == 0
    printed = capsys.readouterr()
    assert not (home / ".claude.json").exists()
    # stdout is the JSON alone (it can be piped into a file); the other form goes to stderr.
    assert json.loads(printed.out)["mcpServers"]["sandbox"]["command"] == THIS_SERVER
    assert printed.err.strip() == f"or: claude mcp add --scope user sandbox -- {THIS_SERVER} serve"


def test_uvx_form_names_its_source_and_carries_the_config_file(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = home / "sandbox.toml"
    config.write_text("timeout = 20\n")
    source = "git+https://git.example/owner/mcp-sandbox"
    assert main(["install", "vscode", "--print", "--uvx", "--from", source, "--config", str(config)]) == 0
    entry = json.loads(capsys.readouterr().out)["servers"]["sandbox"]
    assert entry == {
        "type": "stdio",
        "command": "uvx",
        "args": ["--from", source, "mcp-sandbox", "serve", "--config", str(config)],
    }


def test_uvx_without_a_source_is_refused_never_a_bare_package_name(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `uvx mcp-sandbox` would fetch whatever the index holds under a name the project does not own.
    assert main(["install", "cursor", "--uvx"]) == 2
    assert "--from" in capsys.readouterr().err
    assert not (home / ".cursor" / "mcp.json").exists()


def test_a_pipx_style_install_is_named_by_the_command_on_path(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # pipx and `uv tool install` link the venv's script into ~/.local/bin: the entry names the link,
    # which survives a reinstall (the venv's own path is theirs to change).
    bin_dir = home / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "mcp-sandbox").symlink_to(THIS_SERVER)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert main(["install", "claude-code", "--print"]) == 0
    assert json.loads(capsys.readouterr().out)["mcpServers"]["sandbox"]["command"] == str(bin_dir / "mcp-sandbox")


def test_a_host_without_the_runtime_gets_no_entry_but_the_fix(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MCP_SANDBOX_PYTHON_RUNTIME", str(home / "no-runtime"))
    path = home / ".claude.json"
    assert main(["install", "claude-code"]) == 1
    err = capsys.readouterr().err
    assert not path.exists()
    assert "python_runtime" in err and "mcp-sandbox setup" in err and "--force" in err and "doctor" in err
    # --force writes it all the same, and says again why it will not start yet.
    assert main(["install", "claude-code", "--force"]) == 0
    assert "sandbox" in json.loads(path.read_text())["mcpServers"]
    err = capsys.readouterr().err
    assert "python_runtime" in err and "the entry is written" in err


def test_a_printed_entry_on_a_host_without_the_runtime_is_said_to_be_printed_not_written(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MCP_SANDBOX_PYTHON_RUNTIME", str(home / "no-runtime"))
    assert main(["install", "claude-code", "--print"]) == 0
    captured = capsys.readouterr()
    assert "sandbox" in json.loads(captured.out)["mcpServers"]
    assert "the entry is printed" in captured.err and "written" not in captured.err
    assert not (home / ".claude.json").exists()


def test_a_backend_that_does_not_work_here_is_named_with_its_reason(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MCP_SANDBOX_BACKEND", "docker")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{home}/no-engine.sock")
    assert main(["install", "cursor"]) == 1
    err = capsys.readouterr().err
    assert "backend docker is unavailable here" in err and "no-engine.sock" in err
    assert not (home / ".cursor" / "mcp.json").exists()


def test_jsonedit_creates_missing_objects_and_fills_empty_ones() -> None:
    assert load(set_member("", ("servers", "a"), {"x": 1})) == {"servers": {"a": {"x": 1}}}
    assert set_member('{\n  "servers": {}\n}\n', ("servers", "a"), 1) == '{\n  "servers": {\n    "a": 1\n  }\n}\n'
    text = '{\n  "other": true // last\n}'
    assert set_member(text, ("servers", "a"), 1) == '{\n  "other": true, // last\n  "servers": {\n    "a": 1\n  }\n}'
    with pytest.raises(JsonEditError):
        set_member("[1, 2]", ("servers", "a"), 1)
    with pytest.raises(JsonEditError):
        set_member('{"a": 1,, }', ("servers", "a"), 1)


async def test_the_entry_install_writes_starts_a_working_server(
    home: Path, state_dir: Path, packaged_runtime: Path
) -> None:
    """What a client does with the file: start the command it names and speak MCP to it."""
    assert main(["install", "cursor"]) == 0
    entry = json.loads((home / ".cursor" / "mcp.json").read_text())["mcpServers"]["sandbox"]
    env = {
        **os.environ,
        "MCP_SANDBOX_STATE_DIR": str(state_dir),
        "MCP_SANDBOX_DISCOVER_SERVERS": "0",
        "MCP_SANDBOX_PYTHON_RUNTIME": str(packaged_runtime),  # the checkout's, as `make` built it
    }
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
    with anyio.fail_after(60):
        async with Client(params) as client:
            tools = await client.list_tools()
            result = await client.call_tool("run_python", {"code": "print(6 * 7)"})
    assert "run_python" in {tool.name for tool in tools.tools}
    assert result.structured_content is not None and result.structured_content["stdout"] == "42\n"


def test_a_linked_config_is_edited_where_it_lives_and_stays_a_link(home: Path) -> None:
    real = home / "dotfiles" / "mcp.json"
    real.parent.mkdir()
    real.write_text('{"mcpServers": {}}\n')
    link = home / ".cursor" / "mcp.json"
    link.parent.mkdir()
    link.symlink_to(real)
    assert main(["install", "cursor"]) == 0
    assert link.is_symlink()
    assert "sandbox" in json.loads(real.read_text())["mcpServers"]
