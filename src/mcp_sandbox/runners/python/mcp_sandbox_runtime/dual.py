"""Answers that are values and awaitables at once, for code written for the earlier bridge.

There ``await runtime.list_servers()`` and ``await runtime.list_tools(server)`` were coroutines;
here they are plain calls. Their answers are a :class:`DualList` (or :class:`DualStr`): used as
they are, they are this runtime's answer; awaited, they give the earlier bridge's form of the
same answer (fetched from the host without blocking the event loop when it needs another request).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any

__all__ = ["DualList", "DualStr"]

Later = Callable[[], Awaitable[Any]]


def _ready(value: Any) -> Generator[Any, None, Any]:
    """An awaitable's iterator that finishes at once with ``value``."""
    yield from ()  # a generator, so an awaitable's iterator, that never suspends
    return value


def _await(self: Any, later: Later | None, value: Any) -> Generator[Any, None, Any]:
    if later is None:
        return _ready(value)
    return later().__await__()


class DualList(list[Any]):
    """A list; awaited, ``later()``'s result (or the list itself when there is no ``later``)."""

    def __init__(self, items: Iterable[Any], later: Later | None = None) -> None:
        super().__init__(items)
        self._later = later

    def __await__(self) -> Generator[Any, None, Any]:
        return _await(self, self._later, self)


class DualStr(str):
    """A string; awaited, ``later()``'s result."""

    _later: Later | None

    def __new__(cls, text: str, later: Later | None = None) -> DualStr:
        made = super().__new__(cls, text)
        made._later = later
        return made

    def __await__(self) -> Generator[Any, None, Any]:
        return _await(self, self._later, str(self))
