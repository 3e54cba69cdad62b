"""Reading a frame body's fields: each of the expected type, or FrameError naming the field.

The sandbox's frames come from hostile code and the host's from a trusted side; both are checked
the same way, field by field, by the frame classes of ``frames.py``.
"""

from __future__ import annotations

from typing import Any

from .wire import FrameError

__all__ = ["code_of", "int_of", "optional_str_of", "str_of", "strings_of"]


def int_of(body: dict[str, Any], key: str, default: int | None = None) -> int:
    """``body[key]``, a non-negative integer (``default`` when absent, if there is one)."""
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FrameError(f"{key!r} must be a non-negative integer")
    return value


def code_of(body: dict[str, Any], key: str) -> int:
    """``body[key]``, an exit code (any integer)."""
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FrameError(f"{key!r} must be an integer")
    return value


def str_of(body: dict[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise FrameError(f"{key!r} must be a string")
    return value


def optional_str_of(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise FrameError(f"{key!r} must be a string or null")
    return value


def strings_of(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise FrameError(f"{key!r} must be a list of strings")
    return tuple(value)
