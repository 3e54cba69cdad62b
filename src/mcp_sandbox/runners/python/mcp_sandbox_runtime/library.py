"""The tenant's library inside the sandbox: helpers and memories that later runs use.

Only the host writes the library: these functions ask it. ``save_tool(func)`` keeps a function's
source; later runs (of the same tenant, in any conversation) call it as ``saved.<name>(...)``.
``save_memory(key, value)`` keeps a JSON value; ``load_memory(key)`` reads it back. The library
has a quota (``library_bytes``, ``library_entries``); a write past it raises ``MCPError``
(``kind`` ``denied``).
"""

from __future__ import annotations

import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Any

from .api import _request_sync

__all__ = [
    "SavedTools",
    "delete_memory",
    "delete_tool",
    "list_memories",
    "list_saved_tools",
    "load_memory",
    "load_tool",
    "save_memory",
    "save_tool",
]


def save_tool(func: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> str:
    """Save ``func``'s source so later runs can call it as ``saved.<name>(...)``.

    Raises:
        MCPError: the name is not an identifier, the source cannot be read, or the library is full.
    """
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as error:
        raise TypeError(f"save_tool needs a function defined in source code: {error}") from None
    name = name or func.__name__
    doc = description if description is not None else (inspect.getdoc(func) or "")
    body = {"name": name, "source": source, "language": "python", "description": doc}
    _request_sync("save_tool", body)
    return f"Tool {name!r} saved: later runs call it as saved.{name}(...)."


def load_tool(name: str) -> Callable[..., Any]:
    """The saved tool ``name``, loaded from its source.

    Raises:
        AttributeError: there is no saved Python tool ``name``.
    """
    found = _request_sync("load_tool", {"name": name})
    if found is None or found.get("language") != "python":
        raise AttributeError(f"no saved Python tool {name!r} (list_saved_tools() lists them)")
    namespace: dict[str, Any] = {"__name__": f"saved.{name}"}
    exec(compile(found["source"], f"<saved {name}>", "exec"), namespace)
    function = namespace.get(name)
    if not callable(function):
        raise AttributeError(f"the saved source of {name!r} defines no function {name!r}")
    loaded: Callable[..., Any] = function
    return loaded


class SavedTools(types.ModuleType):
    """``saved``: the tenant's saved tools, loaded on first use in a run."""

    def __init__(self) -> None:
        super().__init__("saved", "The tenant's saved tools: saved.<name>(...); list_saved_tools() lists them.")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        function = load_tool(name)
        setattr(self, name, function)
        return function

    def __dir__(self) -> list[str]:
        return sorted(tool["name"] for tool in list_saved_tools() if tool["language"] == "python")


def list_saved_tools() -> list[dict[str, Any]]:
    """``[{"name", "language", "description"}]`` of every saved tool."""
    result: list[dict[str, Any]] = _request_sync("list_saved_tools", {})
    return result


def delete_tool(name: str) -> bool:
    """Delete the saved tool ``name``; whether there was one."""
    return bool(_request_sync("delete_tool", {"name": name}))


def save_memory(key: str, value: Any) -> None:
    """Keep ``value`` (JSON: dicts, lists, strings, numbers, booleans, None) under ``key`` for later runs."""
    _request_sync("save_memory", {"key": key, "value": value})


def load_memory(key: str, default: Any = None) -> Any:
    """The value saved under ``key``, or ``default``."""
    found = _request_sync("load_memory", {"key": key})
    return found["value"] if found["found"] else default


def list_memories() -> list[str]:
    """The keys of every memory."""
    result: list[str] = _request_sync("list_memories", {})
    return result


def delete_memory(key: str) -> bool:
    """Delete the memory ``key``; whether there was one."""
    return bool(_request_sync("delete_memory", {"key": key}))
