"""How many session-ready sandboxes a uid's pool keeps: its floor, its recent new conversations, the budget.

Each uid's pool (:mod:`.ready`) keeps its floor (``session_ready``; a token tenant's uid at most
``tenant_concurrent_runs`` of them), the memory it always holds. When new conversations come
faster, the pool grows to as many as came in the last :data:`RATE_WINDOW` seconds (the arrival
rate over that window), so that the next burst like the last one is served from ready sandboxes,
and shrinks back once they stop coming. What a pool keeps above its floor is drawn from one
:class:`ReadyBudget` for every uid together (``session_ready_burst``): the memory bursts may
hold, whichever tenant they come from, within a bound the operator sets.

The floor holds both kinds of runner (:class:`Mix`): one that preloaded ``pool_preload`` for a
run that names those modules (a fork's first run, which loads variables that may need them), and
a light one for the rest. A claim takes the kind it asks for where one is idle, else the other;
its replacement is the kind the floor then lacks, and where the stock is already at its target
(a burst's extra sandboxes, all of one kind, not yet trimmed) an idle one of the other kind is
swapped for it: a pool never drifts to light sandboxes only, where every fork's first run would
import the modules itself.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RATE_WINDOW", "Arrivals", "Mix", "ReadyBudget"]

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


class Mix:
    """How many of a pool's stock (starting or idle) preload and how many are light, against the floor's share of each.

    The floor's sandboxes alternate, preloading first: a floor of 1 is one preloading, 2 one of
    each, 3 two preloading and one light.
    """

    def __init__(self, floor: int) -> None:
        self._share = {True: (floor + 1) // 2, False: floor // 2}
        self._held = {True: 0, False: 0}

    def add(self, preloaded: bool) -> None:
        """One of this kind joined the stock."""
        self._held[preloaded] += 1

    def remove(self, preloaded: bool) -> None:
        """One of this kind left the stock (claimed, stopped or failed)."""
        self._held[preloaded] -= 1

    def held(self, preloaded: bool) -> int:
        """How many of this kind the stock holds."""
        return self._held[preloaded]

    def lacking(self) -> bool | None:
        """The kind the stock holds fewer of than the floor's share (preloading first), or None."""
        return next((kind for kind in (True, False) if self._held[kind] < self._share[kind]), None)

    def surplus(self, preloaded: bool) -> bool:
        """Whether the stock holds more of this kind than the floor's share (one may go)."""
        return self._held[preloaded] > self._share[preloaded]
