"""How many session-ready sandboxes a uid's pool keeps: its floor, its recent new conversations, the budget.

Each uid's pool (:mod:`.ready`) keeps its floor (``session_ready``; a token tenant's uid at most
``tenant_concurrent_runs`` of them), the memory it always holds. When new conversations come
faster, the pool grows to as many as came in the last :data:`RATE_WINDOW` seconds (the arrival
rate over that window), so that the next burst like the last one is served from ready sandboxes,
and shrinks back once they stop coming. What a pool keeps above its floor is drawn from one
:class:`ReadyBudget` for every uid together (``session_ready_burst``): the memory bursts may
hold, whichever tenant they come from, within a bound the operator sets.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RATE_WINDOW", "Arrivals", "ReadyBudget"]

RATE_WINDOW = 10.0  # seconds of new conversations a pool sizes itself by


class Arrivals:
    """When a uid's new conversations came, over the last ``window`` seconds (default :data:`RATE_WINDOW`)."""

    def __init__(self, window: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = RATE_WINDOW if window is None else window
        self._clock = clock
        self._times: collections.deque[float] = collections.deque()

    def arrive(self) -> None:
        """A new conversation came now."""
        self._times.append(self._clock())

    def recent(self) -> int:
        """How many came in the last ``window`` seconds."""
        horizon = self._clock() - self._window
        while self._times and self._times[0] < horizon:
            self._times.popleft()
        return len(self._times)


@dataclass(eq=False)
class ReadyBudget:
    """Session-ready sandboxes above their pools' floors, of every uid together: ``used`` of at most ``limit``."""

    limit: int
    used: int = 0

    @property
    def room(self) -> bool:
        """Whether one more may start above a floor."""
        return self.used < self.limit
