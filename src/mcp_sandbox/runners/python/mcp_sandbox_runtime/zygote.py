"""A warm interpreter that forks a fresh one for every run: the zygote of a warm sandbox.

``boot.py --zygote=numpy,pandas CHANNEL_FD``: the zygote imports the runner and the listed modules
once (``preload.py``), freezes them (``gc.freeze``), forks the next run's child before it is asked
for and says READY. The child reads the EXEC frame itself, reports the run's number (and, the
first time, the run's seccomp guard, which later children install before they wait) on a pipe
(``reports.py``), lets go of the channel, serves that one run on the EXEC's own socket with
descriptors of its own, and exits. The zygote never runs user code and cannot be inspected by a
child (not dumpable; ptrace refused by seccomp). It sends EXITED at once (exit code, 128 + signal),
restores the sandbox (``restore.py``), forks the next child and says READY again, or says in that
READY why it could not restore it (the host then throws the sandbox away). Every EXEC a zygote
serves is ``last``: a session's sandbox started ahead runs ``runner.py --ready`` instead.
"""

from __future__ import annotations

import _socket
import base64
import contextlib
import gc
import math
import os
import resource
import signal
import sys

from . import exec_server, host, kernel, preload, reports, restore
from .frames import DEFAULT_MAX_FRAME, Done, Error, Exec, Exited, Frame, FrameError, FrameParser, Ready, decode, pack
from .namespace import MainNamespace

__all__ = ["EXIT_DIRTY", "main"]

EXIT_DIRTY = 75  # the zygote could not restore the sandbox and stopped
_ENDING = -1  # in a run's child: the write end of its ending pipe
# In the zygote: its runs' seccomp guard (base64, as EXEC frames carry it), once a run's child
# reported it; each child forked after that installs it before its EXEC comes.
_GUARD: str | None = None


def _fresh_stdio(stdout: int | None, stderr: int | None, keep: list[int]) -> None:
    """Give this process descriptors of its own: 0 a fresh ``/dev/null``, 1 and 2 the run's pipes.

    Every other descriptor the zygote held is closed, but ``keep`` (the run's). Without pipes
    (a child waiting for its EXEC) 0 is set and the rest closed; 1 and 2 stay for now.
    """
    others = [int(name) for name in os.listdir("/proc/self/fd") if int(name) > 2 and int(name) not in keep]
    for fd in others:
        try:
            os.close(fd)
        except OSError:  # the listing's own descriptor, closed already
            continue
    if stdout is None or stderr is None:
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)
        return
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)


class _Control:
    """The zygote's end of the channel: blocking, single-threaded (a fork must not meet a thread)."""

    def __init__(self, fd: int) -> None:
        self.sock = _socket.socket(fileno=fd)
        self._parser = FrameParser(DEFAULT_MAX_FRAME)
        self._fds: list[int] = []

    def send(self, frame: Frame) -> None:
        self.sock.sendall(pack(frame))

    def receive(self) -> tuple[Frame, list[int]] | None:
        """The next frame and the descriptors that came with it; None when the host hung up."""
        while (frame := self._parser.next()) is None:
            data, ancillary, flags, _ = self.sock.recvmsg(1 << 16, _socket.CMSG_SPACE(8 * 4), _socket.MSG_CMSG_CLOEXEC)
            self._fds.extend(host.fds_of(ancillary))
            if flags & _socket.MSG_CTRUNC:
                raise FrameError("the host sent more descriptors than a frame may carry")
            if not data:
                self._parser.check_end()
                return None
            self._parser.feed(data)
        fds, self._fds = self._fds, []
        try:
            return decode(*frame), fds
        except FrameError:
            host.close_fds(fds)
            raise


def _prefork(control: _Control) -> tuple[int, int, int]:
    """Fork the child for the next run before its EXEC comes: (its pid, its report pipe, its ending pipe).

    The child waits for the EXEC frame on the control channel itself (the zygote does not read
    it while a child is waiting), so a run costs no fork. It reports the run's number on the
    report pipe before it lets go of the channel, and closes the ending pipe as its last act
    (see :func:`.reports.ending`); it never returns here.
    """
    global _ENDING
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    ending_read, ending_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid != 0:
        os.close(report_write)
        os.close(ending_write)
        return pid, report_read, ending_read
    os.close(report_read)
    os.close(ending_read)
    _ENDING = ending_write
    try:
        code = _waiting_child(control, report_write, _GUARD)
    except BaseException:  # nothing of a waiting child may reach the zygote's code
        code = exec_server.EXIT_PROTOCOL
    _exit(code)
    return code, -1, -1  # not reached


