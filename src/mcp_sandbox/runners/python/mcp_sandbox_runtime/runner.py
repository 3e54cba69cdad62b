"""Runs one piece of user code inside the sandbox.

The host sends an EXEC frame on the channel fd; the code runs as ``__main__`` with top-level
``await`` allowed; its stdout/stderr are the process's own (pipes read by the host); a DONE
frame reports the exit code. Tracebacks show the user's frames only. The process exit code is
the user's: ``sys.exit(n)`` gives ``n``, an uncaught exception gives 1.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import sys
from types import CodeType
from typing import TYPE_CHECKING, Any

from . import host
from .frames import FrameError, Kind, read_frame, write_frame

__all__ = ["USER_FILENAME", "main", "run_code"]

if TYPE_CHECKING:
    import traceback

USER_FILENAME = "<main>"
# ast.PyCF_ALLOW_TOP_LEVEL_AWAIT and inspect.CO_COROUTINE, spelled out: importing `ast` and
# `inspect` costs more than the rest of the runner's start-up together.
_PYCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
_CO_COROUTINE = 0x0080
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
EXIT_USAGE = 64
EXIT_PROTOCOL = 76


def _trim(exc: traceback.TracebackException, seen: set[int]) -> None:
    """Drop the runtime's frames above the user's first frame, in the whole exception chain."""
    import traceback

    if id(exc) in seen:
        return
    seen.add(id(exc))
    frames = list(exc.stack)
    for index, frame in enumerate(frames):
        if frame.filename == USER_FILENAME:
            frames = frames[index:]
            # Below the user's code, the runtime's own frames (how a tool call reached the host)
            # only hide the message; the stubs under /tools stay, they show the call.
            while len(frames) > 1 and frames[-1].filename.startswith(_RUNTIME_DIR):
                frames.pop()
            exc.stack = traceback.StackSummary.from_list(frames)
            break
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None:
            _trim(linked, seen)
    for group_member in getattr(exc, "exceptions", None) or ():
        _trim(group_member, seen)


def _report(error: BaseException) -> None:
    import traceback

    summary = traceback.TracebackException.from_exception(error)
    _trim(summary, set())
    sys.stderr.write("".join(summary.format()))


def _compile(code: str) -> CodeType | None:
    lines = code.splitlines(keepends=True)
    linecache.cache[USER_FILENAME] = (len(code), None, lines, USER_FILENAME)
    try:
        compiled: CodeType = compile(code, USER_FILENAME, "exec", flags=_PYCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        return compiled
    except (SyntaxError, ValueError) as error:
        # A syntax error has no user frames; show it the way `python file.py` would.
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(error), error)))
        return None


def _exit_code(exit_request: SystemExit) -> int:
    code = exit_request.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _code_mode_names(servers: list[str]) -> dict[str, Any]:
    """``mcp`` and ``mcp_<alias>`` for the servers this run may call (their stubs are under /tools)."""
    if not servers:
        return {}
    import importlib

    names: dict[str, Any] = {"mcp": importlib.import_module("mcp")}
    for alias in servers:
        names[f"mcp_{alias}"] = importlib.import_module(f"mcp.servers.{alias}")
    return names


def run_code(code: str, servers: list[str] | None = None) -> tuple[int, str | None]:
    """Run ``code`` as ``__main__``; return (exit code, name of the uncaught exception or None).

    ``servers`` are the aliases of the downstream servers the code may call.
    """
    compiled = _compile(code)
    if compiled is None:
        return 1, "SyntaxError"
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": USER_FILENAME}
    sys.argv = [USER_FILENAME]
    try:
        namespace.update(_code_mode_names(servers or []))
        outcome = eval(compiled, namespace)
        if compiled.co_flags & _CO_COROUTINE:
            import asyncio  # only for code that awaits: importing it costs ~25 ms

            asyncio.run(outcome)
    except SystemExit as exit_request:
        return _exit_code(exit_request), None
    except BaseException as error:
        _report(error)
        return 1, type(error).__name__
    return 0, None


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def main(argv: list[str]) -> int:
    """``boot.py CHANNEL_FD``: announce readiness, take one EXEC frame, run it, report DONE."""
    if len(argv) != 1 or not argv[0].isdigit():
        sys.stderr.write("usage: boot.py CHANNEL_FD\n")
        return EXIT_USAGE
    channel = int(argv[0])
    os.set_inheritable(channel, False)  # user subprocesses never get the channel
    faulthandler.enable()  # a crash of the interpreter still leaves a trace on stderr
    write_frame(channel, Kind.READY, {"runtime": "python", "version": sys.version.split()[0]})
    try:
        frame = read_frame(channel)
    except FrameError as error:
        write_frame(channel, Kind.ERROR, {"message": str(error)})
        return EXIT_PROTOCOL
    if frame is None:
        return EXIT_PROTOCOL
    kind, body = frame
    code = body.get("code")
    servers = body.get("servers", [])
    if kind is not Kind.EXEC or not isinstance(code, str):
        write_frame(channel, Kind.ERROR, {"message": f"expected an EXEC frame with code, got {kind.name}"})
        return EXIT_PROTOCOL
    if not isinstance(servers, list) or not all(isinstance(alias, str) and alias.isidentifier() for alias in servers):
        write_frame(channel, Kind.ERROR, {"message": "EXEC servers must be a list of aliases"})
        return EXIT_PROTOCOL
    connection = host.connect(channel)
    exit_code, exception = run_code(code, servers)
    _flush()
    connection.send(Kind.DONE, {"exitCode": exit_code, "exception": exception})
    return exit_code
