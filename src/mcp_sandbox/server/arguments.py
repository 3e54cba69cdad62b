"""Validation of tool arguments: every problem becomes a ValidationError naming the argument."""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mcp_sandbox.config import OUTPUT_MODES, OutputMode, Settings
from mcp_sandbox.errors import ValidationError
from mcp_sandbox.workspace import check_conversation_id, check_filename

__all__ = [
    "RunArguments",
    "UploadArguments",
    "output_mode",
    "parse_run",
    "parse_search_tools",
    "parse_upload_file",
]

_MAX_CODE_BYTES = 1 << 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MAX_ENV_VARS = 128
_MAX_ENV_BYTES = 64 << 10
_NETWORK_REFUSED = (
    "network access is not available: sandboxes have no network (controlled egress is planned; "
    "sharing the host's network would expose the server's own ports)"
)

_RUN_PYTHON_ARGUMENTS = ("code", "servers", "timeout", "conversationId", "reset", "outputMode")
_RUN_CODE_ARGUMENTS = (*_RUN_PYTHON_ARGUMENTS, "language", "network", "environment")


@dataclass(frozen=True, slots=True)
class RunArguments:
    """The checked arguments of ``run_python`` and ``run_code``."""

    code: str
    timeout: float
    servers: tuple[str, ...]
    output_mode: OutputMode
    language: str = "python"
    conversation: str | None = None
    reset: bool = False
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class UploadArguments:
    conversation: str
    filename: str
    content: bytes


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


def _flag(arguments: Mapping[str, Any], name: str) -> bool:
    raw = arguments.get(name, False)
    if not isinstance(raw, bool):
        raise ValidationError(name, f"must be true or false, not {type(raw).__name__}")
    return raw


def _environment(arguments: Mapping[str, Any]) -> Mapping[str, str]:
    raw = arguments.get("environment")
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, dict):
        raise ValidationError("environment", "must be an object of variable names to string values")
    if len(raw) > _MAX_ENV_VARS:
        raise ValidationError("environment", f"has more than {_MAX_ENV_VARS} variables")
    size = 0
    for name, value in raw.items():
        # Name only: values may be secrets and never appear in a message, a log or the database.
        if not _ENV_NAME.match(name):
            raise ValidationError("environment", f"{name!r} is not a valid variable name")
        if not isinstance(value, str) or "\x00" in value:
            raise ValidationError("environment", f"the value of {name} must be a string without NUL")
        size += len(name) + len(value.encode("utf-8", errors="surrogatepass"))
    if size > _MAX_ENV_BYTES:
        raise ValidationError("environment", f"is larger than {_MAX_ENV_BYTES} bytes")
    return MappingProxyType(dict(raw))


def _conversation(arguments: Mapping[str, Any]) -> str | None:
    raw = arguments.get("conversationId")
    return None if raw is None else check_conversation_id(raw)


def parse_run(
    arguments: Mapping[str, Any] | None, settings: Settings, *, tool: str, languages: Collection[str]
) -> RunArguments:
    """Check the arguments of ``run_python`` or ``run_code`` (whether servers exist is the bridge's to say).

    Raises:
        ValidationError: an argument is missing, of the wrong type, out of range or unknown.
    """
    arguments = arguments or {}
    _check_known(arguments, _RUN_CODE_ARGUMENTS if tool == "run_code" else _RUN_PYTHON_ARGUMENTS)
    language = "python"
    if tool == "run_code":
        language = arguments.get("language")  # type: ignore[assignment]
        if language not in languages:
            raise ValidationError("language", f"must be one of {', '.join(sorted(languages))}, got {language!r}")
        if _flag(arguments, "network"):
            raise ValidationError("network", _NETWORK_REFUSED)
    conversation = _conversation(arguments)
    reset = _flag(arguments, "reset")
    if reset and conversation is None:
        raise ValidationError("reset", "needs a conversationId (runs without one always start fresh)")
    return RunArguments(
        code=_code(arguments),
        timeout=_timeout(arguments, settings),
        servers=_servers(arguments),
        output_mode=_output_mode(arguments, settings),
        language=language,
        conversation=conversation,
        reset=reset,
        environment=_environment(arguments),
    )


def parse_upload_file(arguments: Mapping[str, Any] | None) -> UploadArguments:
    """Check ``upload_file``'s arguments; ``content`` is decoded from base64.

    Raises:
        ValidationError: an argument is missing, of the wrong type, or not valid base64.
    """
    arguments = arguments or {}
    _check_known(arguments, ("conversationId", "filename", "content"))
    if "conversationId" not in arguments:
        raise ValidationError("conversationId", "is required")
    conversation = check_conversation_id(arguments["conversationId"])
    filename = arguments.get("filename")
    if not isinstance(filename, str):
        raise ValidationError("filename", "is required (a relative path such as data.csv or input/a.txt)")
    filename = check_filename(filename, "filename")
    content = arguments.get("content")
    if not isinstance(content, str):
        raise ValidationError("content", "is required: the file's bytes, base64-encoded")
    try:
        data = base64.b64decode("".join(content.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValidationError("content", f"is not valid base64 ({exc})") from exc
    return UploadArguments(conversation, filename, data)


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
