"""How a running task is getting on, as both eras' ``tasks/get`` say it: the time so far and the
last line its code printed (no progress notifications reach a task's client).

:class:`LastLine` is the run's output listener: it keeps only the last non-blank line of stdout
or stderr as they come, cut to :data:`_MAX_LINE` characters, so a run that prints gigabytes
costs a task nothing more.
"""

from __future__ import annotations

from typing import Literal

from mcp_sandbox.server.tasks.table import TaskRow

__all__ = ["LastLine", "working_message"]

_MAX_LINE = 200  # characters of the last line said in statusMessage
_KEEP = 4096  # bytes of a line without its end kept


class LastLine:
    """The last line a run printed (stdout or stderr, as it comes): a running task's progress."""

    def __init__(self) -> None:
        self._partial: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self.line: str | None = None

    def feed(self, stream: Literal["stdout", "stderr"], data: bytes) -> None:
        """Take a chunk of ``stream`` (an :data:`~mcp_sandbox.engine.OutputListener`); never blocks."""
        *lines, rest = (self._partial[stream] + data).replace(b"\r", b"\n").split(b"\n")
        self._partial[stream] = rest[-_KEEP:]
        for line in reversed([*lines, rest]):
            if line.strip():
                text = line[-_KEEP:].decode("utf-8", errors="replace").strip()
                self.line = text if len(text) <= _MAX_LINE else text[:_MAX_LINE] + "…"
                return

    def describe(self) -> str | None:
        """The last line (a :data:`~.runtime.Describe`), or None before the run printed one."""
        return self.line


def _seconds(elapsed: float) -> str:
    whole = int(elapsed)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def working_message(row: TaskRow, line: str | None, now: float) -> str:
    """A working task's ``statusMessage``: the time so far, and ``line``, the last its run printed."""
    said = f"running for {_seconds(max(0.0, now - row.created))}"
    return said if line is None else f"{said}; last output: {line}"
