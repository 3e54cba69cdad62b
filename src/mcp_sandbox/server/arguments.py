"""Validation of tool arguments: every problem becomes a ValidationError naming the argument."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from mcp_sandbox.config import OUTPUT_MODES, OutputMode, Settings
from mcp_sandbox.errors import ValidationError

__all__ = ["RunPythonArguments", "output_mode", "parse_run_python", "parse_search_tools"]

_MAX_CODE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RunPythonArguments:
    code: str
    timeout: float
    servers: tuple[str, ...]
    output_mode: OutputMode


def _check_known(arguments: Mapping[str, Any], allowed: Collection[str]) -> None:
    unknown = sorted(set(arguments) - set(allowed))
    if unknown:
        raise ValidationError(unknown[0], f"unknown argument (expected one of: {', '.join(sorted(allowed))})")


def _code(arguments: Mapping[str, Any]) -> str:
    if "code" not in arguments:
        raise ValidationError("code", "is required")
    code = arguments["code"]
    if not isinstance(code, str):
        raise ValidationError("code", f"must be a string, not {type(code).__name__}")
    if not code.strip():
        raise ValidationError("code", "must not be empty")
    if len(code.encode("utf-8", errors="surrogatepass")) > _MAX_CODE_BYTES:
        raise ValidationError("code", f"is larger than {_MAX_CODE_BYTES} bytes")
    if "\x00" in code:
        raise ValidationError("code", "must not contain NUL characters")
    return code


def _timeout(arguments: Mapping[str, Any], settings: Settings) -> float:
    raw = arguments.get("timeout")
    if raw is None:
        return settings.timeout
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValidationError("timeout", f"must be a number of seconds, not {type(raw).__name__}")
    timeout = float(raw)
    if not math.isfinite(timeout) or timeout <= 0 or timeout > settings.max_timeout:
        raise ValidationError("timeout", f"must be > 0 and <= {settings.max_timeout:g} seconds, got {raw}")
    return timeout


def _servers(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    raw = arguments.get("servers")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise ValidationError("servers", "must be a list of server names")
    return tuple(dict.fromkeys(raw))


def output_mode(arguments: Mapping[str, Any] | None, settings: Settings) -> OutputMode:
    """The requested ``outputMode``, or the configured one when it is absent or invalid.

    Read on its own so that even a validation error renders in the mode the caller asked for.
    """
    try:
        return _output_mode(arguments or {}, settings)
    except ValidationError:
        return settings.output_mode


def _output_mode(arguments: Mapping[str, Any], settings: Settings) -> OutputMode:
    raw = arguments.get("outputMode")
    if raw is None:
        return settings.output_mode
    if raw not in OUTPUT_MODES:
        raise ValidationError("outputMode", f"must be one of {', '.join(OUTPUT_MODES)}, got {raw!r}")
    mode: OutputMode = raw
    return mode


def parse_run_python(arguments: Mapping[str, Any] | None, settings: Settings) -> RunPythonArguments:
    """Check ``run_python``'s arguments (whether the servers exist is the bridge's to say).

    Raises:
        ValidationError: an argument is missing, of the wrong type, out of range or unknown.
    """
    arguments = arguments or {}
    _check_known(arguments, ("code", "servers", "timeout", "outputMode"))
    return RunPythonArguments(
        code=_code(arguments),
        timeout=_timeout(arguments, settings),
        servers=_servers(arguments),
        output_mode=_output_mode(arguments, settings),
    )


_DETAILS = ("name", "summary", "full")
_MAX_SEARCH_RESULTS = 50


def parse_search_tools(arguments: Mapping[str, Any] | None) -> tuple[str, str, int]:
    """Check ``search_tools``'s arguments: (query, detail, limit).

    Raises:
        ValidationError: an argument is missing, of the wrong type, out of range or unknown.
    """
    arguments = arguments or {}
    _check_known(arguments, ("query", "detail", "limit"))
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValidationError("query", "must be a non-empty string")
    detail = arguments.get("detail", "summary")
    if detail not in _DETAILS:
        raise ValidationError("detail", f"must be one of {', '.join(_DETAILS)}, got {detail!r}")
    limit = arguments.get("limit", 10)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_SEARCH_RESULTS:
        raise ValidationError("limit", f"must be an integer from 1 to {_MAX_SEARCH_RESULTS}, got {limit!r}")
    return query, detail, limit
