"""A warm interpreter that forks a fresh one for every run: the zygote of a warm sandbox.

``boot.py --zygote=numpy,pandas CHANNEL_FD``: the zygote imports the runner and the listed
modules once, exercises those it knows (``_EXERCISES``), freezes what it imported
(``gc.freeze``, so children do not dirty those pages), forks the child for the first run,
announces READY and waits for that child. The child (forked before its run is asked for, so a
run costs no fork) reads the EXEC frame from the channel itself, tells the zygote the run's
number on a pipe, lets go of the channel and serves that one run and exits; the zygote does not
read the channel while a child waits. The zygote itself never runs user code. A run's seccomp
guard (the filter that keeps it off the zygote) comes with its EXEC; the first run's child also
passes it to the zygote on that pipe, before any code of the run, and every child forked after
that installs it before it waits, with what every run does first (see ``_rehearse``): the
copy-on-write faults and the filter's cost are off the path. A run's frames (CALL, REPLY,
DISPLAY, DONE) travel on a socket of its own, the third descriptor of its EXEC frame, so a child
can neither read nor forge what the zygote tells the host.

After the child exits the zygote reports it (EXITED) at once, then restores the sandbox to the
state it had before the run, forks the next child and says READY again, or says in that READY
why it could not restore it (the host then throws the sandbox away). The host answers its
caller on EXITED and offers the sandbox again only on the READY: the restore and the next fork
happen off every run's critical path. Restoring means:

- every other process in the sandbox's pid namespace is killed and reaped (the zygote is a
  child subreaper, so orphans of the run are its children);
- ``/tmp``, ``/dev/shm`` and ``/workspace`` are emptied, their extended attributes removed and
  their modes given back (their owners checked); System V IPC objects are removed (POSIX
  message queues are refused by the seccomp filter, as they could not be found here);
- its own resource limits, nice value, scheduling policy, I/O priority and CPU affinity, which
  a child of the same uid could change (``prlimit``, ``setpriority``, ``sched_setscheduler``,
  ``ioprio_set``; the run's seccomp guard refuses all but the first), are checked against the
  ones it started with.

A child starts with descriptors of its own: ``/dev/null`` opened afresh on 0, its run's pipes on
1 and 2 (so flags or a pipe size a run sets on them die with it), and nothing else of the zygote's.

The zygote is not dumpable (``PR_SET_DUMPABLE`` 0), so a child cannot open its
``/proc/<pid>/mem`` or file descriptors; ptrace and process_vm_writev are refused by seccomp.
It reports each run with an EXITED frame: the child's exit code (128 + signal when a signal
ended it); then READY (``problem``: why the sandbox could not be restored).
"""

from __future__ import annotations

import _socket
import base64
import contextlib
import functools
import gc
import math
import os
import re
import resource
import select
import shutil
import signal
import stat
import struct
import sys
import time
from typing import Any

from . import host, run
from .frames import DEFAULT_MAX_FRAME, Done, Error, Exec, Exited, Frame, FrameError, FrameParser, Ready, decode, pack

__all__ = ["EXIT_DIRTY", "main"]

EXIT_DIRTY = 75  # the zygote could not restore the sandbox and stopped
# What a pre-forked child tells the zygote before it lets go of the channel: status, run number.
_REPORT = struct.Struct("=iQ")
_RUNNING, _HUNG_UP, _REFUSED, _BROKEN = range(4)
_PF_EXITING = 0x4
_ENDING_SECONDS = 0.05  # how long a child that let go of its ending pipe may take to be seen exiting
_ENDING = -1  # in a run's child: the write end of its ending pipe
# In the zygote: its runs' seccomp guard (base64, as EXEC frames carry it), once a run's child
# reported it; each child forked after that installs it before its EXEC comes.
_GUARD: str | None = None
_WIPED = ("/tmp", "/dev/shm", "/workspace")
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_IPC_RMID = 0
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine, -1)
_IOPRIO_WHO_PROCESS = 1
_RLIMITS = tuple(
    getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_") and name != "RLIMIT_NLIMITS"
)


