"""The runtime's fork state (``fork.py``): a session's ``__main__`` dumped and loaded, outside a sandbox.

The dump and the load run in one interpreter here, each into its own namespace, as the source's
and the fork's runtimes do in theirs (the same Python, the same packages).
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.runners.python.mcp_sandbox_runtime import exec_server, fork, frames, snapshot

MiB = 1 << 20


def _defined(code: str) -> dict[str, Any]:
    """A ``__main__``-like namespace after a run of ``code``."""
    module = types.ModuleType("__main__")
    exec(compile(code, "<main>", "exec"), module.__dict__)
    return module.__dict__


def _joined(pieces: list[memoryview | bytes]) -> bytes:
    return b"".join(bytes(piece) for piece in pieces)


def _carried(namespace: dict[str, Any], budget: int = MiB) -> tuple[dict[str, Any], dict[str, Any]]:
    target: dict[str, Any] = {"__builtins__": __builtins__}
    report = fork.load(b"a thread's print\n" + _joined(fork.dump(namespace, budget)), target)
    return target, report


def test_values_modules_and_plain_functions_are_carried_by_value() -> None:
    source = _defined(
        "import json as js\nnumbers = [1, 2, {'k': (3.0, None)}]\nscale = 3\n"
        "def triple(x, *, by=None):\n    return x * (by or scale)\n"
    )

    target, report = _carried(source)

    assert target["numbers"] == [1, 2, {"k": (3.0, None)}]
    assert target["js"] is sys.modules["json"]
    assert target["triple"](2) == 6  # its globals are the fork's namespace
    target["scale"] = 10
    assert target["triple"](2) == 20
    assert target["triple"](2, by=5) == 10
    assert report["variables"] == 4 and report["skipped"] == []


def test_what_cannot_be_carried_is_named_with_why() -> None:
    source = _defined(
        "class Tagged(metaclass=type('Meta', (type,), {})):\n    pass\n"
        "def outer():\n    y = (i for i in range(2))\n    return lambda: y\n"
        "closure = outer()\ngen = (i for i in range(3))\nkept = 1\n"
    )

    target, report = _carried(source)

    skipped = " | ".join(report["skipped"])
    assert "Tagged (a class with a metaclass of its own" in skipped
    assert "closure (TypeError" in skipped
    assert "gen (TypeError" in skipped
    assert target["kept"] == 1 and "gen" not in target and "Tagged" not in target


def test_classes_their_instances_and_closures_over_values_are_carried_by_value() -> None:
    module = types.ModuleType("__main__")
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module  # instances pickle by reference to __main__, as in the sandbox
    try:
        exec(
            compile(
                "class Base:\n    kind = 'base'\n    def __init__(self, v):\n        self.v = v\n"
                "    def show(self):\n        return f'{self.kind}:{self.v}'\n"
                "class Child(Base):\n    kind = 'child'\n    def show(self):\n        return 'C' + super().show()\n"
                "    @staticmethod\n    def seven():\n        return 7\n"
                "    @classmethod\n    def named(cls):\n        return cls.__name__\n"
                "    @property\n    def double(self):\n        return self.v * 2\n"
                "def outer():\n    y = [1, 2]\n    return lambda: y\n"
                "closure = outer()\nitem = Child(5)\n",
                "<main>",
                "exec",
            ),
            module.__dict__,
        )
        dumped = _joined(fork.dump(module.__dict__, MiB))
        target = types.ModuleType("__main__")
        sys.modules["__main__"] = target
        report = fork.load(dumped, target.__dict__)
    finally:
        sys.modules["__main__"] = saved
    made = target.__dict__

    assert report["skipped"] == []
    assert made["item"].show() == "Cchild:5" and made["item"].double == 10
    assert isinstance(made["item"], made["Base"]) and made["Child"] is not module.__dict__["Child"]
    assert (made["Child"].seven(), made["Child"].named(), made["closure"]()) == (7, "Child", [1, 2])


def test_variables_past_the_budget_are_skipped_and_the_rest_carried() -> None:
    source = {"big": b"x" * (2 * MiB), "small": b"y"}

    target, report = _carried(source, budget=MiB)

    assert target == {"__builtins__": __builtins__, "small": b"y"}
    assert report["skipped"] == ["big (over the limit of 1 MiB of variables)"]


class _Loud:
    def __reduce__(self) -> Any:
        print("printed while pickled")
        raise SystemExit(3)


def test_an_object_that_prints_or_exits_while_pickled_spoils_nothing_else() -> None:
    target, report = _carried({"loud": _Loud(), "kept": 2})

    assert target["kept"] == 2
    assert report["skipped"] == ["loud (SystemExit: 3)"]


def test_a_state_that_is_not_a_dump_carries_nothing_and_says_so() -> None:
    target: dict[str, Any] = {}

    report = fork.load(b"not a dump at all!", target)

    assert target == {}
    assert report["variables"] == 0
    assert report["skipped"][0].startswith("all variables (")


def test_a_runner_takes_a_forks_state_only_as_the_descriptor_after_the_run_pipes_and_a_zygote_never() -> None:
    state = frames.Exec(1, "x", (), {}, 0, 0, False, state=100)
    plain = frames.Exec(1, "x", (), {}, 0, 0, False)

    assert exec_server.accept_exec(state, [3, 4, 5]) is state
    assert exec_server.accept_exec(plain, [3, 4]) is plain
    assert exec_server.accept_exec(plain, []) is plain  # the process's own stdio
    for frame, fds in ((state, [3, 4]), (state, []), (plain, [3, 4, 5])):
        assert isinstance(exec_server.accept_exec(frame, fds), str)
    # A zygote's EXEC carries the run's channel third: a state there would be read from it.
    assert isinstance(exec_server.accept_exec(state, [3, 4, 5], descriptors=3), str)


class _Column:
    """A stand-in for an array: its data pickles out of band (protocol 5), as numpy's does."""

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> Any:
        return type(self), (pickle.PickleBuffer(self.data),)


