"""server/app.py: the input schemas the SDK checks ``Mcp-Param-*`` headers against, only those that declare any;
malformed ``tools/call`` params refused naming the field."""

from __future__ import annotations

import types
from typing import Any

import mcp_types
import pytest
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import validate_mcp_param_headers
from pydantic import ValidationError

from mcp_sandbox.server.mcp_server import _named_call_errors, _ParamHeaderSchemas

PLAIN = {"type": "object", "properties": {"code": {"type": "string"}}}
DECLARING = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}


def test_a_schema_without_declarations_is_not_handed_over_one_with_them_is() -> None:
    schemas: dict[str, dict[str, Any] | None] = {"run": PLAIN, "deploy": DECLARING}
    looked_up: list[str] = []

    def lookup(name: str) -> dict[str, Any] | None:
        looked_up.append(name)
        return schemas.get(name)

    wanted = _ParamHeaderSchemas(lookup)
    # What None stands for: a schema that declares no header rejects no request, whatever its headers.
    assert validate_mcp_param_headers(PLAIN, {"code": "1"}, {"mcp-param-code": "2"}) is None
    assert wanted("run") is None
    assert wanted("deploy") is DECLARING
    assert validate_mcp_param_headers(DECLARING, {"region": "eu"}, {"mcp-param-region": "us"}) is not None
    assert wanted("run") is None and wanted("deploy") is DECLARING
    assert looked_up == ["run", "deploy"]  # each tool's schema looked at once


def test_a_tool_not_there_yet_is_looked_up_again() -> None:
    schemas: dict[str, dict[str, Any]] = {}
    wanted = _ParamHeaderSchemas(schemas.get)
    assert wanted("deploy") is None  # the service still opening
    schemas["deploy"] = DECLARING
    assert wanted("deploy") is DECLARING


class _Chain:
    """What lies under the layer: the SDK's validation of the params, then a handler (which may fail its own)."""

    def __init__(self, handler_fails: bool = False) -> None:
        self.handler_fails = handler_fails
        self.calls = 0

    async def __call__(self, ctx: Any) -> Any:
        self.calls += 1
        mcp_types.CallToolRequestParams.model_validate(ctx.params, by_name=False)  # as the SDK does first
        if self.handler_fails:
            mcp_types.TextContent.model_validate({"type": "text"})  # a validation of the handler's own
        return {"content": []}


@pytest.mark.anyio
@pytest.mark.parametrize("task", [False, True])
async def test_malformed_call_params_are_refused_naming_the_field_with_or_without_a_task(task: bool) -> None:
    params: dict[str, Any] = {"arguments": {"code": "print(1)"}, **({"task": {}} if task else {})}
    chain = _Chain()
    with pytest.raises(MCPError) as refused:
        await _named_call_errors(types.SimpleNamespace(method="tools/call", params=params), chain)
    assert refused.value.error.code == mcp_types.INVALID_PARAMS
    assert refused.value.error.message.startswith("tools/call: params.name:")
    assert chain.calls == (0 if task else 1)  # a task's params are refused before the tasks layer takes them


@pytest.mark.anyio
async def test_valid_call_params_go_through_once_and_the_handlers_own_validation_errors_stay_its_own() -> None:
    ctx = types.SimpleNamespace(method="tools/call", params={"name": "run_python", "arguments": {"code": "1"}})
    chain = _Chain()
    assert await _named_call_errors(ctx, chain) == {"content": []}
    assert chain.calls == 1
    with pytest.raises(ValidationError):
        await _named_call_errors(ctx, _Chain(handler_fails=True))