@functools.cache
def _libc() -> Any:
    """libc through ctypes, loaded once in the zygote (its children inherit it: no dlopen per run)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    import ctypes

    if _libc().prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


@functools.cache
def _program_type() -> Any:
    """``struct sock_fprog``, defined once in the zygote."""
    import ctypes

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    return _Program


def _preload(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    """Import ``modules``; (the ones imported, {module: why not} for the others)."""
    import importlib

    loaded: list[str] = []
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as error:  # a broken module must not take the zygote down
            failed[name] = f"{type(error).__name__}: {error}"
        else:
            loaded.append(name)
    return loaded, failed


# What the zygote does once with each preloaded module it knows, so that what a run's first use
# would do lazily (a submodule imported, a cache filled, a repr's formatting set up) is the
# zygote's, shared by every child: a pandas run's first DataFrame costs ~0.4 ms less, its first
# repr ~1.2 ms less. Only computations that leave no state a run could see, start no thread (no
# BLAS) and touch no file. Each path taken maps more of the modules' compiled code (these ~1.5 MiB
# of page cache, shared by every sandbox that maps it), so rarer paths are left to the runs.
_EXERCISES = {
    "numpy": """
import numpy as np
a = np.arange(12, dtype=float).reshape(3, 4)
b = np.array([[1, 2], [3, 4]]) * 2 + 1
repr(a), str(b), float(a.sum()), a.mean(axis=0), a.std(), a[a > 3], np.linspace(0, 1, 5).astype(int)
""",
    "pandas": """
