"""One run inside the sandbox: its interpreter state, its stdio, its EXEC frame served to DONE.

Shared by the runner (``runner.py``, which serves EXEC frames one after another in one process)
and the zygote (``zygote.py``, which forks a child per EXEC frame); neither imports the other.

For each run: its stdout/stderr are the two pipes attached to the EXEC frame (dup'ed onto fds
1 and 2, so subprocesses write there too, and restored afterwards, which ends the pipes unless a
background process still holds them); its environment is the process's plus the frame's
``env`` (restored afterwards); ``mcp_<alias>`` names are bound for its servers. DONE reports the
run's exit code: ``sys.exit(n)`` gives ``n``, an uncaught exception 1. Tracebacks show the
user's frames only.
"""

from __future__ import annotations

import builtins
import faulthandler
import linecache
import os
import signal
import sys
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from . import TOOLS_MOUNT, display, host, relay
from .frames import Done, Exec, Frame
from .host import close_fds

__all__ = [
    "EXIT_PROTOCOL",
    "USER_FILENAME",
    "Interpreter",
    "Server",
    "accept_exec",
    "prepare_process",
    "prepare_single",
]

if TYPE_CHECKING:
    import asyncio
    import traceback

USER_FILENAME = "<main>"
# ast.PyCF_ALLOW_TOP_LEVEL_AWAIT and inspect.CO_COROUTINE, spelled out: importing `ast` and
# `inspect` costs more than the rest of the runner's start-up together.
_PYCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
_CO_COROUTINE = 0x0080
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
EXIT_PROTOCOL = 76


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
        compiled: CodeType = compile(code, filename, "exec", flags=_PYCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
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


def _flush(*streams: Any) -> None:
    for stream in streams:
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _own_fd(fd: int) -> int:
    """A private duplicate of the process's own ``fd`` (``/dev/null`` if it is closed)."""
    try:
        return os.dup(fd)
    except OSError:
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


class _Stdio:
    """Points fds 1 and 2 (and ``sys.stdout``/``sys.stderr``) at one run's pipes, and back."""

    def __init__(self) -> None:
        self._own = (_own_fd(1), _own_fd(2))
        self._own_streams: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)
        self._run_streams: tuple[TextIO, TextIO] | None = None

    def attach(self, stdout_fd: int, stderr_fd: int) -> None:
        _flush(sys.stdout, sys.stderr)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        close_fds([stdout_fd, stderr_fd])
        # New wrappers each run: code may have closed or replaced the previous ones.
        out = open(1, "w", encoding="utf-8", errors="strict", closefd=False)
        err = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
        self._run_streams = (out, err)
        sys.stdout, sys.stderr = out, err

    def detach(self) -> None:
        """Flush the run's output and give fds 1 and 2 back to the process: the run's pipes end here."""
        _flush(sys.stdout, sys.stderr, *(self._run_streams or ()))
        os.dup2(self._own[0], 1)
        os.dup2(self._own[1], 2)
        sys.stdout, sys.stderr = self._own_streams
        self._run_streams = None


class Interpreter:
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
            import asyncio  # only for code that awaits: importing it costs ~25 ms

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
        self._bind_library()
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

    def _bind_library(self) -> None:
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


def accept_exec(frame: Frame, fds: list[int], *, descriptors: int = 2) -> Exec | str:
    """``frame`` if it is an EXEC frame with the descriptors it should carry; else why not.

    A runner's EXEC frame carries the run's stdout and stderr pipes (or nothing: the process's
    own); a zygote's carries those and the run's own channel socket (``descriptors`` = 3).
    """
    if not isinstance(frame, Exec):
        return f"expected an EXEC frame, got {frame.KIND.name}"
    if len(fds) != descriptors and (descriptors != 2 or fds):
        return f"an EXEC frame here carries {descriptors} descriptors, not {len(fds)}"
    return frame


