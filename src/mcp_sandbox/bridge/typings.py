"""TypeScript declarations generated from downstream tool schemas, read inside JavaScript sandboxes.

Each server's stub directory (``/tools/<alias>/``, next to its Python stubs) gets ``index.d.ts``:
an ``<Tool>Args`` interface and a ``<Tool>Result`` type per tool, and the ``Server`` interface
whose methods ``mcp.servers.<alias>.<tool>(args)`` calls; the model reads it, nothing imports it.
Everything from the server is untrusted: names reach the source only as ASCII JSON string
literals, literal values only through ``json.dumps``, text only inside JSDoc comments through
:func:`jsdoc` (which cannot close the comment), and types only from a fixed grammar (``string``,
``number``, ``boolean``, ``null``, ``unknown``, literal unions, ``Array<...>``, object literals,
index signatures, and identifiers made by :func:`~mcp_sandbox.bridge.schema_types.class_name`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mcp_sandbox.bridge.schema_types import class_name
from mcp_sandbox.bridge.stubs import ToolDoc

__all__ = ["jsdoc", "render_typings", "ts_type"]

_MAX_DEPTH = 8
_PRIMITIVES = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}
_SURROGATE = re.compile("[\ud800-\udfff]")
_LINE_BREAKS = re.compile("\r\n|[\r\u2028\u2029\x85]")


def _literal(value: str) -> str:
    """A TypeScript string literal for ``value``: JSON's, ASCII only (no line terminators, no surrogates)."""
    return json.dumps(value, ensure_ascii=True)


def jsdoc(text: str, indent: str = "") -> str:
    """A ``/** ... */`` comment whose text is ``text``; nothing in ``text`` can end it early.

    ``*/`` becomes ``*\\/``, line breaks of every kind become lines, other controls are dropped and
    lone surrogates become U+FFFD.
    """
    text = _SURROGATE.sub("\ufffd", _LINE_BREAKS.sub("\n", text))
    text = "".join(ch for ch in text if ch == "\n" or ch == "\t" or ch.isprintable())
    text = text.replace("*/", "*\\/")
    lines = [line.rstrip() for line in text.strip().split("\n")]
    if len(lines) == 1:
        return f"{indent}/** {lines[0]} */"
    body = "".join(f"{indent} *{' ' + line if line else ''}\n" for line in lines)
    return f"{indent}/**\n{body}{indent} */"


def _scalar(value: object) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _literal(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return json.dumps(value)
    return None


def _union(members: Sequence[str]) -> str:
    unique = list(dict.fromkeys(members))
    if "unknown" in unique or not unique:
        return "unknown"
    unique.sort(key=lambda member: member == "null")
    return " | ".join(unique)


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any] | None:
    match = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref)
    if match is None:
        return None
    defs = root.get(match[1])
    target = defs.get(match[2].replace("~1", "/").replace("~0", "~")) if isinstance(defs, Mapping) else None
    return target if isinstance(target, Mapping) else None


def ts_type(schema: object, root: Mapping[str, Any], depth: int = 0, resolving: frozenset[str] = frozenset()) -> str:
    """The TypeScript type for JSON Schema ``schema``; ``root`` holds its ``$defs`` (``unknown`` when unsure)."""
    if depth > _MAX_DEPTH or not isinstance(schema, Mapping):
        return "unknown"
    expr = _ts_type(schema, root, depth, resolving)
    return _union([*expr.split(" | "), "null"]) if schema.get("nullable") is True and expr != "unknown" else expr


def _ts_type(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int, resolving: frozenset[str]) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(ref, root)
        if target is None or ref in resolving:
            return "unknown"  # unknown, external or recursive
        return ts_type(target, root, depth + 1, resolving | {ref})
    choices = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(choices, list) and choices:
        members = [_scalar(value) for value in choices]
        if all(member is not None for member in members):
            return _union([member for member in members if member is not None])
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _union([ts_type(option, root, depth + 1, resolving) for option in options])
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        return ts_type(all_of[0], root, depth + 1, resolving) if len(all_of) == 1 else "unknown"
    kind = schema.get("type")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
    if isinstance(kind, list):
        kinds = [k for k in kind if isinstance(k, str)]
        return _union([_typed(k, schema, root, depth, resolving) for k in kinds]) if kinds else "unknown"
    return _typed(kind, schema, root, depth, resolving) if isinstance(kind, str) else "unknown"


