"""Every tool's input schema converts to the strict form agent frameworks use for function calling.

OpenAI-style strict mode: every object lists all its properties in ``required`` and refuses others
(``additionalProperties: false``); an optional property becomes nullable, and a model fills it
with null. The conversion must keep the meaning: a call in strict form (optionals null) validates
exactly as the same call without them.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from mcp_sandbox.errors import ValidationError
from mcp_sandbox.server.tools.parsing import parse

from ..tool_declarations import CONTEXT, SAMPLES, TOOLS, required

# The keywords strict mode accepts (of those a tool's schema could use).
STRICT_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "enum", "description", "minimum", "maximum"}
)


class NotExpressible(Exception):
    """Strict mode cannot say this: an object open to any keys (a map)."""


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema["type"]
    kinds = kind if isinstance(kind, list) else [kind]
    if "null" in kinds:
        return schema
    nullable = {**schema, "type": [*kinds, "null"]}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def to_strict(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``schema`` in strict form, and the optional properties left out because strict mode cannot say them.

    Raises:
        NotExpressible: a required property, or an item schema, is a map.
    """
    strict = {key: value for key, value in schema.items() if key not in ("properties", "required", "items")}
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if "object" in kinds:
        if schema.get("additionalProperties") is not False:
            raise NotExpressible("an object open to any keys")
        properties: dict[str, Any] = {}
        left_out: list[str] = []
        for name, prop in schema["properties"].items():
            optional = name not in schema.get("required", [])
            try:
                converted, _ = to_strict(prop)
            except NotExpressible:
                if not optional:
                    raise
                left_out.append(name)
                continue
            properties[name] = _nullable(converted) if optional else converted
        strict.update(properties=properties, required=list(properties), additionalProperties=False)
        return strict, left_out
    if "items" in schema:
        strict["items"], _ = to_strict(schema["items"])
    return strict, []


def check_strict(schema: dict[str, Any]) -> None:
    """Fail unless ``schema`` is valid strict form."""
    assert set(schema) <= STRICT_KEYWORDS, set(schema) - STRICT_KEYWORDS
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if "enum" in schema:
        assert ("null" in kinds) == (None in schema["enum"])
    if "object" in kinds:
        assert schema["additionalProperties"] is False
        assert schema["required"] == list(schema["properties"])
        for prop in schema["properties"].values():
            check_strict(prop)
    if "array" in kinds:
        check_strict(schema["items"])


def _strict(tool: str) -> tuple[dict[str, Any], list[str]]:
    return to_strict(TOOLS[tool][0].input_schema)


def _outcome(tool: str, arguments: dict[str, Any]) -> object:
    """What the server's validation makes of a call: the checked arguments, or the argument refused."""
    try:
        return parse(TOOLS[tool][1], arguments, CONTEXT)
    except ValidationError as exc:
        return ("refused", exc.argument)


# Calls without the optional arguments they do not give: valid ones, and ones refused for a
# value strict mode cannot rule out (it checks types, the server checks more).
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("run_python", {"code": "print(1)"}),
    ("run_python", {"code": "print(1)", "conversationId": "c", "reset": True, "timeout": 2}),
    ("run_python", {"code": "print(1)", "reset": True}),
    ("run_python", {"code": " "}),
    ("run_python", {"code": "print(1)", "timeout": 1e9}),
    ("run_code", {"code": "1", "language": "javascript", "servers": ["a", "a"], "outputMode": "toon"}),
    ("run_code", {"code": "1", "language": "python", "network": True}),
    ("run_code", {"code": "1", "language": "python", "environment": [{"name": "A", "value": "1"}]}),
    ("run_code", {"code": "1", "language": "python", "environment": [{"name": "1A", "value": "1"}]}),
    ("upload_file", {"conversationId": "c", "filename": "a/b.txt", "content": "aGk="}),
    ("upload_file", {"conversationId": "c", "filename": "../b.txt", "content": "aGk="}),
    ("list_runners", {}),
    ("search_tools", {"query": "weather", "detail": "name"}),
    ("search_tools", {"query": " ", "limit": 5}),
]


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_input_schema_converts_to_valid_strict_form(tool: str) -> None:
    strict, _ = _strict(tool)

    check_strict(strict)
    jsonschema.Draft202012Validator.check_schema(strict)


def test_no_tool_leaves_an_argument_out_of_its_strict_form() -> None:
    # run_code's environment is a list of {name, value}, not an object of any keys (a map), which
    # strict mode could not say: a strict client would have to leave it out.
    left_out = {tool: _strict(tool)[1] for tool in TOOLS}

    assert left_out == {tool: [] for tool in TOOLS}


@pytest.mark.parametrize(("tool", "call"), CALLS)
def test_a_strict_call_with_null_optionals_validates_as_the_call_without_them(tool: str, call: dict[str, Any]) -> None:
    strict, _ = _strict(tool)
    strict_call = {**dict.fromkeys(strict["properties"]), **call}

    assert jsonschema.Draft202012Validator(strict).is_valid(strict_call)
    assert _outcome(tool, strict_call) == _outcome(tool, call)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_sample_value_keeps_its_meaning_in_strict_form(tool: str) -> None:
    strict, left_out = _strict(tool)
    for name in strict["properties"]:
        call = {**required(tool), name: SAMPLES[name]}
        strict_call = {**dict.fromkeys(strict["properties"]), **call}

        assert jsonschema.Draft202012Validator(strict).is_valid(strict_call)
        assert _outcome(tool, strict_call) == _outcome(tool, call)
    assert not set(left_out) & set(strict["properties"])


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_strict_form_refuses_an_unknown_argument_as_the_server_does(tool: str) -> None:
    strict, _ = _strict(tool)
    call = {**dict.fromkeys(strict["properties"]), **required(tool), "colour": "blue"}

    assert not jsonschema.Draft202012Validator(strict).is_valid(call)
    assert _outcome(tool, call) == ("refused", "colour")
