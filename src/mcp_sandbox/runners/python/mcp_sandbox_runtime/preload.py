"""What a zygote imports before its first run: the preloaded modules, and an exercise of those it knows.

A module a warm sandbox preloads is imported once, in the zygote, and shared by every run's
child; its exercise does there what a run's first use would do lazily.
"""

from __future__ import annotations

import contextlib

__all__ = ["exercise", "preload"]


def preload(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    """Import ``modules``; (the ones imported, {module: why not} for the others)."""
    import importlib

    loaded: list[str] = []
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as error:  # a broken module must not take the zygote down
            failed[name] = f"{type(error).__name__}: {error}"
        else:
            loaded.append(name)
    return loaded, failed


# What the zygote does once with each preloaded module it knows, so that what a run's first use
# would do lazily (a submodule imported, a cache filled, a repr's formatting set up) is the
# zygote's, shared by every child: a run's first DataFrame and its first repr cost less. Only
# computations that leave no state a run could see, start no thread (no BLAS) and touch no file.
# Each path taken maps more of the modules' compiled code (page cache, shared by every sandbox
# that maps it), so rarer paths are left to the runs.
_EXERCISES = {
    "numpy": """
import numpy as np
a = np.arange(12, dtype=float).reshape(3, 4)
b = np.array([[1, 2], [3, 4]]) * 2 + 1
repr(a), str(b), float(a.sum()), a.mean(axis=0), a.std(), a[a > 3], np.linspace(0, 1, 5).astype(int)
""",
    "pandas": """
import pandas as pd
df = pd.DataFrame({"a": range(6), "b": list("xyzxyz"), "c": [0.5 * i for i in range(6)]})
repr(df), str(df.head()), df["a"].sum(), df[df.a > 2]
""",
}


def exercise(modules: list[str]) -> None:
    """Run the exercise of each of ``modules`` that has one (see ``_EXERCISES``); one that fails is skipped."""
    for name in modules:
        if (exercise := _EXERCISES.get(name)) is not None:
            with contextlib.suppress(Exception):
                exec(compile(exercise, f"<exercise {name}>", "exec"), {})