def _typed(kind: str, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int, resolving: frozenset[str]) -> str:
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "array":
        return f"Array<{ts_type(schema.get('items'), root, depth + 1, resolving)}>"
    if kind != "object":
        return "unknown"
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if not isinstance(properties, Mapping) or not properties:
        value = ts_type(extra, root, depth + 1, resolving) if isinstance(extra, Mapping) else "unknown"
        return f"{{ [key: string]: {value} }}"
    return _object(properties, schema.get("required"), root, depth, resolving, "")


def _object(
    properties: Mapping[str, Any],
    required: object,
    root: Mapping[str, Any],
    depth: int,
    resolving: frozenset[str],
    indent: str,
) -> str:
    """An object literal type, one property a line (with its description) at ``indent`` + 2 spaces."""
    needed = {key for key in required if isinstance(key, str)} if isinstance(required, list) else set()
    inner = indent + "  "
    lines = ["{"]
    for key, sub in properties.items():
        text = sub.get("description") if isinstance(sub, Mapping) else None
        if isinstance(text, str) and text.strip():
            lines.append(jsdoc(text, inner))
        expr = ts_type(sub, root, depth + 1, resolving).replace("\n", f"\n{inner}")
        lines.append(f"{inner}{_literal(str(key))}{'' if key in needed else '?'}: {expr};")
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def _names(docs: Sequence[ToolDoc]) -> list[str]:
    """A distinct type-name stem per tool (``get_sum`` -> ``GetSum``), never ``Server``."""
    taken = {"Server"}
    names = []
    for doc in docs:
        base = name = class_name(doc.python_name)
        counter = 2
        while name in taken:
            name, counter = f"{base}{counter}", counter + 1
        taken.add(name)
        names.append(name)
    return names


def _tool_types(doc: ToolDoc, stem: str) -> tuple[str, str, bool]:
    """The tool's ``<Stem>Args`` and ``<Stem>Result`` declarations, and whether args are optional."""
    schema = doc.input_schema if isinstance(doc.input_schema, Mapping) else {}
    properties = schema.get("properties")
    required = schema.get("required")
    if isinstance(properties, Mapping) and properties:
        args = f"export interface {stem}Args {_object(properties, required, schema, 0, frozenset(), '')}"
    else:
        args = f"export type {stem}Args = {{ [key: string]: unknown }};"
    optional = not (isinstance(required, list) and any(isinstance(key, str) for key in required))
    if doc.output_schema is not None:
        result = f"export type {stem}Result = {ts_type(doc.output_schema, doc.output_schema)};"
        result = "/** The tool's structuredContent. */\n" + result
    else:
        result = (
            "/** The tool's content: its text (parsed when it is a JSON object or array), Media or Resource "
            "objects, or an array of these. */\n"
            f"export type {stem}Result = unknown;"
        )
    return args, result, optional


def render_typings(alias: str, server_name: str, description: str | None, docs: Sequence[ToolDoc]) -> str:
    """The ``index.d.ts`` of server ``alias``: its tools' argument and result types and its ``Server``.

    Raises:
        ValueError: ``docs`` belong to another server.
    """
    if any(doc.server != alias for doc in docs):
        raise ValueError(f"tool docs do not belong to the server {alias!r}")
    about = [f"MCP server {server_name}, called from TypeScript/JavaScript as mcp.servers.{alias}."]
    if description and description.strip():
        about += ["", description.strip()]
    about += [
        "",
        f"Call a tool with `await mcp.servers.{alias}.<tool>({{...}})`; a failure rejects with mcp.MCPError.",
        "Generated from the server's tool schemas: do not edit.",
    ]
    parts = [jsdoc("\n".join(about))]
    methods = []
    for doc, stem in zip(docs, _names(docs), strict=True):
        args, result, optional = _tool_types(doc, stem)
        parts += [args, result]
        text = doc.description.strip() or doc.title or f"Call the tool {doc.name} of the server {server_name}."
        methods.append(jsdoc(text, "  "))
        methods.append(f"  {_literal(doc.name)}(args{'?' if optional else ''}: {stem}Args): Promise<{stem}Result>;")
    parts.append("\n".join(["export interface Server {", *methods, "}"]))
    parts.append("declare const server: Server;\nexport default server;")
    return "\n\n".join(parts) + "\n"
