"""Real downstream MCP servers for tests and benchmarks, as `make downstream` installs them.

Six stdio servers: the npm reference servers `everything`, `memory` and `filesystem`
(downstream/package-lock.json, run with node), the PyPI reference servers `time` and `git`
(downstream/python-requirements.txt, in their own venv .downstream/python), and `fixture`, ours
(fixture_server.py, run with the server's own interpreter).

`servers_config()` describes them in the Claude Desktop format (`{"mcpServers": {...}}`);
`installed()` says whether they are there; `require_installed()` skips a test outside make and
fails it under make or CI, which always install them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters

__all__ = [
    "EVERYTHING_JS",
    "FILESYSTEM_JS",
    "FIXTURE_SERVER",
    "GIT_BIN",
    "MEMORY_JS",
    "SERVER_NAMES",
    "TIME_BIN",
    "installed",
    "make_git_repo",
    "require_installed",
    "servers_config",
    "stdio_parameters",
    "write_servers_config",
]

REPO_ROOT = Path(__file__).resolve().parents[2]

_NODE_MODULES = REPO_ROOT / "downstream" / "node_modules"
_NPM_SCOPE = _NODE_MODULES / "@modelcontextprotocol"
# Each package's "bin" entry; run as `node <file>` so no shebang or PATH lookup is involved.
EVERYTHING_JS = _NPM_SCOPE / "server-everything" / "dist" / "index.js"
MEMORY_JS = _NPM_SCOPE / "server-memory" / "dist" / "index.js"
FILESYSTEM_JS = _NPM_SCOPE / "server-filesystem" / "dist" / "index.js"

_PYTHON_ENV = REPO_ROOT / ".downstream" / "python"
TIME_BIN = _PYTHON_ENV / "bin" / "mcp-server-time"
GIT_BIN = _PYTHON_ENV / "bin" / "mcp-server-git"

FIXTURE_SERVER = Path(__file__).resolve().with_name("fixture_server.py")

# The stamps `make downstream` writes once an install has finished.
_STAMPS = (_NODE_MODULES / ".installed", _PYTHON_ENV / ".installed")

SERVER_NAMES = ("everything", "memory", "filesystem", "time", "git", "fixture")

# What the tests run git with, so commits need no global git config and hash the same everywhere.
_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.invalid",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.invalid",
}


def _node() -> str:
    return shutil.which("node") or "node"


def installed() -> str | None:
    """None when every downstream server is installed, else why not (to skip a test with)."""
    for tool in ("node", "git"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (the downstream servers need it)"
    for required in (*_STAMPS, EVERYTHING_JS, MEMORY_JS, FILESYSTEM_JS, TIME_BIN, GIT_BIN):
        if not required.exists():
            return f"the downstream servers are not installed ({required} is missing): run `make downstream`"
    return None


def require_installed() -> None:
    """Skip the calling test when the servers are missing, unless make or CI runs it: then fail.

    Raises:
        pytest.skip.Exception: outside make and CI, when `installed()` gives a reason.
        pytest.fail.Exception: under make (MAKELEVEL) or CI, which always install them first.
    """
    reason = installed()
    if reason is None:
        return
    if os.environ.get("MAKELEVEL") or os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def servers_config(tmp: Path, *, git_repo: Path, include: Iterable[str] | None = None) -> dict[str, Any]:
    """The downstream servers in the Claude Desktop format: `{"mcpServers": {name: {command, args, env}}}`.

    State lives under `tmp`: memory's graph in tmp/memory.jsonl, and filesystem may use
    tmp/files (created here, since the server refuses a missing directory). `git` serves
    `git_repo` (see `make_git_repo`). `include` picks servers by name (default: all six).

    Raises:
        ValueError: `include` names a server that is not one of SERVER_NAMES.
    """
    names = SERVER_NAMES if include is None else tuple(include)
    if unknown := sorted(set(names) - set(SERVER_NAMES)):
        raise ValueError(f"unknown downstream servers {unknown}; known: {list(SERVER_NAMES)}")
    files = tmp / "files"
    if "filesystem" in names:
        files.mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict[str, Any]] = {
        "everything": {"command": _node(), "args": [str(EVERYTHING_JS), "stdio"]},
        "memory": {
            "command": _node(),
            "args": [str(MEMORY_JS)],
            "env": {"MEMORY_FILE_PATH": str(tmp / "memory.jsonl")},
        },
        "filesystem": {"command": _node(), "args": [str(FILESYSTEM_JS), str(files)]},
        "time": {"command": str(TIME_BIN), "args": ["--local-timezone", "UTC"]},
        "git": {"command": str(GIT_BIN), "args": ["--repository", str(git_repo)]},
        "fixture": {"command": sys.executable, "args": [str(FIXTURE_SERVER)]},
    }
    return {"mcpServers": {name: entries[name] for name in names}}


def write_servers_config(path: Path, config: dict[str, Any]) -> Path:
    """Write `config` (from `servers_config`) as JSON to `path`, and return `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def stdio_parameters(entry: dict[str, Any]) -> StdioServerParameters:
    """The SDK's launch parameters for one `mcpServers` entry."""
    return StdioServerParameters(command=entry["command"], args=entry.get("args", []), env=entry.get("env"))


def _git(repo: Path, *args: str, date: str | None = None) -> None:
    env = {"PATH": os.environ.get("PATH", os.defpath), **_GIT_ENV}
    if date is not None:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True)


def make_git_repo(path: Path) -> Path:
    """A real git repository at `path` on branch main with two commits touching README.md.

    The commit messages are "first commit" and "second commit"; fixed dates and identities make
    the commit hashes the same on every run.
    """
    path.mkdir(parents=True, exist_ok=True)
    readme = path / "README.md"
    _git(path, "init", "--quiet", "--initial-branch=main")
    readme.write_text("# fixture repo\n", encoding="utf-8")
    _git(path, "add", "README.md")
    _git(path, "commit", "--quiet", "-m", "first commit", date="2026-01-01T00:00:00+00:00")
    readme.write_text("# fixture repo\n\nA second line.\n", encoding="utf-8")
    _git(path, "commit", "--quiet", "--all", "-m", "second commit", date="2026-01-02T00:00:00+00:00")
    return path
