"""The ``setup`` subcommand: its arguments, the two builds, and what it says about them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcp_sandbox.config import Settings
from mcp_sandbox.provision.status import SYSTEM_PYTHON

__all__ = ["add_setup_parser", "run_setup"]

DESCRIPTION = """\
Build the sandbox's runtimes where the settings point (a wheel install: the user's data directory,
$XDG_DATA_HOME/mcp-sandbox or ~/.local/share/mcp-sandbox; root: /usr/local/lib/mcp-sandbox; a
checkout: the .runtime that `make` builds): the pinned Python data stack (numpy, pandas,
matplotlib, requests) plus `runtime_packages`, on the system's Python, and the TypeScript/JavaScript
runtimes (bun, deno) through npm, and the sandbox's gate (a small static C program that starts each
sandbox, when a C compiler is installed). Run it again after an upgrade or a change of runtime_packages."""


def add_setup_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``setup`` to the CLI's subcommands."""
    setup = commands.add_parser(
        "setup", parents=[common], help="build the sandbox's runtimes (Python, TypeScript)", description=DESCRIPTION
    )
    setup.add_argument(
        "--python",
        dest="base_python",
        type=Path,
        default=SYSTEM_PYTHON,
        help=f"the system interpreter the runtime is a venv of (default {SYSTEM_PYTHON}; must be under /usr)",
    )
    setup.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="pip: look for packages in DIR too (repeat for several); with --no-index, offline from a wheelhouse",
    )
    setup.add_argument(
        "--no-index", action="store_true", help="pip: use no package index, only --find-links (npm: --offline)"
    )
    setup.add_argument("--no-js", action="store_true", help="skip the TypeScript/JavaScript runtimes")
    setup.add_argument("--no-python", action="store_true", help="skip the Python runtime (keep the one built)")


def run_setup(settings: Settings, args: argparse.Namespace) -> int:
    """Build both runtimes; 0 when the Python one (and the JavaScript one, unless npm is absent) built."""
    from mcp_sandbox.provision.js import NPM_MISSING, build_js_runtime, find_npm
    from mcp_sandbox.provision.python import SetupError, build_python_runtime

    index_args = [*(["--no-index"] if args.no_index else []), *(f"--find-links={d}" for d in args.find_links)]
    if args.no_python:
        print("python runtime: skipped (--no-python)")
    else:
        try:
            build_python_runtime(settings.paths, settings.sandbox, base=args.base_python, index_args=index_args)
        except SetupError as exc:
            print(f"mcp-sandbox setup: {exc}", file=sys.stderr)
            return 1
        print("  python runtime ready")
    if args.no_js:
        print("javascript runtimes: skipped (--no-js); TypeScript/JavaScript runs fail until setup installs them")
    elif find_npm() is None:
        print(f"javascript runtimes: SKIPPED: {NPM_MISSING}")
    else:
        try:
            build_js_runtime(settings.paths, offline=args.no_index)
        except SetupError as exc:
            print(f"mcp-sandbox setup: {exc}", file=sys.stderr)
            return 1
        print("  javascript runtimes ready")
    from mcp_sandbox.provision.gate import NO_COMPILER, build_gate, find_compiler

    if find_compiler() is None:
        print(f"sandbox gate: SKIPPED: {NO_COMPILER}")
    else:
        try:
            build_gate(settings.paths.gate_dir)
        except SetupError as exc:  # sandboxes start without it, only slower
            print(f"sandbox gate: NOT BUILT: {exc}; sandboxes start through sh and setpriv")
    print(
        "done. Next: `mcp-sandbox doctor`, then `mcp-sandbox install claude-code` (or claude-desktop, cursor, vscode)"
    )
    return 0
