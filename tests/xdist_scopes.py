"""How `make test` deals the suite out to its pytest-xdist workers (``--dist loadscope``).

xdist's loadscope sends each module whole to one worker, the modules with the most tests first.
Two things then keep workers idle while one still works: a module of a few hundred real-sandbox
attacks is one unit of many minutes, and a module of a few slow tests (a docker image built, a
browser, replicas over PostgreSQL) is dealt out last, after hundreds of quick ones.

This scheduler keeps loadscope's rule that a module's tests run on one worker, where its module-
scoped fixtures are set up once, except for the folders in ``CHUNKED``: their fixtures are per test
or per session, so a long module there is cut into units of ``CHUNK`` consecutive tests. And it deals
out first the units that cost most by a rough weight per test (``WEIGHTS``: a real sandbox or a
server per test weighs more than a pure function), not the ones with the most tests.

Written here because xdist has no cost-aware order (``worksteal`` splits modules whose tests share
a module-scoped server); it only orders and groups, the tests and their fixtures are unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Folders whose tests share no module-scoped fixture: a long module there may run on several workers.
CHUNKED = ("tests/sandbox/",)
CHUNK = 30

# A rough relative cost of one test, by the folder it is in (the first prefix that matches): the
# real-sandbox suites and the tests that start servers weigh most. Only the order depends on it.
WEIGHTS: tuple[tuple[str, float], ...] = (
    ("tests/deploy/", 8.0),
    ("tests/replicas/", 5.0),
    ("tests/provision/", 5.0),
    ("tests/e2e/", 1.0),
    ("tests/containers/", 3.0),
    ("tests/sandbox/backends/", 0.1),
    ("tests/sandbox/cgroups/", 0.5),
    ("tests/sandbox/", 3.0),
    ("tests/engine/", 1.5),
    ("tests/egress/", 1.0),
    ("tests/bridge/", 0.5),
    ("tests/tracing/", 0.5),
    ("tests/install/", 0.5),
    ("tests/workspace/", 0.3),
)
DEFAULT_WEIGHT = 0.1


def weight(nodeid: str) -> float:
    """The rough cost of the test ``nodeid``, by its folder."""
    return next((w for prefix, w in WEIGHTS if nodeid.startswith(prefix)), DEFAULT_WEIGHT)


class CostFirstScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type information
    """``--dist loadscope``, with long modules of ``CHUNKED`` folders cut, and the costliest units first."""

    collection: list[str] | None  # every worker's collection, once they all agree
    workqueue: OrderedDict[str, dict[str, bool]]  # unit -> its tests (done or not), dealt out from the front

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._units: dict[str, str] = {}
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        if not self._units and self.collection:
            self._units = self._cut(self.collection)
        return self._units.get(nodeid) or super()._split_scope(nodeid)

    @staticmethod
    def _cut(collection: list[str]) -> dict[str, str]:
        """The unit of each test of a ``CHUNKED`` folder: its module, and its place there by ``CHUNK``."""
        seen: dict[str, int] = {}
        units = {}
        for nodeid in collection:
            module = nodeid.split("::", 1)[0]
            if module.startswith(CHUNKED):
                place = seen.get(module, 0)
                seen[module] = place + 1
                units[nodeid] = f"{module}::@{place // CHUNK}"
        return units

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the queue is whole by the first assignment
            costs = {scope: sum(map(weight, unit)) for scope, unit in self.workqueue.items()}
            self.workqueue = OrderedDict(sorted(self.workqueue.items(), key=lambda item: -costs[item[0]]))
            self._ordered = True
        super()._assign_work_unit(node)
