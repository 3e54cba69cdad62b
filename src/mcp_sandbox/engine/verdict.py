"""What happened to a run, in words: its status, exit code and the explanation the model reads.

A fresh (or warm) run is judged by its process's exit code and the sandbox's memory and pids
counters; a session run by the exit code its DONE frame reports, unless its interpreter died,
which also loses the session's state. The placements decide how a run went; this module says so.
"""

from __future__ import annotations

import dataclasses
import signal
import time

from mcp_sandbox.config import LimitSettings, SessionSettings
from mcp_sandbox.engine.disk import Overrun
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.result import EXIT_TIMEOUT, ExecutionRequest, ExecutionResult, SessionState, Status
from mcp_sandbox.engine.run_frames import RunRecord
from mcp_sandbox.sandbox.backends import SandboxOutcome

__all__ = [
    "STATE_LOST",
    "captured",
    "death",
    "explain_file_size",
    "human_bytes",
    "judge_fresh",
    "judge_session",
    "limits_hit",
    "stopped_for_disk",
    "timed_out",
]

STATE_LOST = "the session's state is lost; the next run starts a fresh interpreter"


def human_bytes(count: int) -> str:
    return f"{count / (1 << 20):g} MiB" if count >= 1 << 20 else f"{count} bytes"


def _elapsed_ms(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


def captured(record: RunRecord, interpreter: Interpreter | None, started: float) -> ExecutionResult:
    """The result as far as the output goes: the run's streams, then anything the process itself wrote."""
    own_out, own_err = interpreter.take_own_output() if interpreter is not None else ("", "")
    return ExecutionResult(
        status="error",
        exit_code=None,
        stdout=record.stdout.text() + own_out,
        stderr=record.stderr.text() + own_err,
        duration_ms=_elapsed_ms(started),
        truncated=record.stdout.truncated or record.stderr.truncated,
        images=tuple(record.images),
        images_dropped=record.images_dropped,
    )


def timed_out(
    result: ExecutionResult, request: ExecutionRequest, what: str, session: SessionState | None = None
) -> ExecutionResult:
    """``result`` as a timeout after ``request.timeout``; ``what`` says what became of the run."""
    return dataclasses.replace(
        result,
        status="timeout",
        exit_code=EXIT_TIMEOUT,
        error=f"timed out after {request.timeout:g} s; {what}",
        session=session,
        limits=("timeout",),
    )


def limits_hit(outcome: SandboxOutcome | None) -> tuple[str, ...]:
    """The limits ``outcome`` shows were hit: ``memory``, ``pids``, ``cpu`` (SIGXCPU)."""
    if outcome is None:
        return ()
    hit: list[str] = []
    if outcome.memory_exceeded:
        hit.append("memory")
    if outcome.pids_exhausted:
        hit.append("pids")
    if outcome.returncode == 128 + signal.SIGXCPU:
        hit.append("cpu")
    if outcome.returncode == 128 + signal.SIGXFSZ:
        hit.append("file_size")
    return tuple(hit)


def _out_of_memory(limits: LimitSettings, record: RunRecord, result: ExecutionResult) -> ExecutionResult:
    """``result`` naming the memory limit, when the run reported ending on its own ``MemoryError``.

    Where no memory cgroup is writable (a container, a Kubernetes pod, a user without delegated
    cgroups) the limit is ``RLIMIT_AS``, under which an allocation fails with ``MemoryError``
    instead of the kernel killing the process: the same limit hit, said and counted
    (``limits``: memory) as a cgroup's kill is. It is the code's own word (DONE's exception),
    so code that raises ``MemoryError`` itself is counted so too: it affects only its own run.
    """
    if not record.done or record.exception != "MemoryError" or "memory" in result.limits:
        return result
    note = f"memory limit of {human_bytes(limits.memory)} reached: an allocation failed (MemoryError)"
    error = f"{result.error}; {note}" if result.error else note
    return dataclasses.replace(result, error=error, limits=(*result.limits, "memory"))


def death(
    limits: LimitSettings, outcome: SandboxOutcome, record: RunRecord, *, session: SessionSettings | None = None
) -> str | None:
    """Why an interpreter ended without reporting its run (None: it exited 0 without saying more).

    ``session``: the sessions' settings when the interpreter was a session's (None: a single run's).
    """
    code = outcome.returncode
    if outcome.memory_exceeded:
        return f"memory limit of {human_bytes(limits.memory)} exceeded"
    if record.protocol_error is not None:  # the host killed it for that
        return f"protocol error on the sandbox channel: {record.protocol_error}"
    if code > 128 and code - 128 in signal.valid_signals():
        sig = signal.Signals(code - 128)
        if sig is signal.SIGXCPU:
            limit = session.session_cpu_seconds if session is not None else None
            counted = f"its CPU time limit of {limit} s, counted over all the session's runs" if limit else None
            return f"the interpreter was killed by SIGXCPU: it used up {counted or 'its CPU time limit'}"
        if sig is signal.SIGXFSZ:
            return "the interpreter was killed by SIGXFSZ: it wrote a file past the run's file size limit"
        return f"the interpreter was killed by {sig.name}"
    if code != 0 or session is not None:
        return f"the interpreter exited with {code} before reporting a result"
    return None


def judge_fresh(
    limits: LimitSettings, outcome: SandboxOutcome, record: RunRecord, result: ExecutionResult
) -> ExecutionResult:
    """Status, exit code and explanation of a fresh run that ended before its deadline.

    The process's exit code is the verdict (a DONE frame the code forged cannot change it).
    """
    code = outcome.returncode
    error: str | None = None
    if outcome.memory_exceeded or not record.done:
        error = death(limits, outcome, record)
    if outcome.pids_exhausted:
        note = f"process limit of {limits.pids} reached"
        error = f"{error}; {note}" if error else note
    status: Status = "success" if code == 0 and error is None else "error"
    judged = dataclasses.replace(result, status=status, exit_code=code, error=error, limits=limits_hit(outcome))
    return _out_of_memory(limits, record, judged)


def judge_session(
    limits: LimitSettings,
    sessions: SessionSettings,
    record: RunRecord,
    result: ExecutionResult,
    *,
    outcome: SandboxOutcome | None,
    ended: str | None,
) -> ExecutionResult:
    """Status, exit code and explanation of a session run that ended before its deadline.

    ``outcome`` is how the session's interpreter ended (None: it has not); ``ended`` why the
    host ended the session during the run (None: it did not).
    """
    if record.done and record.protocol_error is None:
        reported = record.exit_code if record.exit_code is not None else 1
        status: Status = "success" if reported == 0 else "error"
        return _out_of_memory(limits, record, dataclasses.replace(result, status=status, exit_code=reported))
    if ended is not None:
        error = f"{ended}; {STATE_LOST}"
    elif outcome is None:  # pragma: no cover - discard() always records one
        error = f"the interpreter stopped; {STATE_LOST}"
    else:
        error = f"{death(limits, outcome, record, session=sessions)}; {STATE_LOST}"
    code = outcome.returncode if outcome is not None else None
    return dataclasses.replace(result, status="error", exit_code=code, error=error, limits=limits_hit(outcome))


def stopped_for_disk(
    result: ExecutionResult, reason: str, session: SessionState | None = None, *, stopped: bool = True
) -> ExecutionResult:
    """A run the host stopped for what it wrote to its workspace (see :mod:`.disk`).

    ``stopped`` False: the run ended on its own, its workspace over the bound (seen as it ended).
    """
    what = "the run was stopped" if stopped else "the run ended with its workspace over its bound"
    error = f"{what}: {reason}"
    limits = (*result.limits, "disk")
    return dataclasses.replace(result, status="error", exit_code=None, error=error, session=session, limits=limits)


def explain_file_size(limits: LimitSettings, overrun: Overrun, result: ExecutionResult) -> ExecutionResult:
    """``result``, its error naming the run's file size limit and where it came from, if the run hit it."""
    if "file_size" not in result.limits or result.error is None:
        return result
    limit = overrun.file_size(limits.max_file_size)
    if limit < limits.max_file_size:
        left = max(0, overrun.bound.bytes - overrun.before.bytes)
        source = f"what the workspace's quota of {human_bytes(overrun.bound.bytes)} had left ({human_bytes(left)})"
    else:
        source = "max_file_size"
    return dataclasses.replace(result, error=f"{result.error} of {human_bytes(limit)}: {source}")
