"""server/app.py: the input schemas the SDK checks ``Mcp-Param-*`` headers against, only those that declare any."""

from __future__ import annotations

from typing import Any

from mcp.shared.inbound import validate_mcp_param_headers

from mcp_sandbox.server.app import _ParamHeaderSchemas

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
