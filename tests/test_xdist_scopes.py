"""The workers' units (tests/xdist_scopes.py): long modules of per-test folders cut, the others whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from xdist_scopes import CHUNKED, CostFirstScheduling, load_costs, record, unit_cost, weight

CHUNK = CHUNKED["tests/sandbox/"]


def test_a_long_module_of_a_chunked_folder_is_cut_into_units_of_consecutive_tests() -> None:
    attacks = [f"tests/sandbox/test_attacks.py::test_{n}[bwrap]" for n in range(2 * CHUNK + 1)]
    units = CostFirstScheduling._cut([*attacks, "tests/sandbox/test_small.py::test_one"])

    assert [units[nodeid] for nodeid in attacks] == (
        ["tests/sandbox/test_attacks.py::@0"] * CHUNK
        + ["tests/sandbox/test_attacks.py::@1"] * CHUNK
        + ["tests/sandbox/test_attacks.py::@2"]
    )
    assert units["tests/sandbox/test_small.py::test_one"] == "tests/sandbox/test_small.py::@0"


def test_the_container_tests_are_cut_finer_so_their_minutes_long_tests_spread_over_the_workers() -> None:
    size = CHUNKED["tests/containers/"]
    tests = [
        f"tests/containers/test_containers.py::test_{n}[{kind}]" for n in range(3) for kind in ("podman", "docker")
    ]
    units = CostFirstScheduling._cut(tests)
    assert len(set(units.values())) == -(-len(tests) // size) > 1


def test_a_module_that_may_share_module_scoped_fixtures_stays_whole() -> None:
    tools = [f"tests/e2e/runs/test_tools.py::test_{n}[stdio]" for n in range(3 * CHUNK)]
    assert CostFirstScheduling._cut(tools) == {}  # loadscope's own unit: the module


def test_a_real_sandbox_test_weighs_more_than_a_pure_one() -> None:
    assert weight("tests/sandbox/test_privileges.py::test_x[bwrap-cold]") > weight(
        "tests/sandbox/backends/bwrap/test_argv.py::test_y"
    )
    assert weight("tests/deploy/test_image.py::test_z") > weight("tests/config/test_sources.py::test_w")


def test_a_measured_module_is_costed_at_its_measured_rate_and_a_new_one_by_its_folder(tmp_path: Path) -> None:
    costs = tmp_path / "costs.tsv"
    costs.write_text(
        "# seconds\ttests\tmodule\n70.0\t1\ttests/e2e/clients/test_long.py\n3.0\t30\ttests/e2e/test_quick.py\n"
    )
    known = load_costs(costs)

    assert unit_cost(["tests/e2e/clients/test_long.py::test_waits"], known) == 70.0
    assert unit_cost([f"tests/e2e/test_quick.py::test_{n}" for n in range(10)], known) == pytest.approx(1.0)
    new = "tests/deploy/test_new.py::test_x"
    assert unit_cost([new], known) == weight(new)


def test_one_long_test_is_dealt_out_before_many_quick_ones(tmp_path: Path) -> None:
    costs = tmp_path / "costs.tsv"
    costs.write_text("70.0\t1\ttests/e2e/clients/test_long.py\n30.0\t100\ttests/e2e/test_quick.py\n")
    known = load_costs(costs)
    units = {
        "tests/e2e/test_quick.py": [f"tests/e2e/test_quick.py::test_{n}" for n in range(100)],
        "tests/e2e/clients/test_long.py": ["tests/e2e/clients/test_long.py::test_waits"],
    }
    assert max(units, key=lambda unit: unit_cost(units[unit], known)) == "tests/e2e/clients/test_long.py"


def test_the_costs_are_recorded_per_module_from_junit_reports_every_phase_counted(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.e2e.runs.test_tools" name="test_a[stdio]" time="12.5"/>'
        '<testcase classname="tests.e2e.runs.test_tools" name="test_b[http]" time="0.5"/>'
        '<testcase classname="tests.sandbox.test_limits.TestBombs" name="test_c" time="4.0"/>'
        "</testsuite></testsuites>"
    )
    recorded = tmp_path / "costs.tsv"
    recorded.write_text(record([report]))

    assert load_costs(recorded) == {"tests/e2e/runs/test_tools.py": 6.5, "tests/sandbox/test_limits.py": 4.0}


def test_the_committed_costs_parse_and_each_is_a_rate_in_seconds() -> None:
    known = load_costs()  # a module renamed since is only a stale line: its tests fall back to WEIGHTS
    assert known, "tests/costs.tsv is missing or empty"
    assert all(module.startswith("tests/") and module.endswith(".py") and rate >= 0 for module, rate in known.items())
