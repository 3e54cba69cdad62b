"""The ``mcp-sandbox`` command: serve | run | servers | doctor | setup | install."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from mcp_sandbox import __version__
from mcp_sandbox.config import OUTPUT_MODES, Config, Settings, load_config, load_settings
from mcp_sandbox.errors import SandboxError
from mcp_sandbox.runners import LANGUAGES

__all__ = ["main"]

# Flags that map onto settings, by field name (argparse dest == Settings field).
_SETTING_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--state-dir", {"help": "workspaces, metadata and the server secret"}),
    ("--backend", {"help": "sandbox backend: bwrap, podman, docker, or container (podman or docker)"}),
    ("--servers-config", {"help": "file listing downstream MCP servers"}),
    ("--output-mode", {"choices": OUTPUT_MODES, "help": "text rendering of results"}),
    ("--timeout", {"type": float, "help": "default per-run timeout, seconds"}),
    ("--max-timeout", {"type": float, "help": "largest timeout a caller may ask for"}),
    ("--memory", {"help": "memory limit per sandbox, e.g. 512m"}),
    ("--pids", {"type": int, "help": "process limit per sandbox"}),
    ("--cpus", {"type": float, "help": "CPU quota per sandbox"}),
    ("--log-level", {"help": "DEBUG, INFO, WARNING (default), ERROR"}),
    ("--host", {"help": "HTTP: address to listen on (default 127.0.0.1)"}),
    ("--port", {"type": int, "help": "HTTP: port to listen on (default 8765)"}),
    ("--public-url", {"help": "HTTP: the base URL clients reach this server at (for download links)"}),
    ("--data-dir", {"help": "where `setup` builds the sandbox's runtimes (python/, js/)"}),
)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="TOML settings file")
    for flag, options in _SETTING_FLAGS:
        common.add_argument(flag, default=argparse.SUPPRESS, **options)
    common.add_argument(
        "--accept-weaker-isolation",
        action="store_true",
        default=argparse.SUPPRESS,
        help="start even if the backend cannot enforce every limit here",
    )
    return common


def _parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="mcp-sandbox", parents=[common], description=__doc__)
    parser.add_argument("--version", action="version", version=f"mcp-sandbox {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", parents=[common], help="serve MCP (stdio by default)")
    serve.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default), or http: Streamable HTTP at /mcp, legacy SSE at /sse, file routes",
    )

    run = commands.add_parser("run", parents=[common], help="run code once and print the result")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", dest="code", help="the code to run")
    source.add_argument("file", nargs="?", type=Path, help="a file to run ('-' for stdin)")
    run.add_argument("--language", choices=LANGUAGES, default="python")
    run.add_argument("--json", action="store_true", help="print the structured result as JSON")
    run.add_argument(
        "--server",
        dest="servers",
        action="append",
        default=[],
        metavar="NAME",
        help="a downstream MCP server the code may call (repeat for several)",
    )

    servers = commands.add_parser(
        "servers", parents=[common], help="list the downstream MCP servers found, and problems with their configs"
    )
    servers.add_argument("--json", action="store_true", help="print the list as JSON")
    servers.add_argument("--no-start", action="store_true", help="do not start the servers to count their tools")

    commands.add_parser("doctor", parents=[common], help="what each backend can enforce here")
    commands.add_parser(
        "import-runner-data",
        parents=[common],
        help="import the earlier code runner's SANDBOX_ROOT (with FILE_SECRET) now; serve also does at start",
    )
    # Issue 15: building the runtimes of a wheel install, and client set-up, in modules of their own.
    from mcp_sandbox.install.command import add_install_parser
    from mcp_sandbox.provision.command import add_setup_parser
    from mcp_sandbox.server.tasks.command import add_tasks_parser

    add_setup_parser(commands, common)
    add_install_parser(commands, common)
    add_tasks_parser(commands, common)
    return parser


def _config(args: argparse.Namespace) -> Config | Settings:
    """What ``args``, the environment and the TOML file configure: with the tokens to serve, else the settings."""
    flags = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_"), None) for flag, _ in _SETTING_FLAGS}
    flags["accept_weaker_isolation"] = getattr(args, "accept_weaker_isolation", None)
    load = load_config if args.command == "serve" else load_settings
    return load(flags=flags, config_file=getattr(args, "config", None))


def _check_stdio_conversation(settings: Settings) -> None:
    from mcp_sandbox.errors import ConfigError, ValidationError
    from mcp_sandbox.workspace import check_conversation_id

    if settings.migration.stdio_conversation is not None:
        try:
            check_conversation_id(settings.migration.stdio_conversation)
        except ValidationError as exc:
            raise ConfigError(f"stdio_conversation: {exc.message}") from exc


def _cmd_serve(config: Config, transport: str) -> int:
    settings = config.settings
    if settings.otel_endpoint is None:
        return _serve(config, transport)
    # Set up first: a missing SDK stops the server before it answers anyone.
    from mcp_sandbox.tracing.export import exporting

    with exporting(settings.otel_endpoint, settings.otel_protocol, __version__):
        return _serve(config, transport)


def _serve(config: Config, transport: str) -> int:
    settings = config.settings
    early = None
    caught: list[int] = []
    listeners = None
    if transport == "http":
        from mcp_sandbox.server.transport.listeners import bind_listeners

        listeners = bind_listeners(
            settings.http, settings.replicas.replica_url
        )  # before the imports: a port in use is said at once
        # A stop signal during the imports and the start-up is the server's to honour (it stops in
        # order, see server/lifecycle.py's stop_signals), not the default action's.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda number, _frame: caught.append(number))
    if transport == "stdio":
        # Answer the client's initialize while the MCP SDK is imported (server/transport/stdio_early.py).
        from mcp_sandbox.server.transport.stdio_early import begin

        _check_stdio_conversation(settings)
        early = begin(__version__)
    from mcp_sandbox.server import serve

    _imported()
    anyio.run(serve, config, transport, early, caught, listeners)
    return 0


def _read_source(args: argparse.Namespace) -> str:
    if args.code is not None:
        return str(args.code)
    if str(args.file) == "-":
        return sys.stdin.read()
    try:
        return Path(args.file).read_text(encoding="utf-8")
    except OSError as exc:
        raise SystemExit(f"mcp-sandbox: cannot read {args.file}: {exc.strerror}") from exc


def _cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from mcp_sandbox.bridge.discovery import discover
    from mcp_sandbox.bridge.mediator import open_mediator
    from mcp_sandbox.engine import ExecutionRequest, ExecutionResult
    from mcp_sandbox.engine.startup import open_engine
    from mcp_sandbox.state import StateLayout

    code = _read_source(args)
    # One run: warm and pre-started sandboxes would only start (numpy, pandas; bun, containers)
    # beside it and be thrown away.
    settings = settings.replace(pool_size=0, pool_min=0, prestart_size=0)
    engine = open_engine(settings)

    discovery = discover(settings.code_mode, settings.config_read or settings.config_file)
    layout, tenants = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces), settings.tenant_count

    async def run() -> ExecutionResult:
        async with (
            open_mediator(settings.code_mode, discovery, None, layout, tenants) as bridge,
            engine.running(),
        ):
            tools = await bridge.open_run(bridge.aliases(args.servers))
            request = ExecutionRequest(code=code, timeout=settings.limits.timeout, language=args.language, tools=tools)
            return await engine.execute(request)

    result = anyio.run(run)
    if args.json:
        print(json.dumps(result.structured(), ensure_ascii=False, indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.error:
            sys.stderr.write(f"mcp-sandbox: {result.status}: {result.error}\n")
    if result.exit_code is None:
        return 1
    return result.exit_code


def _cmd_servers(settings: Settings, args: argparse.Namespace) -> int:
    from mcp_sandbox.bridge.discovery import discover
    from mcp_sandbox.bridge.listing import describe, describe_json
    from mcp_sandbox.bridge.mediator import open_mediator
    from mcp_sandbox.state import StateLayout

    discovery = discover(settings.code_mode, settings.config_read or settings.config_file)
    layout, tenants = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces), settings.tenant_count

    async def count() -> dict[str, int | str]:
        async with open_mediator(settings.code_mode, discovery, None, layout, tenants) as bridge:
            listed = await bridge.pool.all_tools()
        return {
            alias: len(tools) if isinstance(tools, tuple) else f"error: {tools.message}"
            for alias, tools in listed.items()
        }

    counts = anyio.run(count) if discovery.servers and not args.no_start else None
    print(describe_json(discovery, counts) if args.json else describe(discovery, counts))
    return 0  # problems are reported, not failures: the servers that loaded still work


def _cmd_import_runner_data(settings: Settings) -> int:
    from mcp_sandbox.errors import ConfigError
    from mcp_sandbox.state import StateLayout
    from mcp_sandbox.tenant_uids import TenantUids
    from mcp_sandbox.workspace import WorkspaceStore, load_secret
    from mcp_sandbox.workspace.runner_data import RunnerData

    root, secret = settings.migration.runner_data, settings.migration.runner_secret
    if root is None or secret is None:
        raise ConfigError("import-runner-data needs SANDBOX_ROOT and FILE_SECRET (runner_data and runner_secret)")
    layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
    layout.make_root_private()
    store = WorkspaceStore(settings.workspaces, load_secret(layout.root), TenantUids(settings.sandbox, layout))
    for item in RunnerData(root, secret, layout.runner_import, store).import_all():
        done = f"{item.files} files, {item.bytes} bytes, {item.skipped} skipped (not regular files)"
        print(f"{item.digest}: {'imported before' if item.already else done}")
    return 0


def console_main() -> int:
    """The ``mcp-sandbox`` command and ``python -m mcp_sandbox``: :func:`main`, its imports uncollected.

    A server's start-up imports tens of thousands of objects that live as long as the process (the
    MCP SDK's pydantic models the most) and makes next to no garbage, yet the cyclic collector ran
    hundreds of times while they were made (figures: bench/README.md, ``startup.py``). So it runs
    only once they are in, and never again among them (:func:`_imported`).
    """
    gc.disable()
    try:
        return main()
    finally:
        gc.enable()


def _imported() -> None:
    """The command's imports are done: freeze what they made out of later collections, collect again."""
    if not gc.isenabled():  # under console_main
        gc.freeze()
        gc.enable()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's arguments) names."""
    args = _parser().parse_args(argv)
    try:
        config = _config(args)
        settings = config.settings if isinstance(config, Config) else config
        logging.basicConfig(
            level=settings.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
        if isinstance(config, Config):
            return _cmd_serve(config, args.transport)
        _imported()
        if args.command == "run":
            return _cmd_run(settings, args)
        if args.command == "import-runner-data":
            return _cmd_import_runner_data(settings)
        if args.command == "servers":
            return _cmd_servers(settings, args)
        if args.command == "setup":
            from mcp_sandbox.provision.command import run_setup

            return run_setup(settings, args)
        if args.command == "tasks":
            from mcp_sandbox.server.tasks.command import run_tasks

            return run_tasks(settings, args)
        if args.command == "install":
            from mcp_sandbox.install.command import run_install

            return run_install(settings, args)
        from mcp_sandbox.doctor import doctor

        return doctor(settings, sys.stdout)
    except SandboxError as exc:
        print(f"mcp-sandbox: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(console_main())