def _waiting_child(control: _Control, report: int, guard: str | None) -> int:
    """A pre-forked child: wait for the EXEC frame, then serve that one run and exit with its code.

    ``guard``: the runs' seccomp guard as the zygote learned it from an earlier run, installed
    now rather than once the EXEC has come (the EXEC's guard is installed too if it differs).
    """
    _fresh_stdio(None, None, keep=[control.sock.fileno(), report, _ENDING])
    if guard is not None:
        try:
            kernel.install_guard(base64.b64decode(guard))
        except (OSError, ValueError):  # the EXEC's guard is installed instead
            guard = None
    os.setpgid(0, 0)  # a group of its own: kill(0) in the run reaches the run's processes only
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # `random` reseeds itself after a fork; numpy's global generator does not
    namespace = exec_server.prepare_single()
    _rehearse()
    try:
        command = control.receive()
    except (OSError, FrameError):
        reports.send(report, reports.BROKEN)
        return exec_server.EXIT_PROTOCOL
    if command is None:
        reports.send(report, reports.HUNG_UP)
        return 0
    frame, fds = command
    accepted = exec_server.accept_exec(frame, fds, descriptors=3)
    if isinstance(accepted, Exec) and (not accepted.last or accepted.state is not None):
        accepted = "a zygote serves one run per child, never a fork's first: its EXEC must be the last"
    if isinstance(accepted, str):
        host.close_fds(fds)
        with contextlib.suppress(OSError):
            control.send(Error(accepted))
        reports.send(report, reports.REFUSED)
        return exec_server.EXIT_PROTOCOL
    # Before any code of the run: the zygote installs this guard in the children it forks next.
    reports.send(report, reports.RUNNING, accepted.run, (accepted.guard or "") if guard is None else "")
    control.sock.close()  # the run never holds the zygote's channel
    return _child(accepted, fds, namespace, guard)


def _rehearse() -> None:
    """Decode an EXEC frame and encode a DONE one, on throwaway objects, before the run's EXEC comes.

    A forked child shares the zygote's memory until it writes to it; the first write to each
    page (a reference count, an allocator's free list) costs a copy-on-write fault, and
    receiving a run's EXEC takes many of them. Taken now, they are off the run's
    path. Nothing of this is kept (see also :func:`.exec_server.prepare_single`).
    """
    parser = FrameParser(DEFAULT_MAX_FRAME)
    parser.feed(pack(Exec(0, "pass", ("alias",), {"NAME": "value"}, 1, 1, True, 1, "AAAA", 1, 1)))
    frame = parser.next()
    if frame is not None:
        exec_server.accept_exec(decode(*frame), [], descriptors=3)
    host.fds_of([])
    pack(Done(0, 0, None))


def _child(frame: Exec, fds: list[int], namespace: MainNamespace, installed: str | None) -> int:
    """The forked child, its EXEC received: serve this one run on its own socket, then exit with its code.

    ``installed``: the guard this child installed before its EXEC came; the EXEC's own is
    installed unless it is that one.
    """
    # Nothing of the zygote's is open any more (see _waiting_child): the run's pipes go on 1 and 2.
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    if frame.guard is None or frame.guard != installed:
        try:
            kernel.install_guard(base64.b64decode(frame.guard or ""))
        except (OSError, ValueError) as error:
            os.write(2, f"mcp-sandbox: cannot install the run's seccomp guard: {error}\n".encode())
            os._exit(exec_server.EXIT_PROTOCOL)
    # Like any process: the run's own /proc files are its own (the zygote's stay closed to it).
    kernel.prctl(kernel.PR_SET_DUMPABLE, 1)
    cpu_seconds = frame.cpu_seconds or 0
    if cpu_seconds > 0:
        # RLIMIT_CPU counts this process's life: what it spent waiting (its rehearsal) is not the run's.
        spent = resource.getrusage(resource.RUSAGE_SELF)
        wanted = cpu_seconds + math.ceil(spent.ru_utime + spent.ru_stime)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard == resource.RLIM_INFINITY or hard > wanted:
            hard = wanted
        resource.setrlimit(resource.RLIMIT_CPU, (max(hard - 1, 1), hard))
    connection = host.connect(fds[2])
    os.close(fds[2])
    server = exec_server.Server(connection, namespace=namespace, single=True)
    done = Done(frame.run, exec_server.EXIT_PROTOCOL, None)
    try:
        done = server.run(frame, fds[:2])
        server.namespace.close()
    finally:
        _exit(done.exit_code, connection, done)
    return done.exit_code  # not reached


