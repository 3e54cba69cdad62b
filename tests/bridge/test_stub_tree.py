"""Writing the stubs' tree (``bridge/stub_tree.py``): content-addressed, whole or absent, readable by anyone."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from bridge.tool_fixtures import TIME
from mcp_sandbox.bridge.stub_tree import write_tree
from mcp_sandbox.bridge.stubs import render_package, tool_docs


def test_write_tree_is_content_addressed_and_readable_by_anyone(tmp_path: Path) -> None:
    files = render_package("time", "mcp-time", None, tool_docs("time", TIME))

    first = write_tree(tmp_path, files, prefix="time")
    again = write_tree(tmp_path, dict(reversed(files.items())), prefix="time")
    other = write_tree(tmp_path, {**files, "__init__.py": "# changed\n"}, prefix="time")

    assert first == again != other
    assert first.parent == tmp_path and first.name.startswith("time-") and len(first.name) == len("time-") + 16
    assert {path.name: path.read_text(encoding="utf-8") for path in first.iterdir()} == files
    assert stat.S_IMODE(first.stat().st_mode) == 0o755
    assert {stat.S_IMODE(path.stat().st_mode) for path in first.iterdir()} == {0o644}
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([first.name, other.name])


def test_concurrent_writers_of_the_same_tree_all_succeed(tmp_path: Path) -> None:
    files = {f"tool_{i}.py": f"# {i}\n" * 1000 for i in range(50)} | {"sub/dir/x.py": "x = 1\n"}
    barrier = threading.Barrier(8)
    results: list[Path] = []
    errors: list[BaseException] = []

    def write() -> None:
        barrier.wait()
        try:
            results.append(write_tree(tmp_path, files))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert len(results) == 8 and len(set(results)) == 1
    assert [path.name for path in tmp_path.iterdir()] == [results[0].name]
    assert (results[0] / "sub" / "dir" / "x.py").read_text(encoding="utf-8") == "x = 1\n"
    assert stat.S_IMODE((results[0] / "sub").stat().st_mode) == 0o755


@pytest.mark.parametrize("path", ["../escape.py", "/abs.py", "a/../../b.py", "", "a//b.py", "./x.py"])
def test_write_tree_refuses_paths_that_leave_the_tree(tmp_path: Path, path: str) -> None:
    with pytest.raises(ValueError):
        write_tree(tmp_path / "root", {path: "x"})
