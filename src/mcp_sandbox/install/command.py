"""The ``install`` subcommand: add this installation to a client's config, or print the entry.

The entry starts *this* installation: a checkout's ``.venv`` by its absolute path, a pipx or
``uv tool`` install by the command on PATH (absolute: GUI clients do not read the shell's PATH),
or ``uvx --from SOURCE mcp-sandbox`` when ``--uvx --from`` names the source: never a bare package
name, which the project does not own on the index. A host that cannot run the server (what
``open_engine`` would refuse) gets no entry unless ``--force``. The file is edited in place
(:mod:`.jsonedit`), backed up first, and left alone when the entry is already there.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from mcp_sandbox.config import Settings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.install.readiness import problems
from mcp_sandbox.install.targets import CLIENTS, Client

__all__ = ["add_install_parser", "run_install", "server_command"]


def add_install_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``install`` to the CLI's subcommands."""
    install = commands.add_parser(
        "install", parents=[common], help="add this server to an MCP client's config (claude-code, cursor, ...)"
    )
    install.add_argument("client", choices=sorted(CLIENTS), help="the client to configure")
    install.add_argument("--print", dest="print_only", action="store_true", help="print the entry, change nothing")
    install.add_argument("--name", default="sandbox", help="the server's name in the client (default: sandbox)")
    install.add_argument("--path", type=Path, help="the config file to edit instead of the client's user-wide one")
    install.add_argument(
        "--uvx", action="store_true", help="start the server with `uvx --from SOURCE mcp-sandbox` (needs --from)"
    )
    install.add_argument(
        "--from",
        dest="from_source",
        metavar="SOURCE",
        help="with --uvx: where uvx gets mcp-sandbox, e.g. git+https://HOST/OWNER/mcp-sandbox or a wheel's path",
    )
    install.add_argument(
        "--force", action="store_true", help="write the entry even if this host cannot run the server yet"
    )


def _is_uv_cache(prefix: Path) -> bool:
    # uvx runs tools from environments in uv's cache, which uv may delete at any time.
    parts = prefix.parts
    return "uv" in parts and any(part.startswith("archive-v") or part == "builds-v0" for part in parts)


def _on_path(script: Path, env: Mapping[str, str]) -> Path | None:
    """The ``mcp-sandbox`` on PATH when it is this installation's (pipx and uv tool link it there)."""
    found = shutil.which("mcp-sandbox", path=env.get("PATH", os.defpath))
    if found is None or Path(found).parent == script.parent:
        return None
    return Path(found).absolute() if Path(found).resolve() == script.resolve() else None


def server_command(
    settings: Settings, *, uvx_from: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[str, list[str]]:
    """(command, args) that start this installation's stdio server, with the same ``--config``.

    Raises:
        ConfigError: this copy runs from uvx's throw-away environment and no ``--from`` says where
            uvx should get it again.
    """
    args = ["serve"]
    if settings.config_file is not None:
        args += ["--config", str(settings.config_file.resolve())]
    if settings.sandbox.accept_weaker_isolation:
        args.append("--accept-weaker-isolation")
    if uvx_from is not None:
        return "uvx", ["--from", uvx_from, "mcp-sandbox", *args]
    if _is_uv_cache(Path(sys.prefix)):
        raise ConfigError(
            "this copy runs from uvx's cache, which uv may delete: give the source uvx should start it from, "
            "e.g. `install CLIENT --uvx --from git+https://<your-git-host>/<owner>/mcp-sandbox`, "
            "or install it for good with `uv tool install git+...` and run `mcp-sandbox install CLIENT`"
        )
    script = Path(sys.prefix) / "bin" / "mcp-sandbox"
    if script.exists():
        linked = _on_path(script, os.environ if env is None else env)
        return str(linked or script), args
    return sys.executable, ["-m", "mcp_sandbox", *args]


def _backup(path: Path) -> Path:
    backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%dT%H%M%S')}")
    shutil.copy2(path, backup)
    return backup


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, keeping its mode (``~/.claude.json`` is private: 0600)."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o600
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


def _snippet(client: Client, name: str, entry: dict[str, object]) -> str:
    from mcp_sandbox.install.jsonedit import dump

    return dump({client.key: {name: entry}})


def run_install(settings: Settings, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Add (or print) the entry; 0 when the config holds it afterwards, 1 when refused.

    Refused: the file cannot be edited, or the host cannot run the server (unless ``--force``).

    Raises:
        ConfigError: ``--uvx`` without ``--from`` (or the reverse), or a uvx cache copy without them.
    """
    from mcp_sandbox.install.jsonedit import JsonEditError, load, set_member

    env = os.environ if env is None else env
    client = CLIENTS[args.client]
    if args.uvx != (args.from_source is not None):
        raise ConfigError("--uvx and --from go together: `--uvx --from SOURCE` (a git+https:// URL or a wheel)")
    command, command_args = server_command(settings, uvx_from=args.from_source, env=env)
    entry = client.entry(command, command_args)
    found = problems(settings)
    if found:
        refused = not (args.force or args.print_only)
        if refused:
            head = "will not add the entry"
        elif args.print_only:
            head = "the entry is printed, but the server cannot start here yet"
        else:
            head = "the entry is written, but the server cannot start here yet"
        print(f"mcp-sandbox install: {head}:", file=sys.stderr)
        for problem in found:
            print(f"  - {problem}", file=sys.stderr)
        print("  `mcp-sandbox doctor` shows the full report", file=sys.stderr)
        if refused:
            print("  fix the host, or add the entry anyway with --force", file=sys.stderr)
            return 1
    if args.print_only:
        # The JSON alone on stdout (so it can be piped into a file or a tool); the hint on stderr.
        print(_snippet(client, args.name, entry))
        if client.name == "claude-code":
            hint = shlex.join([command, *command_args])
            print(f"or: claude mcp add --scope user {shlex.quote(args.name)} -- {hint}", file=sys.stderr)
        return 0
    path = args.path.expanduser() if args.path is not None else client.locate(Path(env.get("HOME") or Path.home()), env)
    try:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        present = load(text) if text.strip() else {}
        servers = present.get(client.key) if isinstance(present, dict) else None
        if isinstance(servers, dict) and servers.get(args.name) == entry:
            print(f"{client.label}: {args.name!r} is already in {path}, as {shlex.join([command, *command_args])}")
            return 0
        edited = set_member(text, (client.key, args.name), entry)
    except JsonEditError as exc:
        print(f"mcp-sandbox install: {path}: {exc}; fix the file or add the entry by hand:", file=sys.stderr)
        print(_snippet(client, args.name, entry), file=sys.stderr)
        return 1
    except (OSError, UnicodeDecodeError) as exc:
        print(f"mcp-sandbox install: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    # A linked file (dotfiles kept elsewhere) is edited where it lives; the link stays.
    target = path.resolve() if path.is_symlink() else path
    backup = _backup(target) if target.exists() else None
    _write(target, edited)
    print(f"{client.label}: added {args.name!r} to {path}: {shlex.join([command, *command_args])}")
    if backup is not None:
        print(f"  the previous file is kept as {backup}")
    print(f"  restart {client.label.split(' (')[0]} to load it")
    return 0
