"""The interpreter state runs share inside the sandbox: ``__main__``, the event loop, the bound servers.

:class:`MainNamespace` compiles each run's code (top-level ``await`` allowed) and runs it in one
``__main__`` namespace, binds ``mcp_<alias>`` for the run's servers and the library's names, and
reports an uncaught exception with the user's frames only. It knows nothing of frames or pipes:
``exec_server.py`` serves an EXEC frame with it.
"""

from __future__ import annotations

import builtins
import linecache
import os
import sys
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any

from . import TOOLS_MOUNT

__all__ = ["COMPILE_FLAGS", "USER_FILENAME", "MainNamespace"]

if TYPE_CHECKING:
    import asyncio
    import traceback

USER_FILENAME = "<main>"
# ast.PyCF_ALLOW_TOP_LEVEL_AWAIT and inspect.CO_COROUTINE, spelled out: importing `ast` and
# `inspect` costs more than the rest of the runner's start-up together.
COMPILE_FLAGS = 0x2000
_CO_COROUTINE = 0x0080
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _is_user_file(filename: str) -> bool:
    return filename == USER_FILENAME or (filename.startswith("<main-") and filename.endswith(">"))


def _trim(exc: traceback.TracebackException, seen: set[int]) -> None:
    """Drop the runtime's frames above the user's first frame, in the whole exception chain."""
    import traceback

    if id(exc) in seen:
        return
    seen.add(id(exc))
    frames = list(exc.stack)
    for index, frame in enumerate(frames):
        if _is_user_file(frame.filename):
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


def _compile(code: str, filename: str) -> CodeType | None:
    lines = code.splitlines(keepends=True)
    # Kept for the interpreter's lifetime: functions of an earlier run show their own lines.
    linecache.cache[filename] = (len(code), None, lines, filename)
    try:
        compiled: CodeType = compile(code, filename, "exec", flags=COMPILE_FLAGS, dont_inherit=True)
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


class MainNamespace:
    """The state runs share: the ``__main__`` namespace, the event loop, the bound servers."""

    def __init__(self) -> None:
        self.main = ModuleType("__main__")
        self.main.__dict__.update({"__builtins__": builtins, "__file__": USER_FILENAME})
        # Classes and functions the code defines pickle by reference to __main__ (multiprocessing).
        sys.modules["__main__"] = self.main
        self.runs = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bound: dict[str, str] = {}  # alias -> the stub directory its module came from

    @property
    def namespace(self) -> dict[str, Any]:
        return self.main.__dict__

    def run(self, code: str, servers: list[str] | None = None) -> tuple[int, str | None]:
        """Run ``code`` in the shared namespace; return (exit code, name of the uncaught exception or None).

        ``servers`` are the aliases of the downstream servers this run may call.
        """
        self.runs += 1
        filename = USER_FILENAME if self.runs == 1 else f"<main-{self.runs}>"
        compiled = _compile(code, filename)
        if compiled is None:
            return 1, "SyntaxError"
        sys.argv = [filename]
        try:
            self._bind_servers(servers or [])
            outcome = eval(compiled, self.namespace)
            if compiled.co_flags & _CO_COROUTINE:
                self._event_loop().run_until_complete(outcome)
        except SystemExit as exit_request:
            return _exit_code(exit_request), None
        except BaseException as error:
            _report(error)
            return 1, type(error).__name__
        return 0, None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import asyncio  # only for code that awaits: importing it is costly

            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop

    def _bind_servers(self, servers: list[str]) -> None:
        """``mcp`` and ``mcp_<alias>`` for this run's servers (their stubs are under /tools).

        Also the earlier bridge's names: ``mcp_servers`` (server name -> the same module) and
        ``LOADED_MCP_SERVERS`` (their names), empty when the run has no servers.
        """
        self.namespace["mcp_servers"] = {}
        self.namespace["LOADED_MCP_SERVERS"] = ()
        self.bind_library()
        if not servers and not self._bound:
            return
        import importlib

        importlib.invalidate_caches()  # /tools may have changed since the last run (sessions)
        for alias in [alias for alias in self._bound if alias not in servers]:
            del self._bound[alias]
            self.namespace.pop(f"mcp_{alias}", None)
        if not servers:
            return
        self.namespace["mcp"] = importlib.import_module("mcp")
        modules: dict[str, Any] = {}
        for alias in servers:
            where = os.path.realpath(f"{TOOLS_MOUNT}/{alias}")
            if self._bound.get(alias) != where:
                # Another version of the server's stubs than the one imported before: reload.
                name = f"mcp.servers.{alias}"
                for loaded in [key for key in sys.modules if key == name or key.startswith(name + ".")]:
                    del sys.modules[loaded]
            module = importlib.import_module(f"mcp.servers.{alias}")
            self.namespace[f"mcp_{alias}"] = module
            modules[getattr(module, "SERVER_NAME", alias)] = module
            self._bound[alias] = where
        self.namespace["mcp_servers"] = modules
        self.namespace["LOADED_MCP_SERVERS"] = tuple(modules)

    def bind_library(self) -> None:
        """``saved`` (a fresh view each run) and the library's functions, unless the code took the names."""
        from . import library

        names: dict[str, Any] = {name: getattr(library, name) for name in library.__all__ if name != "SavedTools"}
        names["saved"] = library.SavedTools()
        for name, value in names.items():
            current = self.namespace.get(name)
            if current is None or current is getattr(library, name, None) or isinstance(current, library.SavedTools):
                self.namespace[name] = value

    def close(self) -> None:
        """End the event loop as ``asyncio.run`` would: cancel what is left, then close it."""
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        import asyncio

        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException:  # the process is ending; its exit code is the last run's
            pass
        finally:
            loop.close()
