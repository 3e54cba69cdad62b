"""The runtime's fork state (``fork.py``): a session's ``__main__`` dumped and loaded, outside a sandbox.

The dump and the load run in one interpreter here, each into its own namespace, as the source's
and the fork's runtimes do in theirs (the same Python, the same packages).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from mcp_sandbox.runners.python.mcp_sandbox_runtime import exec_server, fork, frames

MiB = 1 << 20


def _defined(code: str) -> dict[str, Any]:
    """A ``__main__``-like namespace after a run of ``code``."""
    module = types.ModuleType("__main__")
    exec(compile(code, "<main>", "exec"), module.__dict__)
    return module.__dict__


def _carried(namespace: dict[str, Any], budget: int = MiB) -> tuple[dict[str, Any], dict[str, Any]]:
    target: dict[str, Any] = {"__builtins__": __builtins__}
    report = fork.load(b"a thread's print\n" + fork.dump(namespace, budget), target)
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
        dumped = fork.dump(module.__dict__, MiB)
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
    state = frames.Exec(1, "x", (), {}, 0, 0, False, state=True)
    plain = frames.Exec(1, "x", (), {}, 0, 0, False)

    assert exec_server.accept_exec(state, [3, 4, 5]) is state
    assert exec_server.accept_exec(plain, [3, 4]) is plain
    assert exec_server.accept_exec(plain, []) is plain  # the process's own stdio
    for frame, fds in ((state, [3, 4]), (state, []), (plain, [3, 4, 5])):
        assert isinstance(exec_server.accept_exec(frame, fds), str)
    # A zygote's EXEC carries the run's channel third: a state there would be read from it.
    assert isinstance(exec_server.accept_exec(state, [3, 4, 5], descriptors=3), str)