import pandas as pd
df = pd.DataFrame({"a": range(6), "b": list("xyzxyz"), "c": [0.5 * i for i in range(6)]})
repr(df), str(df.head()), df["a"].sum(), df[df.a > 2]
""",
}


def _exercise(modules: list[str]) -> None:
    """Run the exercise of each of ``modules`` that has one (see ``_EXERCISES``); one that fails is skipped."""
    for name in modules:
        if (exercise := _EXERCISES.get(name)) is not None:
            with contextlib.suppress(Exception):
                exec(compile(exercise, f"<exercise {name}>", "exec"), {})


def _install_guard(bpf: bytes) -> None:
    """Stack the host's guard filter (``zygote_guard_bpf``) on this process: it keeps the run off the zygote."""
    import ctypes

    if not bpf or len(bpf) % 8:
        raise ValueError("the guard filter is not a BPF program")

    code = ctypes.create_string_buffer(bpf, len(bpf))
    program = _program_type()(len(bpf) // 8, ctypes.cast(code, ctypes.c_void_p))
    if _libc().prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _ioprio() -> int:
    """This process's I/O priority (ioprio_get; -1 where the call is unknown)."""
    return int(_libc().syscall(_SYS_IOPRIO_GET, _IOPRIO_WHO_PROCESS, 0))


def _fingerprint() -> tuple[Any, ...]:
    """What a child of the same uid could change about the zygote from outside."""
    return (
        tuple(resource.getrlimit(limit) for limit in _RLIMITS),
        os.getpriority(os.PRIO_PROCESS, 0),
        frozenset(os.sched_getaffinity(0)),
        os.sched_getscheduler(0),
        os.sched_getparam(0).sched_priority,
        _ioprio(),
    )


def _directories() -> dict[str, tuple[int, int, int]]:
    """(mode, uid, gid) of each wiped directory, as the sandbox made it."""
    found = {}
    for directory in _WIPED:
        try:
            info = os.stat(directory, follow_symlinks=False)
        except FileNotFoundError:
            continue
        found[directory] = (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
    return found


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


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _reap_all() -> str | None:
    """Kill every process of the sandbox but this one (and its init), and reap them."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    try:
        os.kill(-1, 0)
    except ProcessLookupError:
        return None
    return "a process of the run outlived it"


def _remove_entry(path: str) -> None:
    """Remove ``path`` (a tree), giving back the permissions the run may have taken from its directories."""

    def retry(function: Any, failed: str, _: Any) -> None:
        parent = os.path.dirname(failed)
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, stat.S_IRWXU)
            shutil.rmtree(failed)
        else:
            function(failed)

    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
        shutil.rmtree(path, onerror=retry)
    else:
        os.unlink(path)


def _mount_points() -> set[str]:
    """Where something is mounted in this sandbox (a runtime under the host's /tmp is bound inside /tmp)."""
    points: set[str] = set()
    with open("/proc/self/mountinfo") as table:
        for row in table:
            field = row.split()[4]
            points.add(re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field))
    return points


def _clear(directory: str, mounts: set[str], holders: set[str]) -> None:
    """Remove what ``directory`` holds, except mount points and the directories leading to them."""
    with os.scandir(directory) as entries:
        paths = [entry.path for entry in entries]
    for path in paths:
        if path in mounts:
            continue
        if path in holders:
            _clear(path, mounts, holders)
        else:
            _remove_entry(path)


def _wipe(mounts: set[str], directories: dict[str, tuple[int, int, int]]) -> str | None:
    holders = {parent for point in mounts for parent in _parents(point)}
    for directory, (mode, uid, gid) in directories.items():
        try:
            if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):  # the run took them away
                os.chmod(directory, stat.S_IRWXU | (os.stat(directory).st_mode & 0o7077))
            _clear(directory, mounts, holders)
            for name in os.listxattr(directory, follow_symlinks=False):  # a channel to the next run
                os.removexattr(directory, name, follow_symlinks=False)
            os.chmod(directory, mode, follow_symlinks=False)
            info = os.stat(directory, follow_symlinks=False)
        except (OSError, RecursionError) as error:
            return f"could not empty {directory}: {error}"
        if (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) != (mode, uid, gid):
            return f"{directory} changed its mode or owner"
    return None


def _parents(path: str) -> list[str]:
    parents = []
    while (parent := os.path.dirname(path)) != path:
        parents.append(parent)
        path = parent
    return parents


def _remove_ipc() -> str | None:
    """Remove the System V IPC objects a run left in the sandbox's IPC namespace."""
    leftovers: list[tuple[str, int]] = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        leftovers.extend((kind, int(row.split()[1])) for row in rows if row.strip())
    if not leftovers:
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for kind, ident in leftovers:
        if kind == "shm":
            done = libc.shmctl(ident, _IPC_RMID, None)
        elif kind == "msg":
            done = libc.msgctl(ident, _IPC_RMID, None)
        else:
            done = libc.semctl(ident, 0, _IPC_RMID)
        if done != 0:
            return f"could not remove System V {kind} {ident}: {os.strerror(ctypes.get_errno())}"
    return None


def _restore(baseline: tuple[Any, ...], mounts: set[str], directories: dict[str, tuple[int, int, int]]) -> str | None:
    """Bring the sandbox back to its state before the run; why not, if it cannot."""
    problem = _reap_all() or _wipe(mounts, directories) or _remove_ipc()
    if problem is None and _fingerprint() != baseline:
        problem = "the run changed the zygote's limits, priorities, scheduling or CPU affinity"
    return problem


def _prefork(control: _Control) -> tuple[int, int, int]:
    """Fork the child for the next run before its EXEC comes: (its pid, its report pipe, its ending pipe).

    The child waits for the EXEC frame on the control channel itself (the zygote does not read
    it while a child is waiting), so a run costs no fork. It reports the run's number on the
    report pipe before it lets go of the channel, and closes the ending pipe as its last act
    (see :func:`_ending`); it never returns here.
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
        code = run.EXIT_PROTOCOL
    _exit(code)
    return code, -1, -1  # not reached


def _report(fd: int, status: int, run_id: int = 0, guard: str = "") -> None:
    """Tell the zygote how the wait for an EXEC ended (and the run's guard, when it does not know it yet)."""
    os.write(fd, _REPORT.pack(status, run_id) + guard.encode("ascii"))
    os.close(fd)


def _waiting_child(control: _Control, report: int, guard: str | None) -> int:
    """A pre-forked child: wait for the EXEC frame, then serve that one run and exit with its code.

    ``guard``: the runs' seccomp guard as the zygote learned it from an earlier run, installed
    now rather than once the EXEC has come (the EXEC's guard is installed too if it differs).
    """
    _fresh_stdio(None, None, keep=[control.sock.fileno(), report, _ENDING])
    if guard is not None:
        try:
            _install_guard(base64.b64decode(guard))
        except (OSError, ValueError):  # the EXEC's guard is installed instead
            guard = None
    os.setpgid(0, 0)  # a group of its own: kill(0) in the run reaches the run's processes only
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # `random` reseeds itself after a fork; numpy's global generator does not
    interpreter = run.prepare_single()
    _rehearse()
    try:
        command = control.receive()
    except (OSError, FrameError):
        _report(report, _BROKEN)
        return run.EXIT_PROTOCOL
    if command is None:
        _report(report, _HUNG_UP)
        return 0
    frame, fds = command
    accepted = run.accept_exec(frame, fds, descriptors=3)
    if isinstance(accepted, str):
        host.close_fds(fds)
        with contextlib.suppress(OSError):
            control.send(Error(accepted))
        _report(report, _REFUSED)
        return run.EXIT_PROTOCOL
    # Before any code of the run: the zygote installs this guard in the children it forks next.
    _report(report, _RUNNING, accepted.run, (accepted.guard or "") if guard is None else "")
    control.sock.close()  # the run never holds the zygote's channel
    return _child(accepted, fds, interpreter, guard)


def _rehearse() -> None:
    """Decode an EXEC frame and encode a DONE one, on throwaway objects, before the run's EXEC comes.

    A forked child shares the zygote's memory until it writes to it; the first write to each
    page (a reference count, an allocator's free list) costs a copy-on-write fault, ~2 µs here,
    and receiving a run's EXEC takes about a hundred of them. Taken now, they are off the run's
    path. Nothing of this is kept (see also :func:`run.prepare_single`).
    """
    parser = FrameParser(DEFAULT_MAX_FRAME)
    parser.feed(pack(Exec(0, "pass", ("alias",), {"NAME": "value"}, 1, 1, True, 1, "AAAA", 1, 1)))
    frame = parser.next()
    if frame is not None:
        run.accept_exec(decode(*frame), [], descriptors=3)
    host.fds_of([])
    pack(Done(0, 0, None))


def _child(frame: Exec, fds: list[int], interpreter: run.Interpreter, installed: str | None) -> int:
    """The forked child, its EXEC received: serve this one run on its own socket, then exit with its code.

    ``installed``: the guard this child installed before its EXEC came; the EXEC's own is
    installed unless it is that one.
    """
    # Nothing of the zygote's is open any more (see _waiting_child): the run's pipes go on 1 and 2.
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    if frame.guard is None or frame.guard != installed:
        try:
            _install_guard(base64.b64decode(frame.guard or ""))
        except (OSError, ValueError) as error:
            os.write(2, f"mcp-sandbox: cannot install the run's seccomp guard: {error}\n".encode())
            os._exit(run.EXIT_PROTOCOL)
    # Like any process: the run's own /proc files are its own (the zygote's stay closed to it).
    _prctl(_PR_SET_DUMPABLE, 1)
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
    server = run.Server(connection, interpreter=interpreter, single=True)
    done = Done(frame.run, run.EXIT_PROTOCOL, None)
    try:
        done = server.run(frame, fds[:2])
        server.interpreter.close()
    finally:
        _exit(done.exit_code, connection, done)
    return done.exit_code  # not reached


def _ending(child: int, ending: int) -> int | None:
    """The exit code of ``child`` as soon as it is exiting, before the kernel has torn it down; None if not seen.

    The child writes to its ending pipe as its last act before ``_exit``; the code could write
    to it earlier, so the pipe only says when to look: the child's exit code is
    read from the kernel (``/proc/<pid>/stat``: exiting, its exit status set and its address
    space let go of, but not yet torn down, which takes milliseconds with pandas mapped).
    When the child is not that far within a moment, None: the zygote waits for it.

    The kernel shows the status only while the child is dumpable (else 0), so the runtime makes
    it dumpable again as its last act. A thread of the code that races to undo that in the
    instant between can make its run's status read as 0: the code misreporting its own exit,
    which ``os._exit(0)`` does anyway; nothing of the host's bounds depends on it.
    """
    try:
        pidfd = os.pidfd_open(child)
    except OSError:
        os.close(ending)
        return None
    try:
        # Processes the run left hold the pipe too: a byte says it, not the pipe's end. The
        # pidfd says the child is gone (died, or exited without the runtime's last act).
        poller = select.poll()
        poller.register(ending, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll()}
    finally:
        os.close(pidfd)
        os.close(ending)
    if pidfd in ready:
        return None
    deadline = time.monotonic() + _ENDING_SECONDS
    while True:
        try:
            with open(f"/proc/{child}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
        except OSError:
            return None
        # Field 9 is the flags, 52 the exit status, 26 the start of the code: 0 once the exiting
        # child has let go of its address space, which the kernel does after it set the exit
        # status and before it tears that space down.
        if int(fields[6]) & _PF_EXITING and len(fields) >= 50 and int(fields[23]) == 0:
            return _exit_code(int(fields[49]))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0001)


def _outcome(report: int) -> tuple[int, int, str]:
    """What a child reported before it ended: (status, run number, the run's guard or "");
    (_BROKEN, 0, "") if nothing. The child closes the pipe as soon as it has written."""
    data = b""
    try:
        while chunk := os.read(report, 1 << 16):
            data += chunk
    finally:
        os.close(report)
    if len(data) < _REPORT.size:
        return _BROKEN, 0, ""
    status, run_id = _REPORT.unpack_from(data)
    try:
        guard = data[_REPORT.size :].decode("ascii")
    except UnicodeDecodeError:
        guard = ""
    return status, run_id, guard


def _exit(code: int, connection: host.HostConnection | None = None, done: Done | None = None) -> None:
    """Exit as ``sys.exit`` would, but without tearing down every preloaded module (~80 ms for pandas).

    What a program may rely on at exit still happens: non-daemon threads are waited for, atexit
    handlers run, the standard streams are flushed. Then a run's child lets go of its output
    pipes (so the host sees their end before the kernel has torn the process down, milliseconds
    with pandas mapped) and sends ``done`` on ``connection``: what the code printed from a thread
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
                done = Done(done.run, run.EXIT_PROTOCOL, done.exception)
            connection.send(done)
            code = done.exit_code
        except BaseException:  # the channel broke: the host goes by the zygote's EXITED
            code = run.EXIT_PROTOCOL
    if _ENDING >= 0:
        with contextlib.suppress(OSError):
            # The code may have made this process not dumpable, which hides its exit status
            # from the zygote (see _ending): the runtime's last act makes it inspectable again.
            _prctl(_PR_SET_DUMPABLE, 1)
        os.write(_ENDING, b".")  # the zygote looks now, and sees this process exiting
    os._exit(code)


def main(channel_fd: int, preload: list[str]) -> int:
    """Fork the first run's child, announce READY; per run EXITED, restore, fork the next, READY.

    Returns the zygote's exit code when the host hangs up (every child exits on its own).
    """
    global _GUARD
    control = _Control(channel_fd)
    _prctl(_PR_SET_DUMPABLE, 0)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    run.prepare_process()
    loaded, failed = _preload(preload)
    _exercise(loaded)
    import asyncio  # noqa: F401  (top-level await in a run would import it: ~25 ms)

    from . import library  # noqa: F401  (every run binds its names: imported once here, not per child)

    _program_type()  # defined here once, not in every run's child

    threads = len(os.listdir("/proc/self/task"))
    baseline = _fingerprint()
    mounts = _mount_points()
    directories = _directories()
    gc.collect()
    gc.freeze()  # kept frozen in the children too: a collection there would copy every page it touches
    # The heap the imports freed goes back to the kernel: ~0.8 MiB less PSS per preloading sandbox
    # (the memory its waiting child's rehearsal costs), and a child's allocation there then
    # takes a zero page instead of copying one.
    with contextlib.suppress(AttributeError):  # glibc's; another libc keeps the heap as it is
        _libc().malloc_trim(0)
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
            kind, run_id, guard = _outcome(report)
            if kind == _RUNNING and guard and _GUARD is None:
                _GUARD = guard
            if kind != _RUNNING:
                os.close(ending)
                os.waitpid(child, 0)
                return 0 if kind == _HUNG_UP else run.EXIT_PROTOCOL
            # The run's end goes out first (as soon as the child is exiting); the rest of its
            # exit and the restore happen while the host answers its caller, and the next
            # READY says the sandbox may serve again.
            exit_code = _ending(child, ending)
            if exit_code is not None:
                control.send(Exited(run_id, exit_code, None))
                os.kill(child, signal.SIGKILL)  # a thread of the run that outlives its main thread
            _, status = os.waitpid(child, 0)
            if exit_code is None:
                control.send(Exited(run_id, _exit_code(status), None))
            problem = _restore(baseline, mounts, directories)
            if problem is None:
                child, report, ending = _prefork(control)
            control.send(Ready("python", version, None, True, os.getpid(), None, None, problem))
            if problem is not None:
                return EXIT_DIRTY
    except (OSError, FrameError):  # the channel broke
        return run.EXIT_PROTOCOL
