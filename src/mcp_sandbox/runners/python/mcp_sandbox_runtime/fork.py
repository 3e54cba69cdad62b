"""A session's ``__main__`` carried into a fork: dumped in the source's sandbox, loaded in the fork's.

The host carries the dump as opaque base64 and never unpickles it: only the two sandboxes of the
same tenant do. What is carried: the top-level modules the source imported (imported again),
functions its runs defined (their code marshalled, by value, when they close over nothing) and
every other variable stdlib ``pickle`` can pickle, one by one. What cannot be carried is named
with why (classes defined by a run, generators, open files, over the size budget) and left out.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import importlib
import io
import marshal
import pickle
import sys
import types
from typing import Any

__all__ = ["dump", "load"]

_FORMAT = 1
# Names every run gets again anyway (the library's, code mode's): never carried.
_REBOUND = frozenset({"saved", "mcp", "mcp_servers", "LOADED_MCP_SERVERS"})
_MAX_SKIPPED = 20


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:120]


def _function(value: types.FunctionType) -> tuple[str, bytes, bytes, str] | str:
    """A function a run defined, by value (code, defaults, qualified name); else why it cannot be."""
    if value.__closure__:
        return "a closure: define it again in the fork"
    try:
        defaults = pickle.dumps((value.__defaults__, value.__kwdefaults__), protocol=pickle.HIGHEST_PROTOCOL)
        return value.__name__, marshal.dumps(value.__code__), defaults, value.__qualname__
    except Exception as exc:  # the defaults' own __reduce__ may raise anything
        return _why(exc)


def dump(namespace: dict[str, Any], budget: int, rebound: frozenset[str] = frozenset()) -> str:
    """``namespace`` as base64 of at most about ``budget`` bytes (larger variables are skipped, named)."""
    modules = sorted(
        {name.partition(".")[0] for name in list(sys.modules) if not name.startswith("_") and name != "__main__"}
    )
    functions: list[tuple[str, tuple[str, bytes, bytes, str]]] = []
    values: list[tuple[str, bytes]] = []
    skipped: list[str] = []
    used = 0
    quiet = io.StringIO()  # what objects print while they are pickled: not the dump's
    for name, value in list(namespace.items()):
        if name.startswith("__") or name in _REBOUND or name in rebound or name.startswith("mcp_"):
            continue
        if isinstance(value, types.ModuleType):
            values.append((name, pickle.dumps(("module", value.__name__))))
            continue
        if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            carried = _function(value)
            if isinstance(carried, str):
                skipped.append(f"{name} ({carried})")
            else:
                functions.append((name, carried))
                used += len(carried[1]) + len(carried[2])
            continue
        if isinstance(value, type) and value.__module__ == "__main__":
            skipped.append(f"{name} (a class defined in a run: define it again in the fork)")
            continue
        try:
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                data = pickle.dumps(("value", value), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # an object's __reduce__ may raise anything, even SystemExit
            skipped.append(f"{name} ({_why(exc)})")
            continue
        if used + len(data) > budget:
            skipped.append(f"{name} (over the fork's limit of {budget >> 20} MiB of variables)")
            continue
        used += len(data)
        values.append((name, data))
    payload = {"format": _FORMAT, "modules": modules, "functions": functions, "values": values, "skipped": skipped}
    return base64.b64encode(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def load(state: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Load what :func:`dump` gave into ``namespace``; the report: variables and modules carried, skipped."""
    try:
        # The last line: whatever a background thread of the source wrote first is not the dump.
        payload = pickle.loads(base64.b64decode(state.rstrip("\n").rpartition("\n")[2], validate=True))
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise ValueError("not a snapshot of this runtime")
    except (ValueError, binascii.Error, pickle.UnpicklingError, EOFError) as exc:
        return {"variables": 0, "modules": 0, "skipped": [f"all variables ({_why(exc)})"]}
    skipped: list[str] = list(payload["skipped"])
    quiet = io.StringIO()
    for module in payload["modules"]:
        if module in sys.modules:
            continue
        try:
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                importlib.import_module(module)
        except BaseException:  # a module the fork cannot import is only not imported ahead
            continue
    modules = sum(1 for module in payload["modules"] if module in sys.modules)
    carried = 0
    for name, (fname, code, defaults, qualname) in payload["functions"]:
        try:
            function = types.FunctionType(marshal.loads(code), namespace, fname)
            function.__defaults__, function.__kwdefaults__ = pickle.loads(defaults)
            function.__qualname__ = qualname
            function.__module__ = "__main__"
        except Exception as exc:
            skipped.append(f"{name} ({_why(exc)})")
            continue
        namespace[name] = function
        carried += 1
    for name, data in payload["values"]:
        try:
            kind, value = pickle.loads(data)
            namespace[name] = importlib.import_module(value) if kind == "module" else value
        except Exception as exc:
            skipped.append(f"{name} ({_why(exc)})")
            continue
        carried += 1
    extra = len(skipped) - _MAX_SKIPPED
    skipped = skipped[:_MAX_SKIPPED] + ([f"and {extra} more"] if extra > 0 else [])
    return {"variables": carried, "modules": modules, "skipped": skipped}