class Server:
    """Serves EXEC frames on the connection with one interpreter.

    ``single``: a zygote's child, made ready before its EXEC came (``interpreter`` made and the
    import caches invalidated then, see :func:`prepare_single`), which serves one run and exits:
    its environment is not restored after the run.
    """

    def __init__(
        self, connection: host.HostConnection, *, interpreter: Interpreter | None = None, single: bool = False
    ) -> None:
        self.connection = connection
        self.interpreter = interpreter or Interpreter()
        self.stdio = _Stdio()
        self._single = single

    def serve(self, frame: Exec, fds: list[int]) -> int:
        """Run one EXEC frame's code with its pipes, environment and servers; send DONE."""
        done = self.run(frame, fds)
        self.connection.send(done)
        return done.exit_code

    def run(self, frame: Exec, fds: list[int]) -> Done:
        """Run one EXEC frame's code with its pipes, environment and servers; the DONE frame to send."""
        saved_env = None if self._single else dict(os.environ)  # a single run's is never restored
        self.connection.max_call_bytes = frame.max_call_bytes
        if frame.file_size is not None:
            _limit_file_size(frame.file_size, for_good=frame.last)
        if fds:
            self.stdio.attach(fds[0], fds[1])
        display.begin(frame.run, frame.max_images, frame.max_image_bytes)
        try:
            os.environ.update(frame.env)
            if not self._single:
                relay.add_packages()
            exit_code, exception = self.interpreter.run(frame.code, list(frame.servers))
        finally:
            display.end()
            if saved_env is not None:
                # Restored, not kept: a session does not carry one run's secrets into the next.
                os.environ.clear()
                os.environ.update(saved_env)
            if fds:
                self.stdio.detach()
            else:
                _flush(sys.stdout, sys.stderr)
        return Done(frame.run, exit_code, exception)


# What prepare_single() compiles: a line of common constructs, so the compiler's pages are copied
# (a longer program copies more of them: ~0.6 MiB more per waiting child for ~0.1 ms less per run).
_REHEARSAL = "import os\nprint(os.sep, [i * 2 for i in range(3)], {'k': (1, 2.0)}, f'{os!r}')\n"
_REHEARSAL_VARIABLE = "MCP_SANDBOX_REHEARSAL"


def prepare_single() -> Interpreter:
    """What a zygote's child does before its EXEC comes, off the run's path: the run's interpreter
    state, and :func:`relay.add_packages` (as every run does first). The child is this run's only,
    so doing it earlier changes nothing the code can see; its copy-on-write page faults happen now.

    The steps every run takes before its code (its output streams, the library's names, the
    compiler) are taken once on throwaway objects, for the same reason: the pages they write
    are copied now, not while the run waits (~2 µs a page, a couple of hundred pages).
    """
    relay.add_packages()
    interpreter = Interpreter()
    interpreter._bind_library()
    for fd in (1, 2):
        open(fd, "w", encoding="utf-8", errors="strict", closefd=False)  # never written to
    compile(_REHEARSAL, "<rehearsal>", "exec", flags=_PYCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    display.begin(0, 0, 0)
    display.end()
    os.environ[_REHEARSAL_VARIABLE] = "1"  # the run's variables are set the same way
    del os.environ[_REHEARSAL_VARIABLE]
    return interpreter


def _cpu_limit_signals_first() -> None:
    """Lower the soft CPU limit one second below the hard one.

    With soft == hard the kernel ends the process with SIGKILL, which the host cannot tell from
    any other kill; a lower soft limit ends it with SIGXCPU first, so the host can say why.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY and hard >= 2 and (soft == resource.RLIM_INFINITY or soft >= hard):
        resource.setrlimit(resource.RLIMIT_CPU, (hard - 1, hard))


def _limit_file_size(size: int, *, for_good: bool) -> None:
    """Lower RLIMIT_FSIZE to ``size`` for this run: the hard limit too when no run follows.

    A session's interpreter serves later runs that may be given more (files removed meanwhile),
    and a hard limit cannot be raised again: there only the soft one is lowered (the session's
    sandbox starts with a hard limit no larger than the conversation's quota).
    """
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY:
        size = min(size, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size if for_good else hard))


def _end_for_file_size(signum: int, _frame: object) -> None:
    os._exit(128 + signum)


def prepare_process() -> None:
    """What every runner process sets up once, before its first run."""
    faulthandler.enable()  # a crash of the interpreter still leaves a trace on stderr
    # Python ignores SIGXFSZ (a write past RLIMIT_FSIZE then fails with EFBIG, which code can
    # catch and go on writing other files); the default action ends the run, and the host
    # says which limit it hit, as other runtimes' processes are ended. A container's first
    # process is its PID namespace's init, which the kernel spares from default actions: there
    # a handler ends it the same way, at the interpreter's next instruction.
    if os.getpid() == 1:
        signal.signal(signal.SIGXFSZ, _end_for_file_size)
    else:
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    _cpu_limit_signals_first()
    display.install()
