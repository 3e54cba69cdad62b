"""The workers' units (tests/xdist_scopes.py): long modules of per-test folders cut, the others whole."""

from __future__ import annotations

from xdist_scopes import CHUNK, CostFirstScheduling, weight


def test_a_long_module_of_a_chunked_folder_is_cut_into_units_of_consecutive_tests() -> None:
    attacks = [f"tests/sandbox/test_attacks.py::test_{n}[bwrap]" for n in range(2 * CHUNK + 1)]
    units = CostFirstScheduling._cut([*attacks, "tests/sandbox/test_small.py::test_one"])

    assert [units[nodeid] for nodeid in attacks] == (
        ["tests/sandbox/test_attacks.py::@0"] * CHUNK
        + ["tests/sandbox/test_attacks.py::@1"] * CHUNK
        + ["tests/sandbox/test_attacks.py::@2"]
    )
    assert units["tests/sandbox/test_small.py::test_one"] == "tests/sandbox/test_small.py::@0"


def test_a_module_that_may_share_module_scoped_fixtures_stays_whole() -> None:
    tools = [f"tests/e2e/runs/test_tools.py::test_{n}[stdio]" for n in range(3 * CHUNK)]
    assert CostFirstScheduling._cut(tools) == {}  # loadscope's own unit: the module


def test_a_real_sandbox_test_weighs_more_than_a_pure_one() -> None:
    assert weight("tests/sandbox/test_privileges.py::test_x[bwrap-cold]") > weight(
        "tests/sandbox/backends/test_bwrap_argv.py::test_y"
    )
    assert weight("tests/deploy/test_image.py::test_z") > weight("tests/config/test_config.py::test_w")
