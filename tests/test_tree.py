"""tests/ mirrors src/: a module's unit tests are found by its name.

The tests of ``src/mcp_sandbox/<pkg>/<mod>.py`` live in ``tests/<pkg>/test_<mod>.py`` (a
sub-package's likewise; ``test_<pkg>.py`` for a package tested whole). Suites of a concern that
crosses modules keep a name of their own: whole folders (``CONCERN_FOLDERS``) and a few files
(``CONCERN_FILES``), each with the reason it names no module.
"""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_TESTS = _ROOT / "tests"
_SRC = _ROOT / "src" / "mcp_sandbox"

# Folders grouped by concern, not by module.
CONCERN_FOLDERS = (
    "sandbox",  # the conformance suite of attacks, per backend (and its argv snapshots, cgroups)
    "containers",  # the container backends' engines: kill by name, sweep by label
    "e2e",  # the server through real clients, grouped by concern (tests/e2e/README.md)
    "replicas",  # several servers over one database and store
    "deploy",  # the server as an operator runs it
    "vm",  # make vm-test's guest
    "docs",  # the manual's links and commands
)

# Files outside those folders that test a concern across modules, with what they test instead.
CONCERN_FILES = frozenset(
    {
        # The whole tree or the tests' own machinery.
        "test_exported_members.py",  # the public API, mcp_sandbox.__all__
        "test_layers.py",  # no import cycles between modules
        "test_settings_pieces.py",  # who takes Settings whole
        "test_tree.py",  # this file
        "test_xdist_scopes.py",  # tests/xdist_scopes.py, the workers' units
        "workspace/test_public_api.py",  # the workspace package's __all__
        "tracing/test_tracing.py",  # the tracing package's rules (its __init__), on and off
        # Real sandboxes, attacked or run through a running engine.
        "egress/test_egress.py",  # the proxy's rules, attacked from a sandbox
        "egress/test_egress_loopback.py",  # the host's loopback through the proxy
        "egress/test_egress_policy.py",  # a sandbox granted network keeps its namespace
        "egress/test_born_egress.py",  # network in sessions born of ready sandboxes
        "egress/test_packages.py",  # pip install and bun add through the proxy
        "engine/test_images.py",  # matplotlib's images back with the result
        "engine/test_js_runs.py",  # TypeScript and JavaScript runs on bun and deno
        "engine/test_run_io.py",  # a run's stdio and environment, fresh and in sessions
        "engine/test_session_limits.py",  # sessions' count, idle time and spending
        "engine/test_etc_copy.py",  # sandbox/backends/bwrap/etc.py, on the engine's fixtures
        "engine/test_spares.py",  # bwrap's spare first processes, on the engine's fixtures
        "workspace/test_attacks.py",  # traps in a workspace, played by the test
        "workspace/test_sandboxed_code.py",  # the same traps built by real sandboxed code
        # A real server, client or build around the module.
        "bridge/test_downstream_servers.py",  # the real downstream MCP servers
        "egress/test_secrets_mcp.py",  # secrets through a real HTTP server's tenants
        "server/test_tool_results.py",  # the tools' results over the SDK's in-memory client
        "tracing/test_forwarding.py",  # a trace continued across a forwarded call
        "provision/test_playground_bundle.py",  # the committed bundle against web/
        "provision/test_sandbox_access.py",  # make setup's scripts/check-sandbox-access.sh
        "provision/test_wheel_install.py",  # the built wheel in a fresh venv
    }
)


def _mirrors_a_module(test_file: Path) -> bool:
    """``tests/<pkg>/test_<x>.py`` names ``src/mcp_sandbox/<pkg>/<x>.py`` or the package ``<x>/``."""
    target = _SRC / test_file.parent.relative_to(_TESTS) / test_file.stem.removeprefix("test_")
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()


# Sub-folders of a concern folder whose files are unit tests all the same.
MIRRORED_INSIDE = ("sandbox/cgroups", "sandbox/backends", "sandbox/backends/bwrap", "sandbox/backends/container")


def _unit_test_files() -> list[Path]:
    def unit(path: Path) -> bool:
        relative = path.relative_to(_TESTS)
        return relative.parts[0] not in CONCERN_FOLDERS or relative.parent.as_posix() in MIRRORED_INSIDE

    return [path for path in sorted(_TESTS.rglob("test_*.py")) if unit(path)]


def test_every_unit_test_file_is_named_after_the_module_it_tests() -> None:
    strays = [
        path.relative_to(_TESTS).as_posix()
        for path in _unit_test_files()
        if not _mirrors_a_module(path) and path.relative_to(_TESTS).as_posix() not in CONCERN_FILES
    ]
    assert not strays, (
        f"{strays}: name each tests/<pkg>/test_<mod>.py after its src/mcp_sandbox/<pkg>/<mod>.py,"
        " or add a suite of a concern to CONCERN_FILES with what it tests"
    )


def test_every_concern_file_exists_and_names_no_module() -> None:
    stale = [
        name for name in sorted(CONCERN_FILES) if not (_TESTS / name).is_file() or _mirrors_a_module(_TESTS / name)
    ]
    assert not stale, f"{stale}: remove from CONCERN_FILES (gone, or named after a module now)"
