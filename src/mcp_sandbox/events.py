"""What happened in the server, as typed events, and the hub that hands them to observers.

The engine, the bridge, the egress proxy and the server's routes *emit* events (a run finished,
a run waited for its slot, a tool was called, a connection left, a file was stored or served, files
could not be saved to the object store);
observers (the metrics, the audit log and the run history, see ``server/service.py``)
*subscribe*. Emitting code knows nothing of Prometheus, log files or databases, and an observer
that fails is logged, never felt by the run.

Events carry sizes, times, names and outcomes only: never code, output, environment values or
tokens. ``conversation`` is always the workspace key (a keyed hash), never the client's id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "EgressConnection",
    "Event",
    "EventHub",
    "FileServed",
    "FileStored",
    "FilesUnsaved",
    "Observer",
    "PoolStarted",
    "RunAdmitted",
    "RunFinished",
    "TaskChanged",
    "ToolCalled",
    "unheard",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunAdmitted:
    """A run got its slot after ``wait`` seconds in the queue (admission control)."""

    wait: float


@dataclass(frozen=True, slots=True)
class RunFinished:
    """A run of ``run_python``/``run_code`` ended (or was refused before it ran).

    ``limits`` names the limits the run hit: ``memory``, ``pids``, ``timeout``, ``cpu``.
    ``warm``: a warm sandbox served it. ``status`` is the result's, or ``busy`` when refused.
    ``duration``: seconds the call took; ``run_ms``: the run's own time, as its result says it.
    ``started_at``: when the call began, in seconds since the epoch.
    ``path``: where the engine placed it: ``warm``, ``session``, ``prestarted`` or ``fresh``.
    ``truncated``: its output went past the output cap.
    """

    tenant: str
    conversation: str | None
    language: str
    backend: str
    status: str
    duration: float
    warm: bool = False
    limits: tuple[str, ...] = ()
    exit_code: int | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    files_bytes: int = 0
    started_at: float = 0.0
    run_ms: int = 0
    path: str = "fresh"
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class ToolCalled:
    """Sandboxed code called ``tool`` of downstream server ``server`` (code mode).

    ``outcome``: ``ok``, ``tool_error`` (the tool answered with an error), ``denied``,
    ``unavailable`` or ``invalid``.
    """

    tenant: str | None
    conversation: str | None
    server: str
    tool: str
    outcome: str
    duration: float
    result_bytes: int = 0


@dataclass(frozen=True, slots=True)
class EgressConnection:
    """A run's connection through the egress proxy ended: its verdict, the rule that decided, bytes each way.

    ``verdict``: ``allowed``, ``refused`` or ``cut``; ``rule``: a rule's name (a fixed set).
    """

    tenant: str
    verdict: str
    rule: str
    sent: int
    received: int


@dataclass(frozen=True, slots=True)
class PoolStarted:
    """A pool started a sandbox to keep ready (a fill or refill): ``pool`` is ``warm``, ``prestarted`` or ``ready``."""

    pool: str
    language: str


@dataclass(frozen=True, slots=True)
class TaskChanged:
    """A task (server/tasks) was created here (``working``), or its run here ended (``completed``,
    ``failed``, ``cancelled``), or a task whose server was lost was failed here."""

    tenant: str
    status: str


@dataclass(frozen=True, slots=True)
class FileStored:
    """A file was uploaded into a conversation (``via``: ``tool`` or ``http``); ``outcome``: ok or why not."""

    tenant: str
    conversation: str | None
    via: str
    outcome: str
    size: int
    duration: float


@dataclass(frozen=True, slots=True)
class FileServed:
    """A signed download was answered (``outcome``: ``ok``, ``expired``, ``invalid``, ``missing``)."""

    conversation: str | None
    outcome: str
    size: int
    duration: float
    status: int


@dataclass(frozen=True, slots=True)
class FilesUnsaved:
    """``files`` files of a conversation are not in the object store as they are on disk: a write-back
    could not store them (``stage``: ``write_back``), or a restore could not get them from a damaged
    store (``restore``). The run's result, or the log, names them."""

    conversation: str
    stage: str
    files: int


Event = (
    RunAdmitted
    | RunFinished
    | ToolCalled
    | EgressConnection
    | PoolStarted
    | FileStored
    | FileServed
    | FilesUnsaved
    | TaskChanged
)
Observer = Callable[[Event], None]


def unheard(event: Event) -> None:
    """The observer of emitters no one listens to: drops ``event``."""


class EventHub:
    """Hands every emitted event to each subscribed observer, in order; observers never break emitters."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def subscribe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def emit(self, event: Event) -> None:
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # an observer's failure (a full disk for the audit log) is not the run's
                logger.exception("an observer failed on %s", type(event).__name__)
