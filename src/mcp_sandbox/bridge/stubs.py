"""Python stubs generated from downstream tool schemas, read and imported inside the sandbox.

Each downstream server (its ``alias``) becomes a package the sandbox sees read-only at
``/tools/<alias>/`` and imports as ``mcp.servers.<alias>``:

- ``__init__.py``: the server's name, description and an index of its tools; a module
  ``__getattr__`` loads a tool's module on first use, so a server with 200 tools imports at once;
- ``<python_name>.py``, one per tool: its result types, ``async def <python_name>(*, ...)`` and the
  blocking ``<python_name>_sync``, both calling ``mcp.runtime`` with the wire names.

Everything from the server is untrusted: names become identifiers only after validation, values
reach the source only through ``repr()``, text only through the escapes of :mod:`.schema_types`.
The files rendered here are written to disk by :mod:`.stub_tree`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mcp_sandbox.bridge.schema_types import (
    TypeDefs,
    TypeRenderer,
    class_name,
    docstring,
    is_plain_identifier,
    json_scalar_source,
    one_line,
)

if TYPE_CHECKING:  # annotations only: the SDK is imported where a downstream server is used
    import mcp_types

__all__ = ["Param", "ToolDoc", "render_package", "render_tool_module", "tool_docs"]

_MAX_NAME = 100
_SUMMARY_CHARS = 120
# Tool names must not rebind what a generated module relies on; the sync form takes `<name>_sync` too.
_TOOL_RESERVED = frozenset(
    {"annotations", "Any", "Literal", "NotRequired", "TypedDict", "str", "int", "float", "bool", "list", "dict"}
    | {"list_tools", "SERVER_NAME", "TOOLS", "TOOL_MAP"}  # the package's own (list_tools, TOOLS: the earlier bridge's)
)
_PARAM_RESERVED = frozenset({"_runtime", "_arguments"})  # the function body's own names
_RESULT_TEXT = (
    "The tool's content: its text (parsed as JSON when it is a JSON object or array), an\n"
    "    mcp.runtime.Media (image, audio) or Resource, or a list of these when there are several."
)
_RAISES = "Raises:\n    MCPError: the tool failed or the server is unreachable."


@dataclass(frozen=True, slots=True)
class Param:
    """One keyword-only parameter of a tool's function.

    Attributes:
        wire: the argument's name in the tool's schema (what is sent).
        python: the parameter's name in Python.
        type_expr: its annotation, from the fixed grammar of :mod:`.schema_types`.
        required: whether the schema requires it.
        default_source: Python source of its default (``None`` when required).
        description: the schema's description of it.
    """

    wire: str
    python: str
    type_expr: str
    required: bool
    default_source: str | None
    description: str


@dataclass(frozen=True, slots=True)
class ToolDoc:
    """Everything known about one tool, for its stub and for search. Build it with :func:`tool_docs`."""

    server: str
    name: str
    python_name: str
    title: str | None
    description: str
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None
    params: tuple[Param, ...]
    result_type: str = "Any"
    types: TypeDefs = field(default_factory=TypeDefs)

    @property
    def summary(self) -> str:
        """The first sentence (or line) of the description, at most ~120 characters."""
        lines = [line for line in (self.description or self.title or "").splitlines() if line.strip()]
        first = re.split(r"(?<=[.!?])\s+(?=[A-Z])", lines[0].strip(), maxsplit=1)[0] if lines else ""
        return one_line(first, _SUMMARY_CHARS)

    def signature(self) -> str:
        """``name(*, param: type = default, ...) -> Result``."""
        return f"{self.python_name}({', '.join(_parameters(self.params))}) -> {self.result_type}"


def tool_docs(alias: str, tools: Sequence[mcp_types.Tool]) -> list[ToolDoc]:
    """Describe ``tools`` of the server ``alias``, giving each a Python name no other tool takes.

    Raises:
        ValueError: ``alias`` is not a Python identifier.
    """
    _check_alias(alias)
    names = _unique_names([tool.name for tool in tools], "tool", _TOOL_RESERVED, sync=True)
    return [_tool_doc(alias, tool, name) for tool, name in zip(tools, names, strict=True)]


def _tool_doc(alias: str, tool: mcp_types.Tool, python_name: str) -> ToolDoc:
    renderer = TypeRenderer(reserved={python_name, f"{python_name}_sync"})
    cap = class_name(python_name)
    output = tool.output_schema if isinstance(tool.output_schema, Mapping) else None
    result_name = renderer.claim(f"{cap}Result")  # claimed first, so it is exactly <Tool>Result
    params = _params(tool.input_schema if isinstance(tool.input_schema, Mapping) else {}, cap, renderer)
    result_type = renderer.result(output, result_name) if output is not None else renderer.any()
    title = tool.title or (tool.annotations.title if tool.annotations else None)
    return ToolDoc(
        server=alias,
        name=tool.name,
        python_name=python_name,
        title=title,
        description=tool.description or "",
        input_schema=tool.input_schema,
        output_schema=output,
        params=params,
        result_type=result_type,
        types=renderer.defs(),
    )


def _params(schema: Mapping[str, Any], cap: str, renderer: TypeRenderer) -> tuple[Param, ...]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    required_names = [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
    wires = list(dict.fromkeys([*properties, *required_names]))
    pythons = _unique_names(wires, "arg", _PARAM_RESERVED, sync=False)
    params: list[Param] = []
    for wire, python in zip(wires, pythons, strict=True):
        sub = properties.get(wire)
        sub = sub if isinstance(sub, Mapping) else {}
        expr = renderer.annotation(sub, f"{cap}{class_name(wire)}", schema)
        is_required = wire in required_names
        default = None if is_required or sub.get("default") is None else json_scalar_source(sub["default"])
        if not is_required and default is None:
            default, expr = "None", renderer.union([expr, "None"])
        text = sub.get("description")
        params.append(Param(wire, python, expr, is_required, default, text if isinstance(text, str) else ""))
    return tuple(sorted(params, key=lambda param: not param.required))


def _unique_names(raws: Sequence[str], fallback: str, reserved: frozenset[str], *, sync: bool) -> list[str]:
    """Identifiers for ``raws``, distinct, deterministic, and the names already valid served first."""
    taken: set[str] = set()
    names = [""] * len(raws)
    private_ok = not sync  # a tool's module name must not be `__init__` or a dunder of the package

    def valid(name: str) -> bool:
        return is_plain_identifier(name) and name not in reserved and (private_ok or not name.startswith("_"))

    for index in sorted(range(len(raws)), key=lambda i: (not valid(raws[i]), raws[i])):
        base = _identifier(raws[index], fallback, private_ok)
        base = base if valid(base) else f"{base}_"  # `from` -> `from_`, `list` -> `list_`
        assert valid(base), base
        candidate, counter = base, 2
        while candidate in taken or (sync and f"{candidate}_sync" in taken):
            candidate, counter = f"{base}_{counter}", counter + 1
        taken.update({candidate, f"{candidate}_sync"} if sync else {candidate})
        names[index] = candidate
    return names


def _identifier(raw: str, fallback: str, private_ok: bool) -> str:
    name = raw if raw.isascii() and raw.isidentifier() else re.sub(r"[^0-9A-Za-z_]+", "_", raw).strip("_")
    name = (name if private_ok else name.lstrip("_"))[:_MAX_NAME] or fallback
    return f"{fallback}_{name}" if name[0].isdigit() else name


def _check_alias(alias: str) -> None:
    if not is_plain_identifier(alias) or alias.startswith("_"):
        raise ValueError(f"server alias {alias!r} is not a Python identifier")


def _parameters(params: Sequence[Param]) -> list[str]:
    rendered = [
        f"{p.python}: {p.type_expr}" if p.default_source is None else f"{p.python}: {p.type_expr} = {p.default_source}"
        for p in params
    ]
    return ["*", *rendered] if rendered else []


def render_tool_module(doc: ToolDoc) -> str:
    """The source of ``<python_name>.py``: the tool's result types and its two functions.

    Raises:
        ValueError: the doc's names are not safe identifiers (it was not built by :func:`tool_docs`).
    """
    _check_alias(doc.server)
    if not all(is_plain_identifier(name) for name in (doc.python_name, *(p.python for p in doc.params))):
        raise ValueError(f"tool {doc.name!r} has names that are not identifiers")
    name = doc.python_name
    optional = [p for p in doc.params if not p.required]
    typing_names = set(doc.types.typing_names) | ({"Any"} if optional else set())
    # One line (repr): a line 1 or 2 looking like "# coding: ..." would change how Python decodes the file.
    header = f"Tool {doc.name!r} of the MCP server {doc.server!r}, generated from its schema: do not edit."
    parts = [docstring(header), "from __future__ import annotations"]
    if typing_names:
        parts.append(f"from typing import {', '.join(sorted(typing_names))}")
    exported = [name, f"{name}_sync", *(cls for cls in doc.types.class_names if cls == doc.result_type)]
    parts += ["from mcp import runtime as _runtime", f"__all__ = {exported!r}"]
    out = "\n\n".join(parts) + "\n"
    for definition in doc.types.definitions:
        out += f"\n\n{definition}\n"
    parameters = _parameters(doc.params)
    signature = f"({', '.join(parameters)}) -> {doc.result_type}:"
    if len(f"async def {name}{signature}") > 100:  # one parameter a line
        signature = "".join(["(\n", *(f"    {part},\n" for part in parameters), f") -> {doc.result_type}:"])
    call = f"{doc.server!r}, {doc.name!r}"
    required = ", ".join(f"{p.wire!r}: {p.python}" for p in doc.params if p.required)
    body = [f"_arguments: dict[str, Any] = {{{required}}}"] if optional else []
    for p in optional:
        body += [f"if {p.python} is not None:", f"    _arguments[{p.wire!r}] = {p.python}"]
    arguments = "_arguments" if optional else f"{{{required}}}"
    out += f"\n\nasync def {name}{signature}\n    {docstring(_function_doc(doc), '    ')}\n"
    out += "".join(f"    {line}\n" for line in body)
    out += f"    return await _runtime.call_tool({call}, {arguments})\n"
    out += f"\n\ndef {name}_sync{signature}\n    {docstring(f'Synchronous form of {name}, for plain scripts.')}\n"
    out += "".join(f"    {line}\n" for line in body)
    out += f"    return _runtime.call_tool_sync({call}, {arguments})\n"
    return out


def _function_doc(doc: ToolDoc) -> str:
    text = doc.description.strip() or doc.title or f"Call the tool {doc.name} of the server {doc.server}."
    sections = [text]
    args = [
        f"    {p.python}: {f'(sent as {p.wire!r}) ' if p.wire != p.python else ''}{one_line(p.description)}".rstrip()
        for p in doc.params
        if p.description.strip() or p.wire != p.python
    ]
    if args:
        sections.append("Args:\n" + "\n".join(args))
    if doc.output_schema is not None:
        sections.append(f"Returns:\n    {doc.result_type}: the tool's structured content.")
    else:
        sections.append(f"Returns:\n    {_RESULT_TEXT}")
    return "\n\n".join([*sections, _RAISES]) + "\n"


def render_package(alias: str, server_name: str, description: str | None, docs: Sequence[ToolDoc]) -> dict[str, str]:
    """The files of the server's package: relative path -> source (``__init__.py`` and one per tool).

    Raises:
        ValueError: ``alias`` is not an identifier, or ``docs`` are another server's or repeat a name.
    """
    _check_alias(alias)
    names = [doc.python_name for doc in docs]
    if any(doc.server != alias for doc in docs) or len(set(names)) != len(names):
        raise ValueError(f"tool docs do not belong to one server {alias!r} with distinct names")
    files = {"__init__.py": _render_init(alias, server_name, description, docs)}
    files.update({f"{doc.python_name}.py": render_tool_module(doc) for doc in docs})
    return files


_INIT_CODE = """
import importlib as _importlib
from typing import Any as _Any