def _exit(code: int, connection: host.HostConnection | None = None, done: Done | None = None) -> None:
    """Exit as ``sys.exit`` would, but without tearing down every preloaded module (slow for pandas).

    What a program may rely on at exit still happens: non-daemon threads are waited for, atexit
    handlers run, the standard streams are flushed. Then a run's child lets go of its output
    pipes (so the host sees their end before the kernel has torn the process down, which takes
    a while with large modules mapped) and sends ``done`` on ``connection``: what the code printed from a thread
    or an atexit handler is the run's. The host still judges the run by the zygote's EXITED.
    """
    import atexit
    import threading

    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
    except BaseException:  # the exit code is the run's whatever a handler did
        pass
    if connection is not None and done is not None:
        try:
            # Every copy of the run's pipes this process holds (the runtime's, the code's) goes now.
            _fresh_stdio(None, None, keep=[connection.fileno(), _ENDING])
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            if connection.failed:
                done = Done(done.run, exec_server.EXIT_PROTOCOL, done.exception)
            connection.send(done)
            code = done.exit_code
        except BaseException:  # the channel broke: the host goes by the zygote's EXITED
            code = exec_server.EXIT_PROTOCOL
    if _ENDING >= 0:
        with contextlib.suppress(OSError):
            # The code may have made this process not dumpable, which hides its exit status
            # from the zygote (see reports.ending): the runtime's last act makes it inspectable again.
            kernel.prctl(kernel.PR_SET_DUMPABLE, 1)
        os.write(_ENDING, b".")  # the zygote looks now, and sees this process exiting
    os._exit(code)


def main(channel_fd: int, modules: list[str]) -> int:
    """Fork the first run's child, announce READY; per run EXITED, restore, fork the next, READY.

    Returns the zygote's exit code when the host hangs up (every child exits on its own).
    """
    global _GUARD
    control = _Control(channel_fd)
    kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    kernel.prctl(kernel.PR_SET_CHILD_SUBREAPER, 1)
    exec_server.prepare_process()
    loaded, failed = preload.preload(modules)
    preload.exercise(loaded)
    import asyncio  # noqa: F401  (top-level await in a run would import it, at a cost)

    from . import library  # noqa: F401  (every run binds its names: imported once here, not per child)

    kernel.program_type()  # defined here once, not in every run's child

    threads = len(os.listdir("/proc/self/task"))
    baseline = restore.fingerprint()
    mounts = restore.mount_points()
    directories = restore.wiped_directories()
    gc.collect()
    gc.freeze()  # kept frozen in the children too: a collection there would copy every page it touches
    # The heap the imports freed goes back to the kernel: less PSS per preloading sandbox (about
    # the memory its waiting child's rehearsal costs), and a child's allocation there then
    # takes a zero page instead of copying one.
    with contextlib.suppress(AttributeError):  # glibc's; another libc keeps the heap as it is
        kernel.libc().malloc_trim(0)
    # A fork copies only the forking thread: whatever the others held stays held.
    problem = f"the preloaded modules started {threads - 1} threads; cannot fork safely" if threads != 1 else None
    version = sys.version.split()[0]
    ready = Ready("python", version, None, True, os.getpid(), tuple(loaded), failed, problem)
    if threads != 1:
        control.send(ready)
        return EXIT_DIRTY
    try:
        child, report, ending = _prefork(control)
        control.send(ready)
        while True:
            kind, run_id, guard = reports.receive(report)
            if kind == reports.RUNNING and guard and _GUARD is None:
                _GUARD = guard
            if kind != reports.RUNNING:
                os.close(ending)
                os.waitpid(child, 0)
                return 0 if kind == reports.HUNG_UP else exec_server.EXIT_PROTOCOL
            # The run's end goes out first (as soon as the child is exiting); the rest of its
            # exit and the restore happen while the host answers its caller, and the next
            # READY says the sandbox may serve again.
            exit_code = reports.ending(child, ending)
            if exit_code is not None:
                control.send(Exited(run_id, exit_code, None))
                os.kill(child, signal.SIGKILL)  # a thread of the run that outlives its main thread
            _, status = os.waitpid(child, 0)
            if exit_code is None:
                control.send(Exited(run_id, reports.exit_code(status), None))
            problem = restore.restore(baseline, mounts, directories)
            if problem is None:
                child, report, ending = _prefork(control)
            control.send(Ready("python", version, None, True, os.getpid(), None, None, problem))
            if problem is not None:
                return EXIT_DIRTY
    except (OSError, FrameError):  # the channel broke
        return exec_server.EXIT_PROTOCOL
