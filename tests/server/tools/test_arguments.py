"""Each tool's arguments: the schema tools/list shows and the validation a call goes through agree."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from mcp_sandbox.bridge.search import MAX_SEARCH_RESULTS
from mcp_sandbox.errors import ValidationError
from mcp_sandbox.runners import LANGUAGES
from mcp_sandbox.server.tools.arguments import RunCodeArguments, RunPythonArguments, SearchToolsArguments
from mcp_sandbox.server.tools.parsing import parse

from ..tool_declarations import COMPANIONS, CONTEXT, SAMPLES, TOOLS, required

TOOL_NAMES = sorted(TOOLS)


def _refused(tool: str, arguments: dict[str, Any]) -> str:
    """The argument a call is refused for."""
    with pytest.raises(ValidationError) as refused:
        parse(TOOLS[tool][1], arguments, CONTEXT)
    return refused.value.argument


def _properties(tool: str) -> dict[str, Any]:
    properties: dict[str, Any] = TOOLS[tool][0].input_schema["properties"]
    return properties


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_every_input_schema_refuses_unknown_arguments_as_the_model_does(tool: str) -> None:
    schema = TOOLS[tool][0].input_schema
    call = {**required(tool), "colour": "blue"}

    assert schema["additionalProperties"] is False
    assert not jsonschema.Draft202012Validator(schema).is_valid(call)
    assert _refused(tool, call) == "colour"


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_every_argument_the_schema_lists_is_accepted_with_a_sample_and_the_required_ones_are_required(
    tool: str,
) -> None:
    schema = TOOLS[tool][0].input_schema
    model = TOOLS[tool][1]

    for name in _properties(tool):
        call = {**required(tool), **COMPANIONS.get(name, {}), name: SAMPLES[name]}
        assert jsonschema.Draft202012Validator(schema).is_valid(call)
        parse(model, call, CONTEXT)
    for name in schema.get("required", []):
        call = {key: value for key, value in required(tool).items() if key != name}
        assert _refused(tool, call) == name


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_every_optional_argument_takes_null_as_not_given(tool: str) -> None:
    schema = TOOLS[tool][0].input_schema
    model = TOOLS[tool][1]
    optional = [name for name in _properties(tool) if name not in schema.get("required", [])]
    call = {**required(tool), **dict.fromkeys(optional)}

    assert jsonschema.Draft202012Validator(schema).is_valid(call)
    assert parse(model, call, CONTEXT) == parse(model, required(tool), CONTEXT)


@pytest.mark.parametrize("tool", [name for name in TOOL_NAMES if TOOLS[name][0].input_schema.get("required")])
def test_null_for_a_required_argument_is_refused_naming_it(tool: str) -> None:
    first = TOOLS[tool][0].input_schema["required"][0]
    call = {**required(tool), first: None}

    assert not jsonschema.Draft202012Validator(TOOLS[tool][0].input_schema).is_valid(call)
    assert _refused(tool, call) == first


def test_reset_and_network_null_are_accepted() -> None:
    arguments = parse(RunCodeArguments, {"code": "1", "language": "python", "reset": None, "network": None}, CONTEXT)

    assert (arguments.reset, arguments.network) == (False, False)


@pytest.mark.parametrize(
    ("tool", "arguments", "argument"),
    [
        ("run_python", {"code": 1}, "code"),
        ("run_python", {"code": "1", "timeout": True}, "timeout"),
        ("run_python", {"code": "1", "timeout": "5"}, "timeout"),
        ("run_code", {"code": "1", "language": "python", "reset": "yes", "conversationId": "c"}, "reset"),
        ("run_python", {"code": "1", "reset": 5, "conversationId": "c"}, "reset"),
        ("run_python", {"code": "1", "checkpoint": True, "conversationId": "c"}, "checkpoint"),
        ("run_python", {"code": "1", "servers": [1]}, "servers"),
        ("run_python", {"code": "1", "outputMode": "xml"}, "outputMode"),
        ("run_code", {"code": "1", "language": "cobol"}, "language"),
        ("run_code", {"code": "1", "language": "python", "environment": {"A": 1}}, "environment"),
        ("run_code", {"code": "1", "language": "python", "environment": [{"name": "A"}]}, "environment"),
        (
            "run_code",
            {"code": "1", "language": "python", "environment": [{"name": "A", "value": "1", "x": 1}]},
            "environment",
        ),
        ("run_code", {"code": "1", "language": "python", "network": "no"}, "network"),
        ("search_tools", {"query": "x", "detail": "everything"}, "detail"),
        ("search_tools", {"query": "x", "limit": 0}, "limit"),
        ("search_tools", {"query": "x", "limit": MAX_SEARCH_RESULTS + 1}, "limit"),
        ("search_tools", {"query": "x", "limit": 2.5}, "limit"),
        ("upload_file", {"conversationId": 7, "filename": "a", "content": ""}, "conversationId"),
    ],
)
def test_what_the_schema_refuses_the_model_refuses_naming_the_argument(
    tool: str, arguments: dict[str, Any], argument: str
) -> None:
    assert not jsonschema.Draft202012Validator(TOOLS[tool][0].input_schema).is_valid(arguments)
    assert _refused(tool, arguments) == argument


def test_an_unknown_argument_is_named_before_a_missing_one() -> None:
    assert _refused("run_python", {"Code": "print(1)"}) == "Code"


def test_the_earlier_code_runners_environment_object_means_the_same_as_the_list() -> None:
    listed = [{"name": "A", "value": "1"}, {"name": "B", "value": "two"}]
    as_list = parse(RunCodeArguments, {"code": "1", "language": "python", "environment": listed}, CONTEXT)
    as_object = parse(
        RunCodeArguments, {"code": "1", "language": "python", "environment": {"A": "1", "B": "two"}}, CONTEXT
    )

    assert as_list.variables() == as_object.variables() == {"A": "1", "B": "two"}


def test_an_environment_list_naming_a_variable_twice_is_refused() -> None:
    twice = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    with pytest.raises(ValidationError) as refused:
        parse(RunCodeArguments, {"code": "1", "language": "python", "environment": twice}, CONTEXT)
    assert refused.value.argument == "environment"


def test_a_bad_environment_value_is_never_repeated_in_the_message() -> None:
    secret = "hunter2-secret"
    for environment in ({"A": secret + "\x00"}, {"A": [secret]}, [{"name": "A", "value": secret + "\x00"}]):
        with pytest.raises(ValidationError) as refused:
            parse(RunCodeArguments, {"code": "1", "language": "python", "environment": environment}, CONTEXT)
        assert refused.value.argument == "environment"
        assert secret not in str(refused.value)


def test_the_timeout_maximum_and_the_language_enum_come_from_the_same_context_as_validation() -> None:
    properties = _properties("run_code")

    assert f"max {CONTEXT.max_timeout:g}" in _properties("run_python")["timeout"]["description"]
    assert properties["language"] == {"type": "string", "enum": list(LANGUAGES)}
    assert parse(RunPythonArguments, {"code": "1", "timeout": CONTEXT.max_timeout}, CONTEXT).timeout == 60.0
    above = parse(RunPythonArguments, {"code": "1", "timeout": CONTEXT.max_timeout + 1}, CONTEXT)
    assert above.timeout_within(30.0, CONTEXT.max_timeout) == (60.0, 61.0)  # clamped, as the earlier bridge did
    assert _refused("run_python", {"code": "1", "timeout": 0}) == "timeout"
    assert _refused("run_python", {"code": "1", "timeout": -5}) == "timeout"
    assert _refused("run_python", {"code": "1", "timeout": "soon"}) == "timeout"


def test_the_search_limit_is_one_constant_in_schema_and_validation() -> None:
    limit = _properties("search_tools")["limit"]

    assert (limit["minimum"], limit["maximum"]) == (1, MAX_SEARCH_RESULTS)
    assert parse(SearchToolsArguments, {"query": "x", "limit": MAX_SEARCH_RESULTS}, CONTEXT).limit == MAX_SEARCH_RESULTS


def test_servers_are_deduplicated_in_order_and_content_is_decoded() -> None:
    run = parse(RunPythonArguments, {"code": "1", "servers": ["b", "a", "b"]}, CONTEXT)
    upload = parse(TOOLS["upload_file"][1], {"conversationId": "c", "filename": "f", "content": "aG k=\n"}, CONTEXT)

    assert run.servers == ["b", "a"]
    assert upload.model_dump()["content"] == b"hi"


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_input_schemas_are_terse_no_titles_defaults_or_anyof(tool: str) -> None:
    text = repr(TOOLS[tool][0].input_schema)

    for keyword in ("'title'", "'default'", "'anyOf'", "'$defs'"):
        assert keyword not in text


@pytest.mark.parametrize(
    ("arguments", "argument", "message"),
    [
        ({"checkpoint": "cp"}, "checkpoint", "needs a conversationId: the conversation to save"),
        (
            {"checkpoint": "cp", "conversationId": "c-1", "forkFrom": "c-0"},
            "checkpoint",
            "cannot be saved in a fork's first call: save it in the fork's next call",
        ),
        ({"checkpoint": "../up", "conversationId": "c"}, "checkpoint", "a checkpoint's name is 1 to 64 letters"),
        ({"reset": "", "conversationId": "c"}, "reset", "a checkpoint's name is 1 to 64 letters"),
        ({"reset": "cp"}, "reset", "needs a conversationId"),
        ({"checkpoint": "-", "conversationId": "c"}, "checkpoint", "a checkpoint's name is 1 to 64 letters"),
        ({"checkpoint": "--cp", "conversationId": "c"}, "checkpoint", "a checkpoint's name is 1 to 64 letters"),
        ({"reset": "-cp", "conversationId": "c"}, "reset", "a checkpoint's name is 1 to 64 letters"),
        ({"checkpoint": "-cp"}, "checkpoint", "needs a conversationId"),
    ],
)
def test_a_checkpoint_is_named_plainly_and_needs_its_conversation(
    arguments: dict[str, Any], argument: str, message: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        parse(RunPythonArguments, {"code": "1", **arguments}, CONTEXT)

    assert refused.value.argument == argument
    assert refused.value.message.startswith(message)


def test_a_checkpoint_to_delete_is_its_name_after_a_dash() -> None:
    parsed = parse(RunPythonArguments, {"code": "1", "conversationId": "c", "checkpoint": "-before-1"}, CONTEXT)

    assert parsed.checkpoint == "-before-1"


def test_reset_takes_true_or_a_checkpoints_name() -> None:
    named = parse(RunPythonArguments, {"code": "1", "conversationId": "c", "reset": "before-1"}, CONTEXT)
    fresh = parse(RunPythonArguments, {"code": "1", "conversationId": "c", "reset": True}, CONTEXT)

    assert (named.reset, named.restore) == ("before-1", "before-1")
    assert (fresh.reset, fresh.restore) == (True, None)
