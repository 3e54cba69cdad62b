"""Serving EXEC frames inside the sandbox: one run's stdio, environment, limits, and its DONE.

Shared by the runner (``runner.py``, which serves EXEC frames one after another in one process)
and the zygote (``zygote.py``, which forks a child per EXEC frame); neither imports the other.

For each run: its stdout/stderr are the two pipes attached to the EXEC frame (dup'ed onto fds
1 and 2, so subprocesses write there too, and restored afterwards, which ends the pipes unless a
background process still holds them); its environment is the process's plus the frame's
``env`` (restored afterwards); its code runs in the :class:`~.namespace.MainNamespace`. DONE
reports the run's exit code: ``sys.exit(n)`` gives ``n``, an uncaught exception 1.

A fork's (or a resumed session's) first run loads its state before the code. A resumed session's
EXEC says ``verdict``: the host checks the state's seal while this side reads (or maps) it, and
nothing of it is loaded, nor any code run, until the host's VERDICT for the run says it held; any
other answer (refused, the channel's end, another frame) ends the process at once
(:data:`EXIT_REFUSED`), nothing loaded; the host discards the sandbox.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import Any, TextIO

from . import display, host, relay
from .frames import Done, Error, Exec, Forked, Frame, Verdict
from .host import close_fds
from .namespace import COMPILE_FLAGS, MainNamespace

__all__ = [
    "EXIT_PROTOCOL",
    "EXIT_REFUSED",
    "Server",
    "accept_exec",
    "prepare_process",
    "prepare_single",
    "serve_until_last",
]

EXIT_PROTOCOL = 76
EXIT_REFUSED = 77  # the host refused the state this run was to load (its seal failed), or never said


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


def serve_until_last(server: Server) -> int:
    """Serve EXEC frames on ``server``'s connection until the host hangs up or a ``last`` one was
    served; the last run's exit code, else :data:`EXIT_PROTOCOL`.

    The runner of a fresh run or a session serves this way (a session's started ahead too). The
    namespace is closed on the way out.
    """
    connection = server.connection
    exit_code: int | None = None
    try:
        last = False
        while not last and (command := connection.next_command()) is not None:
            frame, fds = command
            accepted = accept_exec(frame, fds)
            if isinstance(accepted, str):
                close_fds(fds)
                connection.send(Error(accepted))
                return EXIT_PROTOCOL
            exit_code, last = server.serve(accepted, fds), accepted.last
    except OSError:  # the channel broke while we wrote to it
        return EXIT_PROTOCOL
    finally:
        server.namespace.close()
    return EXIT_PROTOCOL if connection.failed or exit_code is None else exit_code


def accept_exec(frame: Frame, fds: list[int], *, descriptors: int = 2) -> Exec | str:
    """``frame`` if it is an EXEC frame with the descriptors it should carry; else why not.

    A runner's EXEC frame carries the run's stdout and stderr pipes (or nothing: the process's
    own), and a fork's first one the file of its variables after them; a zygote's carries the
    pipes and the run's own channel socket (``descriptors`` = 3).
    """
    if not isinstance(frame, Exec):
        return f"expected an EXEC frame, got {frame.KIND.name}"
    carried = frame.state is not None
    expected = descriptors + carried
    if len(fds) != expected and (descriptors != 2 or carried or fds):
        return f"an EXEC frame here carries {expected} descriptors, not {len(fds)}"
    return frame


class Server:
    """Serves EXEC frames on the connection in one :class:`MainNamespace`.

    ``single``: a zygote's child, made ready before its EXEC came (``namespace`` made and the
    workspace's packages put on ``sys.path`` then, see :func:`prepare_single`), which serves one run and exits:
    its environment is not restored after the run.
    """

    def __init__(
        self, connection: host.HostConnection, *, namespace: MainNamespace | None = None, single: bool = False
    ) -> None:
        self.connection = connection
        self.namespace = namespace or MainNamespace()
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
        state = fds[2] if frame.state is not None else None
        if fds:
            self.stdio.attach(fds[0], fds[1])
        display.begin(frame.run, frame.max_images, frame.max_image_bytes)
        forked: Forked | None = None
        try:
            os.environ.update(frame.env)
            if not self._single:
                relay.add_packages()
            if frame.snapshot is not None:  # a fork's source: its variables, not a run of code
                return Done(frame.run, self._snapshot(frame.snapshot), None)
            if state is not None and frame.state is not None:
                fd, state = state, None
                forked = self._load(fd, frame, frame.state)
            exit_code, exception = self.namespace.run(frame.code, list(frame.servers))
        finally:
            if state is not None:
                close_fds([state])
            display.end()
            if saved_env is not None:
                # Restored, not kept: a session does not carry one run's secrets into the next.
                os.environ.clear()
                os.environ.update(saved_env)
            if fds:
                self.stdio.detach()
            else:
                _flush(sys.stdout, sys.stderr)
        return Done(frame.run, exit_code, exception, forked)

    def _await_verdict(self, run: int) -> None:
        """Return once the host's VERDICT says run ``run``'s state held; else end the process now."""
        command = self.connection.next_command()
        if command is not None:
            close_fds(command[1])
            verdict = command[0]
            if isinstance(verdict, Verdict) and verdict.run == run and verdict.ok:
                return
            if not isinstance(verdict, Verdict) or verdict.run != run:
                try:
                    self.connection.send(Error(f"expected the VERDICT of run {run}, got {verdict.KIND.name}"))
                except OSError:
                    pass
        os._exit(EXIT_REFUSED)  # nothing of the state was loaded, nor any code run

    def _snapshot(self, budget: int) -> int:
        """Write this session's variables to the run's stdout as a fork's state (see ``fork.py``)."""
        from . import fork, library

        pieces = fork.dump(self.namespace.namespace, budget, frozenset(library.__all__))
        _flush(sys.stdout)  # what a thread wrote first goes before the dump, not into it
        for piece in pieces:
            view = memoryview(piece)
            while view:
                view = view[os.write(1, view) :]
        return 0

    def _load(self, state: int, frame: Exec, size: int) -> Forked:
        """Load a fork's state, the first ``size`` bytes of the file ``state`` (closed here, before
        anything of it is unpickled), into the namespace before its first run's code; its large
        buffers mapped with ``frame.mapped`` (see ``snapshot.py``); with ``frame.verdict``, once the
        host's VERDICT says its seal held (else the process ends here, see the module's docstring)."""
        from . import fork, snapshot

        read: snapshot.Unpacked | OSError | ValueError | MemoryError
        try:
            read = snapshot.read(state, size, mapped=frame.mapped)
        except (OSError, ValueError, MemoryError) as exc:
            read = exc
        finally:
            close_fds([state])
        if frame.verdict:
            self._await_verdict(frame.run)
        if isinstance(read, BaseException):
            return Forked(0, 0, (f"all variables ({type(read).__name__}: {read})"[:120],))
        report = fork.load(read, self.namespace.namespace)
        return Forked(report["variables"], report["modules"], tuple(report["skipped"]))


# What prepare_single() compiles: a line of common constructs, so the compiler's pages are copied
# (a longer program copies more of them: more memory per waiting child for little less per run).
_REHEARSAL = "import os\nprint(os.sep, [i * 2 for i in range(3)], {'k': (1, 2.0)}, f'{os!r}')\n"
_REHEARSAL_VARIABLE = "MCP_SANDBOX_REHEARSAL"


def prepare_single() -> MainNamespace:
    """What a zygote's child does before its EXEC comes, off the run's path: the run's interpreter
    state, and :func:`relay.add_packages` (as every run does first). The child is this run's only,
    so doing it earlier changes nothing the code can see; its copy-on-write page faults happen now.
    A session-ready runner does it before its session's first EXEC, for the same reason.

    The steps every run takes before its code (its output streams, the library's names, the
    compiler) are taken once on throwaway objects, for the same reason: the pages they write
    are copied now, not while the run waits.
    """
    relay.add_packages(invalidate=False)  # this process imported nothing from there yet
    namespace = MainNamespace()
    namespace.bind_library()
    for fd in (1, 2):
        open(fd, "w", encoding="utf-8", errors="strict", closefd=False)  # never written to
    compile(_REHEARSAL, "<rehearsal>", "exec", flags=COMPILE_FLAGS, dont_inherit=True)
    display.begin(0, 0, 0)
    display.end()
    os.environ[_REHEARSAL_VARIABLE] = "1"  # the run's variables are set the same way
    del os.environ[_REHEARSAL_VARIABLE]
    return namespace


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
