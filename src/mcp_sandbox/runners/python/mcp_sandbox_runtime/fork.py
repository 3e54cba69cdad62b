"""A session's ``__main__`` carried into a fork: dumped in the source's sandbox, loaded in the fork's.

The host carries the dump as opaque bytes and never unpickles it: only the two sandboxes of the
same tenant do. What is carried: the top-level modules the source imported (imported again),
functions and classes its runs defined (by value: their code marshalled, what their closures hold
pickled, a class's methods and attributes one by one; an instance of such a class pickles by
reference to it, so classes are loaded before values) and every other variable stdlib ``pickle``
can pickle, one by one, its large buffers (an array's data) kept out of its pickle and written from
their own memory (the layout: ``snapshot.py``). What cannot be carried is named with why (generators, open files,
threads, a class with a metaclass of its own, over the size budget) and left out. A parked
session's state (the host's ``engine/parking.py``) is the same dump.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import marshal
import pickle
import sys
import types
from typing import Any

from . import snapshot

__all__ = ["dump", "load"]

# 3: out-of-band buffers (``snapshot.py``); 2, the earlier layout, is still loaded.
_FORMAT = 3
_FORMATS = (2, 3)
# Names every run gets again anyway (the library's, code mode's): never carried.
_REBOUND = frozenset({"saved", "mcp", "mcp_servers", "LOADED_MCP_SERVERS"})
_MAX_SKIPPED = 20
# A buffer smaller than this stays inside its variable's pickle.
_OUT_OF_BAND = 64 << 10


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:120]


# A function by value: name, marshalled code, pickled defaults, qualified name, and its closure's
# cells (None: the class it is a method of, for zero-argument super(); else the cell's value pickled).
Carried = tuple[str, bytes, bytes, str, tuple[bytes | None, ...]]


def _function(value: types.FunctionType, owner: type | None = None) -> Carried | str:
    """A function a run defined, by value; else why it cannot be. ``owner``: the class it is a method of."""
    cells: list[bytes | None] = []
    try:
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or (), strict=True):
            contents = cell.cell_contents
            if owner is not None and name == "__class__" and contents is owner:
                cells.append(None)
            else:
                cells.append(pickle.dumps(contents, protocol=pickle.HIGHEST_PROTOCOL))
        defaults = pickle.dumps((value.__defaults__, value.__kwdefaults__), protocol=pickle.HIGHEST_PROTOCOL)
        return value.__name__, marshal.dumps(value.__code__), defaults, value.__qualname__, tuple(cells)
    except ValueError:  # an empty cell
        return "a closure over a name not yet bound: define it again"
    except Exception as exc:  # the defaults' own __reduce__ may raise anything
        return _why(exc)


def _rebuilt(carried: Carried, namespace: dict[str, Any], owner: type | None = None) -> types.FunctionType:
    """The function :func:`_function` carried, its globals ``namespace``."""
    fname, code, defaults, qualname, cells = carried
    closure = tuple(types.CellType(owner) if cell is None else types.CellType(pickle.loads(cell)) for cell in cells)
    function = types.FunctionType(marshal.loads(code), namespace, fname, None, closure or None)
    function.__defaults__, function.__kwdefaults__ = pickle.loads(defaults)
    function.__qualname__ = qualname
    function.__module__ = "__main__"
    return function


_SKIPPED_ATTRIBUTES = frozenset({"__dict__", "__weakref__"})


def _class(value: type, namespace: dict[str, Any]) -> tuple[str, list[Any], list[Any]] | str:
    """A class a run defined, by value (its bases by name or reference, its attributes); else why not."""
    if type(value) is not type:
        return "a class with a metaclass of its own: define it again"
    bases: list[Any] = []
    for base in value.__bases__:
        if base.__module__ == "__main__":
            if namespace.get(base.__name__) is not base:
                return f"its base {base.__name__} is not a variable of the session"
            bases.append(("main", base.__name__))
        else:
            try:
                bases.append(("ref", pickle.dumps(base, protocol=pickle.HIGHEST_PROTOCOL)))
            except Exception as exc:
                return _why(exc)
    attributes: list[Any] = []
    for name, attribute in value.__dict__.items():
        if name in _SKIPPED_ATTRIBUTES:
            continue
        kind, inner = "value", attribute
        if isinstance(attribute, (staticmethod, classmethod)):
            kind, inner = type(attribute).__name__, attribute.__func__
        if isinstance(inner, types.FunctionType):
            carried = _function(inner, value)
            if isinstance(carried, str):
                return f"its {name}: {carried}"
            attributes.append((name, "function" if kind == "value" else kind, carried))
            continue
        if isinstance(attribute, property):
            pair = (attribute.fget, attribute.fset)
            accessors = [_function(f, value) if isinstance(f, types.FunctionType) else f for f in pair]
            if any(accessor is not None and not isinstance(accessor, tuple) for accessor in accessors):
                return f"its property {name} cannot be carried"
            attributes.append((name, "property", accessors))
            continue
        try:
            attributes.append((name, "value", pickle.dumps(attribute, protocol=pickle.HIGHEST_PROTOCOL)))
        except Exception as exc:
            return f"its {name}: {_why(exc)}"
    return value.__qualname__, bases, attributes


def _load_class(carried: tuple[str, list[Any], list[Any]], name: str, namespace: dict[str, Any]) -> type:
    qualname, bases, attributes = carried
    resolved = tuple(namespace[ref] if kind == "main" else pickle.loads(ref) for kind, ref in bases)
    cls = types.new_class(name, resolved)
    for attribute, kind, data in attributes:
        if kind == "value":
            if attribute not in ("__module__", "__qualname__"):
                setattr(cls, attribute, pickle.loads(data))
        elif kind == "function":
            setattr(cls, attribute, _rebuilt(data, namespace, cls))
        elif kind in ("staticmethod", "classmethod"):
            wrapper = staticmethod if kind == "staticmethod" else classmethod
            setattr(cls, attribute, wrapper(_rebuilt(data, namespace, cls)))
        else:  # a property
            fget, fset = (None if f is None else _rebuilt(f, namespace, cls) for f in data)
            setattr(cls, attribute, property(fget, fset))
    cls.__module__, cls.__qualname__ = "__main__", qualname
    return cls


def _pickled(value: Any, quiet: io.StringIO) -> tuple[bytes, list[memoryview]]:
    """``value``'s pickle and its large contiguous buffers, kept out of it (not copied)."""
    buffers: list[memoryview] = []

    def take(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: pickled in band
            return True
        if raw.nbytes < _OUT_OF_BAND:
            return True
        buffers.append(raw)
        return False

    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        data = pickle.dumps(("value", value), protocol=5, buffer_callback=take)
    return data, buffers


def dump(namespace: dict[str, Any], budget: int, rebound: frozenset[str] = frozenset()) -> list[memoryview | bytes]:
    """``namespace`` as bytes, at most about ``budget`` of them (larger variables are skipped, named):
    the pieces to write one after the other (the variables' buffers are views of their memory)."""
    modules = sorted(
        {name.partition(".")[0] for name in list(sys.modules) if not name.startswith("_") and name != "__main__"}
    )
    functions: list[tuple[str, Carried]] = []
    classes: list[tuple[str, tuple[str, list[Any], list[Any]]]] = []
    values: list[tuple[str, bytes, list[memoryview]]] = []
    skipped: list[str] = []
    used = 0
    quiet = io.StringIO()  # what objects print while they are pickled: not the dump's
    for name, value in list(namespace.items()):
        if name.startswith("__") or name in _REBOUND or name in rebound or name.startswith("mcp_"):
            continue
        if isinstance(value, types.ModuleType):
            values.append((name, pickle.dumps(("module", value.__name__)), []))
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
            made = _class(value, namespace)
            if isinstance(made, str):
                skipped.append(f"{name} ({made})")
            else:
                classes.append((name, made))
            continue
        try:
            data, buffers = _pickled(value, quiet)
        except BaseException as exc:  # an object's __reduce__ may raise anything, even SystemExit
            skipped.append(f"{name} ({_why(exc)})")
            continue
        size = len(data) + sum(buffer.nbytes for buffer in buffers)
        if used + size > budget:
            skipped.append(f"{name} (over the limit of {budget >> 20} MiB of variables)")
            continue
        used += size
        values.append((name, data, buffers))
    payload = {
        "format": _FORMAT,
        "modules": modules,
        "classes": classes,
        "functions": functions,
        "values": [(name, len(data), len(buffers)) for name, data, buffers in values],
        "skipped": skipped,
    }
    index = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    buffers = [buffer for _, _, taken in values for buffer in taken]
    return snapshot.pack(buffers, [data for _, data, _ in values], index)


def load(state: snapshot.Unpacked | bytes | memoryview, namespace: dict[str, Any]) -> dict[str, Any]:
    """Load what :func:`dump` gave (read with :func:`.snapshot.read`, or whole in memory) into
    ``namespace``; the report: variables and modules carried, skipped."""
    try:
        unpacked = state if isinstance(state, snapshot.Unpacked) else snapshot.unpack(state)
        payload = pickle.loads(unpacked.index)
        if not isinstance(payload, dict) or payload.get("format") not in _FORMATS:
            raise ValueError("not a snapshot of this runtime")
    except (ValueError, pickle.UnpicklingError, EOFError) as exc:
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
    for name, made in payload["classes"]:  # in the order defined: a base before the classes built on it
        try:
            namespace[name] = _load_class(made, name, namespace)
        except Exception as exc:
            skipped.append(f"{name} ({_why(exc)})")
            continue
        carried += 1
    for name, function in payload["functions"]:
        try:
            namespace[name] = _rebuilt(function, namespace)
        except Exception as exc:
            skipped.append(f"{name} ({_why(exc)})")
            continue
        carried += 1
    offset, taken = 0, 0
    for name, size, *count in payload["values"]:  # format 2 has no buffer count
        buffers = unpacked.buffers[taken : taken + (count[0] if count else 0)]
        data, offset, taken = unpacked.values[offset : offset + size], offset + size, taken + len(buffers)
        try:
            kind, value = pickle.loads(data, buffers=buffers)
            namespace[name] = importlib.import_module(value) if kind == "module" else value
        except Exception as exc:
            skipped.append(f"{name} ({_why(exc)})")
            continue
        carried += 1
    extra = len(skipped) - _MAX_SKIPPED
    skipped = skipped[:_MAX_SKIPPED] + ([f"and {extra} more"] if extra > 0 else [])
    return {"variables": carried, "modules": modules, "skipped": skipped}
