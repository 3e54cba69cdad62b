"""Fixtures of the backends' argv tests: snapshots of argv/JSON, compared with the committed files."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

SNAPSHOT_DIR = Path(__file__).parent / "snapshots"

Snapshot = Callable[[str, object], None]


def _check_snapshot(name: str, value: object) -> None:
    """Compare ``value`` (as indented JSON) with ``snapshots/<name>``; rewrite it when
    ``UPDATE_SNAPSHOTS=1``."""
    path = SNAPSHOT_DIR / name
    actual = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"snapshot {path} is missing; create it with UPDATE_SNAPSHOTS=1", pytrace=False)
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"snapshots/{name}",
            tofile="actual",
        )
        pytest.fail(
            f"snapshot {name} differs (review, then rerun with UPDATE_SNAPSHOTS=1):\n{''.join(diff)}",
            pytrace=False,
        )


@pytest.fixture
def snapshot() -> Snapshot:
    """``snapshot(name, value)``: fail with a diff unless ``value`` matches the committed file."""
    return _check_snapshot
