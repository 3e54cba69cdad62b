"""The MCP tools' declarations: names, descriptions, output schemas, and input schemas made from the models.

Everything here is sent in every ``tools/list`` answer, which must stay under 1,000 tokens
however many downstream servers exist: descriptions are terse, the server list is capped, and
the input schemas pydantic generates from ``arguments.py`` are cut to their shape (no titles,
no defaults, ``"type": [..., "null"]`` rather than ``anyOf``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import mcp_types as types
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from mcp_sandbox.server.tools.arguments import (
    CallContext,
    ListRunnersArguments,
    RunCodeArguments,
    RunPythonArguments,
    SearchToolsArguments,
    ToolArguments,
    UploadFileArguments,
)
from mcp_sandbox.server.tools.run_views import VIEW_URI

__all__ = [
    "RUN_OUTPUT_SCHEMA",
    "RUN_VIEW_META",
    "input_schema",
    "list_runners_tool",
    "run_code_tool",
    "run_python_tool",
    "search_tools_tool",
    "upload_file_tool",
]

# Every key here is paid for in tokens in every tools/list: the shape, not a manual. The keys every
# result has; those only some have (error, session, files, warning, imagesDropped) are left to the
# result itself, which the model reads anyway.
RUN_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["success", "error", "timeout", "validation_error"]},
        "exitCode": {"type": ["integer", "null"]},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "durationMs": {"type": "integer"},
        "truncated": {"type": "boolean"},
    },
    "required": ["status", "exitCode", "stdout", "stderr", "durationMs", "truncated"],
}

# The description names servers by alias (ASCII identifiers, what code writes after `mcp_`),
# within a budget of tokens, so that tools/list stays under 1,000 tokens however many servers
# are configured and whatever their names. A run of letters, of digits or one other character is
# about a token ("server_12": 3, "x1x2q9z": 7); no tokenizer is needed for an estimate.
_NAMES_BUDGET = 5
_TOKEN = re.compile(r"[A-Za-z]+|[0-9]+|.")


def _servers_line(aliases: Sequence[str]) -> str:
    if not aliases:
        return ""
    shown: list[str] = []
    used = 0
    for alias in aliases:
        cost = len(_TOKEN.findall(alias)) + 1  # and its comma
        if used + cost > _NAMES_BUDGET:
            continue
        shown.append(alias)
        used += cost
    hidden = len(aliases) - len(shown)
    servers = f"MCP servers {', '.join(shown)}" if shown else f"{hidden} MCP servers"
    if shown and hidden:
        servers += f" and {hidden} more"
    # search_tools' own description says it finds what these servers offer.
    return f" {servers}: name in `servers`; `await mcp_<server>.<tool>()`."


class _TerseSchema(GenerateJsonSchema):
    """pydantic's JSON schema, without what costs tokens and says nothing to a model."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def sort(self, value: JsonSchemaValue, parent_key: str | None = None) -> JsonSchemaValue:
        return value  # the order of declaration: code first

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])  # "not given" is null; a default only costs tokens

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return _nullable(self.generate_inner(schema["schema"]))

    def generate(self, schema: CoreSchema, mode: Any = "validation") -> JsonSchemaValue:
        generated = super().generate(schema, mode)
        properties: dict[str, Any] = generated.get("properties", {})
        required: list[str] = generated.get("required", [])
        # Every optional argument takes null as "not given" (ToolArguments drops it before validating).
        for name, prop in properties.items():
            if name not in required:
                properties[name] = _nullable(prop)
        shaped: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            shaped["required"] = required
        shaped["additionalProperties"] = generated["additionalProperties"]
        if "$defs" in generated:
            shaped["$defs"] = generated["$defs"]
        return shaped