from mcp import runtime as _runtime

__all__ = {exported!r}

SERVER_NAME = {server_name!r}

_TOOLS = frozenset({tools})


def list_tools() -> _Any:
    \"\"\"This server's tool definitions as it sent them; also awaitable (the earlier bridge's form).\"\"\"
    return _runtime.list_tools(SERVER_NAME, schemas=True)


def _no_tool(name: str) -> _Any:
    def call(*args: _Any, **kwargs: _Any) -> _Any:
        tools = ", ".join(sorted(_TOOLS)) or "none"
        message = f"no such tool; this server's tools: {{tools}}"
        raise _runtime.MCPError(message, server=SERVER_NAME, tool=name, kind="invalid")

    call.__name__ = call.__qualname__ = name
    return call


def __getattr__(name: str) -> _Any:
    if name in ("TOOLS", "TOOL_MAP"):  # the earlier bridge's: the tools' metadata, and by Python name
        tools = list(_runtime.list_tools_sync(SERVER_NAME))
        globals().update(TOOLS=tools, TOOL_MAP={{tool["alias"]: tool for tool in tools}})
        return globals()[name]
    tool = name if name in _TOOLS else name.removesuffix("_sync")
    if tool not in _TOOLS:
        if name.startswith("_"):  # dunders and private names: introspection (hasattr, copy, pickle) stays sane
            raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
        # As the earlier bridge's proxy: any name is a function; calling one the server lacks fails.
        return _no_tool(name)
    module = _importlib.import_module(f"{{__name__}}.{{tool}}")
    # Importing the submodule bound the package attribute `tool` to the module: bind the functions.
    globals()[tool] = getattr(module, tool)
    globals()[f"{{tool}}_sync"] = getattr(module, f"{{tool}}_sync")
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({{*globals(), *__all__}})
"""


def _render_init(alias: str, server_name: str, description: str | None, docs: Sequence[ToolDoc]) -> str:
    names = [doc.python_name for doc in docs]
    lines = [f"MCP server {one_line(server_name)!r}, imported as mcp.servers.{alias}."]
    if description and description.strip():
        lines += ["", description.strip()]
    lines += [
        "",
        f"Call a tool with `await mcp.servers.{alias}.<tool>(...)`, or `<tool>_sync(...)` in plain scripts.",
        f"Read /tools/{alias}/<tool>.py for a tool's signature, documentation and result type.",
        "",
        "Tools:" if docs else "Tools: none.",
    ]
    for doc in docs:
        wire = f" (tool {doc.name!r})" if doc.name != doc.python_name else ""
        summary = f": {doc.summary}" if doc.summary else ""
        lines.append(f"    {doc.python_name}{wire}{summary}")
    exported = [fn for name in names for fn in (name, f"{name}_sync")]
    tools = "{" + ", ".join(repr(name) for name in sorted(names)) + "}" if names else ""  # sorted: the tree is hashed
    return (
        docstring("\n".join(lines) + "\n")
        + "\n"
        + _INIT_CODE.format(exported=exported, tools=tools, server_name=server_name)
    )
