"""How `make test` deals the suite out to its pytest-xdist workers (``--dist loadscope``).

xdist's loadscope sends each module whole to one worker, the modules with the most tests first.
Two things then keep workers idle while one still works: a module of a few hundred real-sandbox
attacks is one unit of many minutes, and a module of a few slow tests (a docker image built, a
browser, a client that waits out its 60 s timeout) is dealt out last, after hundreds of quick ones.

This scheduler keeps loadscope's rule that a module's tests run on one worker, where its module-
scoped fixtures are set up once, except for the folders in ``CHUNKED``: their fixtures are per test
or per session, so a long module there is cut into units of a few consecutive tests. And it deals
out first the units that cost most (longest first, which bounds the idle tail by the shortest
units): a module's cost is what it took when last measured (``COSTS``, tests/costs.tsv: seconds
per test), else a rough figure per test by its folder (``WEIGHTS``).

Record the costs from a run's JUnit XML (each test's setup, call and teardown, so a module-scoped
server counts once, in its first test)::

    .venv/bin/pytest -n 2 --dist loadscope tests/e2e --junitxml=/tmp/e2e.xml
    .venv/bin/python tests/xdist_scopes.py /tmp/*.xml > tests/costs.tsv

Written here because xdist has no cost-aware order (``worksteal`` splits modules whose tests share
a module-scoped server); it only orders and groups, the tests and their fixtures are unchanged.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Folders whose tests share no module-scoped fixture, and how many consecutive tests of a module there
# make a unit: a long module there may run on several workers. tests/containers/ has few tests, some of
# minutes (120 starts cancelled on each dialect), so its units are small.
CHUNKED: dict[str, int] = {"tests/sandbox/": 30, "tests/containers/": 4}

COSTS = Path(__file__).with_name("costs.tsv")

# Seconds per test of a module that tests/costs.tsv does not list (a new one), by the first folder
# prefix that matches: the real-sandbox suites and the tests that start servers weigh most. Each is
# its folder's mean when tests/costs.tsv was measured (on two workers, at load 5-22).
WEIGHTS: tuple[tuple[str, float], ...] = (
    ("tests/deploy/", 9.5),
    ("tests/replicas/", 19.0),
    ("tests/provision/", 1.8),
    ("tests/e2e/", 7.9),
    ("tests/containers/", 17.6),
    ("tests/sandbox/backends/", 4.0),
    ("tests/sandbox/cgroups/", 0.3),
    ("tests/sandbox/", 4.3),
    ("tests/engine/", 1.8),
    ("tests/egress/", 1.1),
    ("tests/bridge/", 0.3),
    ("tests/tracing/", 0.4),
    ("tests/install/", 0.7),
    ("tests/workspace/", 0.5),
)
DEFAULT_WEIGHT = 0.1


def weight(nodeid: str) -> float:
    """The rough cost of the test ``nodeid`` in seconds, by its folder."""
    return next((w for prefix, w in WEIGHTS if nodeid.startswith(prefix)), DEFAULT_WEIGHT)


def load_costs(path: Path = COSTS) -> dict[str, float]:
    """Seconds per test of each measured module (``seconds<TAB>tests<TAB>module`` lines), or none."""
    costs = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                seconds, tests, module = line.split("\t")
                costs[module] = float(seconds) / max(int(tests), 1)
    return costs


def unit_cost(nodeids: Iterable[str], costs: Mapping[str, float]) -> float:
    """The cost of a unit of tests: each at its module's measured rate, else its folder's weight."""
    return sum(costs.get(nodeid.split("::", 1)[0]) or weight(nodeid) for nodeid in nodeids)


def module_of(classname: str) -> str:
    """``tests.e2e.runs.test_tools.TestX`` (a JUnit classname) -> ``tests/e2e/runs/test_tools.py``."""
    parts = classname.split(".")
    end = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "/".join(parts[: end + 1]) + ".py"


def record(reports: Iterable[Path]) -> str:
    """tests/costs.tsv from JUnit XML reports: each module's seconds (every phase) and test count."""
    seconds: defaultdict[str, float] = defaultdict(float)
    tests: Counter[str] = Counter()
    for report in reports:
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            module = module_of(case.get("classname", ""))
            seconds[module] += float(case.get("time", 0))
            tests[module] += 1
    lines = [f"{seconds[module]:.1f}\t{tests[module]}\t{module}" for module in sorted(seconds)]
    return (
        "# seconds\ttests\tmodule: measured by tests/xdist_scopes.py (its docstring says how)\n"
        + "\n".join(lines)
        + "\n"
    )


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
        """The unit of each test of a ``CHUNKED`` folder: its module, and its place there by the folder's size."""
        seen: dict[str, int] = {}
        units = {}
        for nodeid in collection:
            module = nodeid.split("::", 1)[0]
            size = next((size for folder, size in CHUNKED.items() if module.startswith(folder)), 0)
            if size:
                place = seen.get(module, 0)
                seen[module] = place + 1
                units[nodeid] = f"{module}::@{place // size}"
        return units

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the queue is whole by the first assignment
            known = load_costs()
            costs = {scope: unit_cost(unit, known) for scope, unit in self.workqueue.items()}
            self.workqueue = OrderedDict(sorted(self.workqueue.items(), key=lambda item: -costs[item[0]]))
            self._ordered = True
        super()._assign_work_unit(node)


if __name__ == "__main__":
    sys.stdout.write(record(Path(arg) for arg in sys.argv[1:]))