def _state_file(tmp_path: Path, pieces: list[Any], before: bytes = b"", after: bytes = b"") -> tuple[int, int]:
    """A file holding what a thread printed ``before`` the dump, the dump, and a host's trailer ``after`` it;
    an open descriptor and the size of all but the trailer."""
    path = tmp_path / "state"
    path.write_bytes(before + _joined(pieces) + after)
    return os.open(path, os.O_RDONLY), path.stat().st_size - len(after)


def test_a_state_is_read_from_its_file_with_large_buffers_in_place_and_writable(tmp_path: Path) -> None:
    module = types.ModuleType("__main__")
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module
    try:
        column = bytearray(range(256)) * (snapshot.HUGE // 256 + 1)
        source = {"column": _Column(column), "blob": bytes(200_000), "small": [1, 2]}
        fd, size = _state_file(tmp_path, fork.dump(source, 64 * MiB), b"printed first\n", b"T" * 56)
        try:
            read = snapshot.read(fd, size)
        finally:
            os.close(fd)
        target: dict[str, Any] = {}
        report = fork.load(read, target)
    finally:
        sys.modules["__main__"] = saved

    assert report == {"variables": 3, "modules": report["modules"], "skipped": []}
    assert len(read.buffers) == 1 and read.buffers[0].__class__.__name__ == "mmap"  # its own mapping
    loaded = target["column"].data
    assert bytes(loaded) == bytes(column) and not memoryview(loaded).readonly
    loaded[0] = 7  # writable in place
    assert (target["blob"], target["small"]) == (bytes(200_000), [1, 2])


def _mappings(path: Path) -> int:
    return sum(str(path) in line for line in Path("/proc/self/maps").read_text().splitlines())


@pytest.mark.parametrize("before", [b"", b"a thread's print, 32 bytes long\n"], ids=["at-0", "after-a-print"])
def test_a_parked_states_large_buffers_are_mapped_copy_on_write_and_writes_never_reach_the_file(
    tmp_path: Path, before: bytes
) -> None:
    column = bytearray(range(256)) * (snapshot.HUGE // 256 + 1)
    source = {"column": _Column(column), "blob": bytes(200_000), "small": [1, 2]}
    fd, size = _state_file(tmp_path, fork.dump(source, 64 * MiB), before, b"T" * 56)
    path = tmp_path / "state"
    whole = path.read_bytes()
    descriptors = len(os.listdir("/proc/self/fd"))
    try:
        read = snapshot.read(fd, size, mapped=True)
    finally:
        os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == descriptors - 1  # no duplicate of it kept with the mapping
    target: dict[str, Any] = {}
    report = fork.load(read, target)

    assert report["variables"] == 3 and report["skipped"] == []
    assert isinstance(read.buffers[0], memoryview) and _mappings(path) == 1  # the file's pages, not a copy
    loaded = target["column"].data
    assert bytes(loaded) == bytes(column) and not memoryview(loaded).readonly
    loaded[0] = 7  # writable, copy-on-write
    assert bytes(loaded[:2]) == b"\x07\x01" and path.read_bytes() == whole
    assert (target["blob"], target["small"]) == (bytes(200_000), [1, 2])
    again: dict[str, Any] = {}
    fork.load(_joined(fork.dump(target, 64 * MiB)), again)  # parked again, mapped buffers and all
    assert bytes(again["column"].data) == b"\x07" + bytes(column)[1:]
    del read, target, loaded, report, again
    gc.collect()
    assert _mappings(path) == 0  # unmapped once nothing refers to it


def test_a_state_of_the_earlier_layout_still_loads(tmp_path: Path) -> None:
    values = [("numbers", pickle.dumps(("value", [1, 2.5]))), ("name", pickle.dumps(("value", "kept")))]
    index = pickle.dumps(
        {
            "format": 2,
            "modules": ["json"],
            "classes": [],
            "functions": [],
            "values": [(name, len(data)) for name, data in values],
            "skipped": ["gen (TypeError: cannot pickle 'generator' object)"],
        }
    )
    blob = b"".join(data for _, data in values)
    earlier = blob + index + len(index).to_bytes(8, "big") + len(blob).to_bytes(8, "big") + b"\x00mcp-sandbox-fork"
    fd, size = _state_file(tmp_path, [earlier], after=b"T" * 56)
    try:
        read = snapshot.read(fd, size)
    finally:
        os.close(fd)
    target: dict[str, Any] = {}

    report = fork.load(read, target)

    assert target == {"numbers": [1, 2.5], "name": "kept"}
    assert report["variables"] == 2 and report["skipped"] == ["gen (TypeError: cannot pickle 'generator' object)"]


def test_a_state_cut_short_is_refused_before_anything_is_read_into_place(tmp_path: Path) -> None:
    pieces = fork.dump({"column": _Column(bytearray(snapshot.HUGE)), "kept": 1}, 64 * MiB)
    whole = _joined(pieces)
    path = tmp_path / "state"
    path.write_bytes(whole[: len(whole) // 2] + whole[-60:])  # the layout's end, its buffers cut out
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="cut short"):
            snapshot.read(fd, path.stat().st_size)
    finally:
        os.close(fd)
