"""A call's arguments read: validated by its tool's model, a refusal said by the argument's wire name.

A refused call becomes a :class:`~mcp_sandbox.errors.ValidationError` naming the first wrong
argument by its wire name (``conversationId``, not ``conversation``), an unknown argument first,
in words a model reads (the value itself is never repeated for a type error: an environment
value may be a secret). ``outputMode`` is read on its own, leniently, so that even a refusal
renders in the mode the caller asked for. The models are :mod:`.arguments`.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any, TypeVar

import pydantic
from pydantic_core import ErrorDetails

from mcp_sandbox.config import OUTPUT_MODES, OutputMode
from mcp_sandbox.errors import ValidationError
from mcp_sandbox.server.tools.arguments import CallContext, ToolArguments

__all__ = ["output_mode", "parse"]

_Arguments = TypeVar("_Arguments", bound=ToolArguments)

# What a pydantic error type means, said the way a model reads it; the value itself is never
# repeated for these (an environment value may be a secret).
_TYPE_MESSAGES = {
    "missing": "is required",
    "string_type": "must be a string",
    "bytes_type": "must be a string",
    "bool_type": "must be true, false or null",
    "float_type": "must be a number",
    "int_type": "must be an integer",
    "list_type": "must be a list",
    "dict_type": "must be an object",
}


def _message(error: ErrorDetails, model: type[ToolArguments]) -> str:
    kind, value, ctx = error["type"], error["input"], error.get("ctx", {})
    if kind == "extra_forbidden":
        expected = sorted(field.alias or name for name, field in model.model_fields.items())
        return (
            f"unknown argument (expected one of: {', '.join(expected)})"
            if expected
            else "unknown argument (none taken)"
        )
    if kind == "value_error":
        return str(ctx["error"])
    if kind in _TYPE_MESSAGES:
        message = _TYPE_MESSAGES[kind]
        return message if kind == "missing" else f"{message}, not {_json_type(value)}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {reprlib.repr(value)}"
    if kind in ("greater_than_equal", "less_than_equal"):
        return f"must be from {_bound(model, error, 'ge')} to {_bound(model, error, 'le')}, got {value!r}"
    return error["msg"]


def _bound(model: type[ToolArguments], error: ErrorDetails, bound: str) -> object:
    """The ``ge``/``le`` bound declared on the field ``error`` is about."""
    for name, field in model.model_fields.items():
        if (field.alias or name) == error["loc"][0]:
            for constraint in field.metadata:
                if hasattr(constraint, bound):
                    return getattr(constraint, bound)
    return "?"


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def parse(model: type[_Arguments], arguments: Mapping[str, Any] | None, context: CallContext) -> _Arguments:
    """Validate a call's ``arguments`` with ``model``.

    Raises:
        ValidationError: naming the first wrong argument (an unknown one first) by its wire name.
    """
    try:
        return model.model_validate(arguments or {}, context=context)
    except pydantic.ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
        first = errors[0]
        argument, *inner = first["loc"] or ("arguments",)
        where = "".join(f"item {part}: " if isinstance(part, int) else f"{part}: " for part in inner)
        raise ValidationError(str(argument), where + _message(first, model)) from exc


def output_mode(arguments: Mapping[str, Any] | None, configured: OutputMode) -> OutputMode:
    """The requested ``outputMode``, or ``configured`` when it is absent or invalid.

    Read on its own, leniently, so that even a validation error renders in the mode the caller asked for.
    """
    raw = (arguments or {}).get("outputMode")
    if raw in OUTPUT_MODES:
        mode: OutputMode = raw
        return mode
    return configured
