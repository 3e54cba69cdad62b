"""The escape advisories table: versions parsed as the programs print them, ranges and patched builds matched."""

from __future__ import annotations

import pytest

from mcp_sandbox.sandbox.advisories import ADVISORIES, affecting, debian_compare, parse_version


def _ids(component: str, shown: str, package: str | None = None) -> set[str]:
    version = parse_version(shown)
    assert version is not None, shown
    return {advisory.ids for advisory in affecting(component, version, package)}


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        ("bubblewrap 0.8.0", (0, 8, 0, 1, 0)),
        ("runc version 1.1.5+ds1", (1, 1, 5, 1, 0)),
        ("runc version 1.4.0-rc.3", (1, 4, 0, 0, 3)),
        ("1.0.0-rc93", (1, 0, 0, 0, 93)),
        ("podman version 4.3.1", (4, 3, 1, 1, 0)),
        ("6.1", (6, 1, 0, 1, 0)),
        ("no version here", None),
    ],
)
def test_versions_are_read_as_the_programs_print_them(shown: str, expected: tuple[int, ...] | None) -> None:
    assert parse_version(shown) == expected


def test_runc_before_each_fix_is_warned_and_the_fixed_releases_are_not() -> None:
    leaky, late = "CVE-2024-21626 (Leaky Vessels)", "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881"
    assert {leaky, late} <= _ids("runc", "runc version 1.1.11")
    assert _ids("runc", "runc version 1.1.12") == {late}
    assert late in _ids("runc", "runc version 1.2.7") and late not in _ids("runc", "runc version 1.2.8")
    assert late in _ids("runc", "runc version 1.3.2") and late not in _ids("runc", "runc version 1.3.3")
    assert late in _ids("runc", "runc version 1.4.0-rc.2") and not _ids("runc", "runc version 1.4.0-rc.3")
    assert not _ids("runc", "runc version 1.4.0")
    assert "CVE-2019-5736" in _ids("runc", "runc version 1.0.0-rc6")


def test_a_debian_build_with_the_fix_backported_is_not_warned_for_that_advisory() -> None:
    leaky = "CVE-2024-21626 (Leaky Vessels)"
    assert leaky not in _ids("runc", "runc version 1.1.5+ds1", "1.1.5+ds1-1+deb12u1")  # Debian 12's security update
    assert leaky not in _ids("runc", "runc version 1.1.5+ds1", "1.1.5+ds1-1+deb12u2")  # a later one still has it
    assert leaky in _ids("runc", "runc version 1.1.5+ds1", "1.1.5+ds1-1")  # before the update
    # Debian 12's bubblewrap update backports --bind-fd for Flatpak, not the fix of GHSA-pxhw-h44j-8pfx.
    assert "GHSA-pxhw-h44j-8pfx" in _ids("bwrap", "bubblewrap 0.8.0", "0.8.0-2+deb12u1")
    assert not _ids("bwrap", "bubblewrap 0.12.0")


def test_kernels_are_matched_per_stable_branch() -> None:
    assert "CVE-2022-0847 (Dirty Pipe)" in _ids("kernel", "5.15.24")
    assert "CVE-2022-0847 (Dirty Pipe)" not in _ids("kernel", "5.15.25")
    assert "CVE-2022-0847 (Dirty Pipe)" not in _ids("kernel", "5.4.300")  # before it was introduced
    assert "CVE-2024-1086" in _ids("kernel", "6.1.75") and "CVE-2024-1086" not in _ids("kernel", "6.1.76")
    assert not _ids("kernel", "6.18.44-fc-v657")


@pytest.mark.parametrize(
    ("a", "b", "order"),
    [
        ("1.1.5+ds1-1+deb12u1", "1.1.5+ds1-1", 1),
        ("1.1.5+ds1-1+deb12u1", "1.1.5+ds1-1+deb12u1", 0),
        ("1.0~rc1-1", "1.0-1", -1),  # "~" sorts before the end
        ("1:0.1-1", "2.0-1", 1),  # the epoch first
        ("0.8.0-2+deb12u1", "0.8.0-10", -1),  # numbers compare as numbers
    ],
)
def test_debian_versions_compare_as_dpkg_does(a: str, b: str, order: int) -> None:
    assert debian_compare(a, b) == order
    assert debian_compare(b, a) == -order


def test_every_range_of_the_table_reads_and_is_not_empty() -> None:
    for advisory in ADVISORIES:
        for introduced, fixed in advisory.ranges:
            low, high = parse_version(introduced), parse_version(fixed)
            assert low is not None and high is not None and low < high, advisory