def _nullable(schema: JsonSchemaValue) -> JsonSchemaValue:
    kind = schema.get("type")
    if kind is None or kind == "null" or (isinstance(kind, list) and "null" in kind):
        return schema
    nullable = {"type": [*kind, "null"] if isinstance(kind, list) else [kind, "null"], **schema}
    nullable["type"] = [*kind, "null"] if isinstance(kind, list) else [kind, "null"]
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def _inlined(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``$ref`` replaced by its definition (shorter, and every client follows it)."""
    if "$ref" in schema:
        definition = definitions[schema["$ref"].rpartition("/")[2]]
        # A model's name and docstring are for readers of the code, not worth their tokens.
        return _inlined({k: v for k, v in definition.items() if k not in ("title", "description")}, definitions)
    inlined = dict(schema)
    if "properties" in schema:
        inlined["properties"] = {name: _inlined(prop, definitions) for name, prop in schema["properties"].items()}
    if "items" in schema:
        inlined["items"] = _inlined(schema["items"], definitions)
    return inlined


def input_schema(model: type[ToolArguments], context: CallContext) -> dict[str, Any]:
    """The JSON schema of ``model``'s arguments, as ``tools/list`` shows it for this deployment."""
    generated = model.model_json_schema(schema_generator=_TerseSchema)
    schema: dict[str, Any] = _inlined(generated, generated.pop("$defs", {}))
    properties = schema["properties"]
    # The parts the model validates against the context, said from the same context.
    if "timeout" in properties:
        properties["timeout"]["description"] += f", max {context.max_timeout:g}"
    if "language" in properties:
        properties["language"]["enum"] = list(context.languages)
    return schema


# MCP Apps (io.modelcontextprotocol/ui): the page a host renders for a run (tools/resources.py). Hosts
# read `_meta`; they do not hand it to the model.
RUN_VIEW_META: dict[str, Any] = {"ui": {"resourceUri": VIEW_URI}}

# May run as an MCP Task (2025-11-25; server/tasks): a long run outlives the client's request.
TASKS_OPTIONAL = types.ToolExecution(task_support="optional")


def run_python_tool(context: CallContext, servers: Sequence[str]) -> types.Tool:
    return types.Tool(
        name="run_python",
        description=(
            "Sandboxed Python 3: "
            + ("network if granted" if context.network else "no network")
            + ", only /workspace writable. "
            "Top-level await; numpy, pandas, matplotlib; plots become images." + _servers_line(servers)
        ),
        input_schema=input_schema(RunPythonArguments, context),
        output_schema=RUN_OUTPUT_SCHEMA,
        execution=TASKS_OPTIONAL,
        _meta=RUN_VIEW_META,
        # No annotations: the defaults are the truth (code can delete a workspace's files and, in
        # code mode, reach other servers), and they cost no tokens.
    )


def run_code_tool(context: CallContext) -> types.Tool:
    schema = input_schema(RunCodeArguments, context)
    for prop in schema["properties"].values():
        prop.pop("description", None)  # run_python describes the arguments they share
    return types.Tool(
        name="run_code",
        description="run_python in list_runners' languages.",
        # No outputSchema: the result is run_python's, whose schema is listed once to save tokens.
        input_schema=schema,
        execution=TASKS_OPTIONAL,
        _meta=RUN_VIEW_META,
        # No annotations: as run_python's.
    )


def upload_file_tool(context: CallContext) -> types.Tool:
    return types.Tool(
        name="upload_file",
        description="Store a file in a conversation's /workspace.",
        input_schema=input_schema(UploadFileArguments, context),
        # Not read-only and not non-destructive: it overwrites a file of the same name.
        annotations=types.ToolAnnotations(open_world_hint=False),
    )


def list_runners_tool(context: CallContext) -> types.Tool:
    return types.Tool(
        name="list_runners",
        description="run_code's languages, versions, packages.",
        input_schema=input_schema(ListRunnersArguments, context),
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )


def search_tools_tool(context: CallContext) -> types.Tool:
    return types.Tool(
        name="search_tools",
        description="Find tools code can call; detail full: typed stubs.",
        input_schema=input_schema(SearchToolsArguments, context),
        # No outputSchema: {"results": [{server, tool, doc}]} is not worth its tokens in every tools/list.
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
