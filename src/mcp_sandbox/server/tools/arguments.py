"""Each tool's arguments as one pydantic model: the input schema clients see and the validation calls go through.

Every model refuses unknown arguments, and every optional argument takes ``null`` as "not given".
A call's arguments are read through a model by :func:`.parsing.parse`. What depends on the
deployment (the largest timeout, the languages) comes in a :class:`CallContext`, which
``schemas.py`` also reads for the schema, so the two say the same thing.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import pydantic
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from mcp_sandbox.bridge.search import MAX_SEARCH_RESULTS, Detail
from mcp_sandbox.config import OutputMode
from mcp_sandbox.egress import check_pattern
from mcp_sandbox.errors import ValidationError
from mcp_sandbox.workspace import check_conversation_id, check_filename
from mcp_sandbox.workspace.checkpoints import check_checkpoint_name

__all__ = [
    "CallContext",
    "EnvironmentVariable",
    "ListRunnersArguments",
    "RunArguments",
    "RunCodeArguments",
    "RunPythonArguments",
    "SearchToolsArguments",
    "ToolArguments",
    "UploadFileArguments",
]

_MAX_CODE_BYTES = 1 << 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MAX_ENV_VARS = 128
_MAX_ENV_BYTES = 64 << 10
_MAX_NETWORK_PATTERNS = 32


@dataclass(frozen=True, slots=True)
class CallContext:
    """What validation and the schemas take from the deployment."""

    max_timeout: float
    languages: tuple[str, ...]
    network: bool = False  # whether some tenant may be granted network (the tool description says so)


def _context(info: ValidationInfo) -> CallContext:
    context = info.context
    if not isinstance(context, CallContext):
        raise TypeError("these arguments are validated with parse(), which passes a CallContext")
    return context


def _code(code: str) -> str:
    if not code.strip():
        raise ValueError("must not be empty")
    if len(code.encode("utf-8", errors="surrogatepass")) > _MAX_CODE_BYTES:
        raise ValueError(f"is larger than {_MAX_CODE_BYTES} bytes")
    if "\x00" in code:
        raise ValueError("must not contain NUL characters")
    return code


def _conversation(value: str) -> str:
    try:
        return check_conversation_id(value)
    except ValidationError as exc:
        raise ValueError(exc.message) from exc


def _filename(value: str) -> str:
    try:
        return check_filename(value)
    except ValidationError as exc:
        raise ValueError(exc.message) from exc


def _checkpoint_name(value: str) -> str:
    try:
        return check_checkpoint_name("checkpoint", value)
    except ValidationError as exc:
        raise ValueError(exc.message) from exc


def _checkpoint_or_deleted(value: str) -> str:
    return "-" + _checkpoint_name(value[1:]) if value.startswith("-") else _checkpoint_name(value)


def _reset(value: bool | str) -> bool | str:
    return value if isinstance(value, bool) else _checkpoint_name(value)


def _deduplicated(servers: list[str]) -> list[str]:
    return list(dict.fromkeys(servers))


def _network(network: bool | list[str]) -> bool | list[str]:
    """``true``, ``false``, or a list of domain patterns (checked here; what is allowed, by the tenant's rules)."""
    if isinstance(network, bool):
        return network
    if not network:
        raise ValueError("must be true, false or a non-empty list of domain patterns")
    if len(network) > _MAX_NETWORK_PATTERNS:
        raise ValueError(f"names more than {_MAX_NETWORK_PATTERNS} patterns")
    for pattern in network:
        check_pattern(pattern)  # its ValueError names the pattern
    return list(dict.fromkeys(network))


class EnvironmentVariable(BaseModel):
    """One ``{name, value}`` of ``run_code``'s ``environment`` list."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str
    value: str


def _pairs(environment: object) -> object:
    """The earlier code runner's object of names to values, as the list the schema shows."""
    if isinstance(environment, Mapping):
        return [{"name": name, "value": value} for name, value in environment.items()]
    return environment


def _environment(pairs: list[EnvironmentVariable]) -> list[EnvironmentVariable]:
    environment: dict[str, str] = {}
    for pair in pairs:
        if pair.name in environment:
            raise ValueError(f"names {pair.name!r} twice")
        environment[pair.name] = pair.value
    if len(environment) > _MAX_ENV_VARS:
        raise ValueError(f"has more than {_MAX_ENV_VARS} variables")
    size = 0
    for name, value in environment.items():
        # Names only: values may be secrets and never appear in a message, a log or the database.
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid variable name")
        if "\x00" in value:
            raise ValueError(f"the value of {name} must be a string without NUL")
        size += len(name) + len(value.encode("utf-8", errors="surrogatepass"))
    if size > _MAX_ENV_BYTES:
        raise ValueError(f"is larger than {_MAX_ENV_BYTES} bytes")
    return pairs


def _base64(content: object) -> object:
    if not isinstance(content, str):
        return content  # the bytes validator refuses it, naming the type
    try:
        return base64.b64decode("".join(content.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"is not valid base64 ({exc})") from exc


class ToolArguments(BaseModel):
    """The arguments of one tool. ``null`` for an optional argument means it was not given."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        required = {field.alias or name for name, field in cls.model_fields.items() if field.is_required()}
        return {key: value for key, value in data.items() if value is not None or key in required}


class RunArguments(ToolArguments):
    """What ``run_python`` and ``run_code`` share."""

    code: Annotated[str, AfterValidator(_code)]
    conversation: Annotated[str | None, AfterValidator(_conversation)] = Field(
        None, alias="conversationId", description="Keeps files and variables"
    )
    # True: a fresh interpreter; a checkpoint's name: the conversation's files and variables as saved
    # then (with forkFrom: the source's checkpoint, which the new conversation starts from).
    reset: Annotated[bool | str, AfterValidator(_reset), WithJsonSchema({"type": ["boolean", "string"]})] = Field(
        False, description="Fresh, or a checkpoint"
    )
    # Undescribed: the name says it, and a misuse is refused with what it needs (see below).
    fork_from: Annotated[str | None, AfterValidator(_conversation)] = Field(None, alias="forkFrom")
    servers: Annotated[list[str], AfterValidator(_deduplicated)] = []
    timeout: float | None = Field(None, description="Seconds")  # schemas.py adds the context's maximum
    output_mode: OutputMode | None = Field(None, alias="outputMode")
    # One type list rather than anyOf, which strict function-calling schemas handle badly.
    network: Annotated[
        bool | list[str],
        AfterValidator(_network),
        WithJsonSchema({"type": ["boolean", "array"], "items": {"type": "string"}}),
    ] = False  # true or domain patterns; the tool description says whether network can be granted

    @field_validator("reset")
    @classmethod
    def _reset_needs_a_conversation(cls, reset: bool, info: ValidationInfo) -> bool:
        if reset and info.data.get("conversation") is None:
            raise ValueError("needs a conversationId (runs without one always start fresh)")
        return reset

    @field_validator("fork_from")
    @classmethod
    def _fork_needs_a_conversation(cls, fork_from: str | None, info: ValidationInfo) -> str | None:
        if fork_from is not None and info.data.get("conversation") is None:
            raise ValueError("needs a conversationId: the new conversation the fork makes")
        if fork_from is not None and fork_from == info.data.get("conversation"):
            raise ValueError("must name another conversation than conversationId, which must be new")
        return fork_from

    @property
    def restore(self) -> str | None:
        """The checkpoint ``reset`` names, if it names one."""
        return self.reset if isinstance(self.reset, str) else None

    @field_validator("timeout")
    @classmethod
    def _timeout_positive(cls, timeout: float | None) -> float | None:
        # Above the maximum is not refused: the run gets the maximum, and its result says so.
        if timeout is not None and not (math.isfinite(timeout) and 0 < timeout):
            raise ValueError(f"must be a number of seconds > 0, got {timeout:g}")
        return timeout

    def timeout_within(self, default: float, limit: float) -> tuple[float, float | None]:
        """The run's time limit: ``timeout`` (or ``default``) at most ``limit``; and what was asked, if clamped."""
        if self.timeout is None:
            return default, None
        return (limit, self.timeout) if self.timeout > limit else (self.timeout, None)


class RunPythonArguments(RunArguments):
    # A name to save the conversation's files and variables as, before the code runs (run_python
    # only, for tools/list's tokens: a conversation is the same for both tools, and only Python's
    # interpreter has variables to keep). "-<name>" deletes that checkpoint instead (no name begins
    # with "-"): a value form, free in tools/list (the error at max_checkpoints tells of it).
    checkpoint: Annotated[str | None, AfterValidator(_checkpoint_or_deleted)] = None

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_needs_a_conversation(cls, checkpoint: str | None, info: ValidationInfo) -> str | None:
        if checkpoint is not None and info.data.get("conversation") is None:
            raise ValueError("needs a conversationId: the conversation to save")
        if checkpoint is not None and info.data.get("fork_from") is not None:
            raise ValueError("cannot be saved in a fork's first call: save it in the fork's next call")
        return checkpoint


class RunCodeArguments(RunArguments):
    language: str  # its enum is added by schemas.py, from the same CallContext
    reset: bool = False  # a checkpoint is restored by run_python (the same conversation), for tools/list's tokens
    # Shown as a list of {name, value} (strict function-calling schemas cannot say "an object of any
    # keys"); the earlier code runner's {name: value} object is accepted too.
    environment: Annotated[
        list[EnvironmentVariable],
        BeforeValidator(_pairs, json_schema_input_type=list[EnvironmentVariable]),
        AfterValidator(_environment),
    ] = []

    def variables(self) -> dict[str, str]:
        """``environment`` as names to values."""
        return {pair.name: pair.value for pair in self.environment}

    @field_validator("language")
    @classmethod
    def _known_language(cls, language: str, info: ValidationInfo) -> str:
        languages = _context(info).languages
        if language not in languages:
            raise ValueError(f"must be one of {', '.join(languages)}, got {reprlib.repr(language)}")
        return language


class UploadFileArguments(ToolArguments):
    conversation: Annotated[str, AfterValidator(_conversation)] = Field(alias="conversationId")
    filename: Annotated[str, AfterValidator(_filename)]  # a refusal says what a filename may be
    content: Annotated[bytes, BeforeValidator(_base64, json_schema_input_type=str)] = Field(description="Base64")


class ListRunnersArguments(ToolArguments):
    pass


class SearchToolsArguments(ToolArguments):
    query: str
    detail: Detail = "summary"
    limit: int = Field(10, ge=1, le=MAX_SEARCH_RESULTS)

    @field_validator("query")
    @classmethod
    def _not_blank(cls, query: str) -> str:
        if not query.strip():
            raise ValueError("must not be empty")
        return query
