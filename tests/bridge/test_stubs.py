"""Generated stubs: what they send, how they read, and that no server can inject code through them."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import re
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from bridge.tool_fixtures import EVERYTHING, ISSUES, TIME, tools
from mcp_sandbox.bridge.schema_types import one_line
from mcp_sandbox.bridge.stubs import render_package, render_tool_module, tool_docs


class FakeRuntime(types.ModuleType):
    """``mcp.runtime`` as the stubs see it, recording each call."""

    def __init__(self) -> None:
        super().__init__("mcp.runtime")
        self.calls: list[tuple[str, str, str, dict[str, Any]]] = []
        self.reply: Any = {"ok": True}

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any]) -> Any:
        self.calls.append(("async", server, tool, arguments))
        return self.reply

    def call_tool_sync(self, server: str, tool: str, arguments: dict[str, Any]) -> Any:
        self.calls.append(("sync", server, tool, arguments))
        return self.reply


Install = Callable[[str, dict[str, str]], types.ModuleType]


def _is_mcp(name: str) -> bool:
    return name == "mcp" or name.startswith("mcp.")


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def install(tmp_path: Path, runtime: FakeRuntime) -> Iterator[Install]:
    """Lays packages out as /tools/<alias> and imports them as mcp.servers.<alias> with a fake runtime."""
    tools_dir = tmp_path / "tools"
    tools_dir.mkdir()
    saved = {name: module for name, module in sys.modules.items() if _is_mcp(name)}
    for name in saved:
        del sys.modules[name]
    package = types.ModuleType("mcp")
    package.__path__ = []
    servers = types.ModuleType("mcp.servers")
    servers.__path__ = [str(tools_dir)]
    package.runtime = runtime  # type: ignore[attr-defined]
    package.servers = servers  # type: ignore[attr-defined]
    sys.modules.update({"mcp": package, "mcp.runtime": runtime, "mcp.servers": servers})

    def install(alias: str, files: dict[str, str]) -> types.ModuleType:
        (tools_dir / alias).mkdir()
        for path, text in files.items():
            (tools_dir / alias / path).write_text(text, encoding="utf-8")
        return importlib.import_module(f"mcp.servers.{alias}")

    try:
        yield install
    finally:
        for name in [name for name in sys.modules if _is_mcp(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
        importlib.invalidate_caches()


def _package(alias: str, tool_list: list[mcp_types.Tool], description: str | None = None) -> dict[str, str]:
    return render_package(alias, f"mcp-{alias}", description, tool_docs(alias, tool_list))


def _tool(name: str, properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required or []}
    return {"name": name, "description": f"The {name} tool.", "inputSchema": schema, **extra}


# What sandboxed code sends and gets


@pytest.mark.anyio
async def test_a_tool_call_sends_the_wire_names_and_returns_what_the_runtime_returns(
    install: Install, runtime: FakeRuntime
) -> None:
    time_server = install("time", _package("time", TIME))
    runtime.reply = {"timezone": "Asia/Tokyo", "datetime": "2025-01-01T09:00:00+09:00"}

    result = await time_server.get_current_time(timezone="Asia/Tokyo")
    sync_result = time_server.convert_time_sync(source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")

    assert result == sync_result == runtime.reply
    assert runtime.calls == [
        ("async", "time", "get_current_time", {"timezone": "Asia/Tokyo"}),
        ("sync", "time", "convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
    ]


@pytest.mark.anyio
async def test_optional_arguments_left_unset_are_omitted_and_schema_defaults_are_sent(
    install: Install, runtime: FakeRuntime
) -> None:
    issues = install("issues", _package("issues", ISSUES))
    everything = install("everything", _package("everything", EVERYTHING))

    await issues.search_issues(query="crash")
    await issues.search_issues(query="crash", filter={"labels": ["bug"]}, from_="2025-01-01", max_results=5)
    await issues.search_issues(query="crash", sort=None)
    await everything.longRunningOperation()
    everything.longRunningOperation_sync(duration=None, steps=2)

    assert [call[3] for call in runtime.calls] == [
        {"query": "crash", "max-results": 20, "sort": "updated"},
        {"query": "crash", "filter": {"labels": ["bug"]}, "max-results": 5, "from": "2025-01-01", "sort": "updated"},
        {"query": "crash", "max-results": 20},
        {"duration": 10, "steps": 5},
        {"steps": 2},
    ]


@pytest.mark.anyio
async def test_a_tool_without_parameters_takes_none_and_sends_an_empty_object(
    install: Install, runtime: FakeRuntime
) -> None:
    everything = install("everything", _package("everything", EVERYTHING))

    await everything.getTinyImage()

    assert inspect.signature(everything.getTinyImage).parameters == {}
    assert runtime.calls == [("async", "everything", "getTinyImage", {})]


def test_the_package_attribute_is_the_function_even_after_its_module_was_imported(install: Install) -> None:
    time_server = install("time", _package("time", TIME))

    sync = time_server.get_current_time_sync  # imports the module get_current_time first
    from mcp.servers.time import convert_time  # type: ignore[import-not-found]

    assert inspect.iscoroutinefunction(time_server.get_current_time)
    assert not inspect.iscoroutinefunction(sync)
    assert inspect.iscoroutinefunction(convert_time)
    assert isinstance(sys.modules["mcp.servers.time.get_current_time"], types.ModuleType)
    assert {"get_current_time", "get_current_time_sync", "convert_time"} <= set(dir(time_server))
    for private in ("__wrapped__", "_no_such"):  # introspection (hasattr, copy, pickle) stays sane
        with pytest.raises(AttributeError):
            getattr(time_server, private)


class _MCPError(RuntimeError):
    def __init__(self, message: str, *, server: str, tool: str, kind: str) -> None:
        super().__init__(f"{server}.{tool}: {message}")
        self.kind = kind


def test_an_unknown_tool_is_a_function_whose_call_fails_naming_the_servers_tools(
    install: Install, runtime: FakeRuntime
) -> None:
    runtime.MCPError = _MCPError  # type: ignore[attr-defined]
    time_server = install("time", _package("time", TIME))

    missing = time_server.no_such_tool  # as the earlier bridge's proxy: any name is a function

    assert callable(missing) and missing.__name__ == "no_such_tool"
    with pytest.raises(RuntimeError, match=r"time\.no_such_tool: no such tool; .*convert_time, get_current_time"):
        missing(x=1)
    with pytest.raises(RuntimeError):
        time_server.no_such_tool_sync()
    assert runtime.calls == []


# How they read


def test_signatures_are_keyword_only_with_schema_defaults_and_string_annotations(install: Install) -> None:
    issues = install("issues", _package("issues", ISSUES))

    signature = inspect.signature(issues.search_issues)

    assert {p.kind for p in signature.parameters.values()} == {inspect.Parameter.KEYWORD_ONLY}
    assert [(p.name, p.annotation, p.default) for p in signature.parameters.values()] == [
        ("query", "str", inspect.Parameter.empty),
        ("filter", "IssueFilter | None", None),
        ("max_results", "int", 20),
        ("from_", "str | None", None),
        ("sort", "Literal['updated', 'created']", "updated"),
    ]
    assert signature.return_annotation == "SearchIssuesResult"
    assert inspect.signature(issues.search_issues_sync) == signature


def test_output_schemas_become_typed_dicts_and_refs_become_classes(install: Install) -> None:
    time_server = install("time", _package("time", TIME))
    issues = install("issues", _package("issues", ISSUES))
    time_module = sys.modules["mcp.servers.time"].get_current_time.__module__
    issues_module = sys.modules[issues.search_issues.__module__]

    result = sys.modules[time_module].GetCurrentTimeResult
    assert typing.get_type_hints(result) == {"timezone": str, "datetime": str, "day_of_week": str, "is_dst": bool}
    assert result.__required_keys__ == {"timezone", "datetime", "day_of_week", "is_dst"}
    assert time_server.convert_time.__annotations__["return"] == "Any"

    search_result = issues_module.SearchIssuesResult
    issue = issues_module.Issue  # mixed required keys: the functional form
    assert typing.get_type_hints(search_result) == {"issues": list[issue], "total": int}  # type: ignore[valid-type]
    assert issue.__required_keys__ == {"number", "title"}
    assert issue.__optional_keys__ == {"labels", "parent"}
    assert typing.get_type_hints(issue)["parent"] == Any  # the recursive reference
    issue_filter = issues_module.IssueFilter
    assert issue_filter.__required_keys__ == {"labels"}
    assert set(issue_filter.__annotations__) == {"state", "labels", "assignee"}
    assert issues_module.__all__ == ["search_issues", "search_issues_sync", "SearchIssuesResult"]


def test_docstrings_give_the_description_arguments_result_and_errors(install: Install) -> None:
    time_server = install("time", _package("time", TIME, description="Time and timezone conversion."))
    issues = install("issues", _package("issues", ISSUES))

    doc = inspect.getdoc(time_server.get_current_time)
    issues_doc = inspect.getdoc(issues.search_issues)

    assert doc is not None and issues_doc is not None
    assert doc.startswith("Get current time in a specific timezones\n\nArgs:\n    timezone: IANA timezone name")
    assert "Returns:\n    GetCurrentTimeResult: the tool's structured content." in doc
    assert doc.endswith("Raises:\n    MCPError: the tool failed or the server is unreachable.")
    assert "    max_results: (sent as 'max-results')" in issues_doc
    assert "    from_: (sent as 'from') Only issues updated since then" in issues_doc
    assert inspect.getdoc(time_server.convert_time_sync) == "Synchronous form of convert_time, for plain scripts."
    package_doc = inspect.getdoc(time_server)
    assert package_doc is not None
    assert package_doc.startswith(
        "MCP server 'mcp-time', imported as mcp.servers.time.\n\nTime and timezone conversion."
    )
    assert "    get_current_time: Get current time in a specific timezones\n" in package_doc
    assert "    convert_time: Convert time between timezones" in package_doc


def test_summary_and_signature_of_a_tool_doc() -> None:
    [search] = tool_docs("issues", ISSUES)
    [*_, structured] = tool_docs("everything", EVERYTHING)

    assert search.summary == "Search the issue tracker."
    assert search.signature() == (
        "search_issues(*, query: str, filter: IssueFilter | None = None, max_results: int = 20, "
        "from_: str | None = None, sort: Literal['updated', 'created'] = 'updated') -> SearchIssuesResult"
    )
    assert structured.signature() == (
        "getStructuredContent(*, location: Literal['New York', 'Chicago', 'Los Angeles']) -> GetStructuredContentResult"
    )
    long = tool_docs("x", tools(_tool("t", {}, description="word " * 100)))[0]
    assert len(long.summary) <= 120 and long.summary.endswith("…")


# Names


def test_tool_names_become_distinct_identifiers_whatever_the_server_calls_them(install: Install) -> None:
    wire = ["x", "x_sync", "x-sync", "class", "list", "annotations", "_private", "__init__", "123", "", "a b", "a_b"]
    tool_list = tools(*(_tool(name, {}) for name in wire))

    docs = tool_docs("odd", tool_list)
    names = [doc.python_name for doc in docs]
    package = install("odd", render_package("odd", "odd", None, docs))

    namespace = names + [f"{name}_sync" for name in names]
    assert len(set(namespace)) == len(namespace)
    assert dict(zip(wire, names, strict=True)) == {
        "x": "x",
        "x_sync": "x_sync_2",
        "x-sync": "x_sync_3",
        "class": "class_",
        "list": "list_",
        "annotations": "annotations_",
        "_private": "private",
        "__init__": "init__",
        "123": "tool_123",
        "": "tool",
        "a b": "a_b_2",
        "a_b": "a_b",
    }
    assert [doc.python_name for doc in tool_docs("odd", list(reversed(tool_list)))] == list(reversed(names))
    for doc in docs:
        assert getattr(package, doc.python_name).__name__ == doc.python_name


@pytest.mark.anyio
async def test_parameter_names_are_sanitised_and_the_wire_names_kept(install: Install, runtime: FakeRuntime) -> None:
    properties = {name: {"type": "string"} for name in ["from", "max-results", "_runtime", "_arguments", "a b", "1st"]}
    package = install("p", _package("p", tools(_tool("t", properties, required=["from"]))))

    parameters = list(inspect.signature(package.t).parameters)
    await package.t(**dict.fromkeys(parameters, "v"))

    assert parameters == ["from_", "max_results", "_runtime_", "_arguments_", "a_b", "arg_1st"]
    assert runtime.calls[0][3] == dict.fromkeys(properties, "v")


def test_class_names_do_not_collide(install: Install) -> None:
    nested = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tool = _tool(
        "x",
        {"result": nested, "Result": {**nested, "properties": {"b": {"type": "string"}}}},
        outputSchema={
            "type": "object",
            "properties": {"value": {"$ref": "#/$defs/XResult"}},
            "$defs": {"XResult": nested},
        },
    )
    module = sys.modules[install("c", _package("c", tools(tool))).x.__module__]

    parameters = inspect.signature(module.x).parameters
    assert parameters["result"].annotation == "XResult2 | None"
    assert parameters["Result"].annotation == "XResult3 | None"
    assert typing.get_type_hints(module.XResult) == {"value": module.XResult4}
    assert typing.get_type_hints(module.XResult4) == {"a": int}


# Types


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "str"),
        ({"type": ["string", "null"]}, "str | None"),
        ({"type": "number", "nullable": True}, "float | None"),
        ({"type": "array"}, "list[Any]"),
        ({"type": "array", "items": {"type": "integer"}}, "list[int]"),
        ({"type": "object"}, "dict[str, Any]"),
        ({"type": "object", "additionalProperties": {"type": "number"}}, "dict[str, float]"),
        ({"type": "object", "additionalProperties": True}, "dict[str, Any]"),
        ({"enum": ["a", 1, True, None]}, "Literal['a', 1, True, None]"),
        ({"type": "number", "enum": [1.5, 2.5]}, "float"),
        ({"const": "fixed"}, "Literal['fixed']"),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "string"}]}, "str | int"),
        ({"oneOf": [{"type": "null"}, {"anyOf": [{"type": "integer"}, {"type": "null"}]}]}, "int | None"),
        ({"anyOf": [{"type": "integer"}, {}]}, "Any"),
        ({"allOf": [{"type": "boolean"}]}, "bool"),
        ({"allOf": [{"type": "boolean"}, {"type": "string"}]}, "Any"),
        ({"$ref": "#/definitions/Name"}, "str"),
        ({"$ref": "#/$defs/Missing"}, "Any"),
        ({"$ref": "https://example.com/schema"}, "Any"),
        ({"not": {"type": "string"}}, "Any"),
        (True, "Any"),
        ({"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}}, None),
    ],
)
def test_json_schema_types(schema: Any, expected: str | None) -> None:
    tool = _tool("t", {"p": schema}, required=["p"])
    tool["inputSchema"]["definitions"] = {"Name": {"type": "string"}}

    [param] = tool_docs("s", tools(tool))[0].params

    assert param.type_expr == (expected or "list[list[list[str]]]")


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ({"type": "object"}, "dict[str, Any]"),
        ({"type": "array", "items": {"type": "string"}}, "list[str]"),
        ({"$ref": "#/$defs/R", "$defs": {"R": {"properties": {"n": {"type": "integer"}}}}}, "TResult"),
    ],
)
def test_output_schemas_that_are_not_plain_objects(install: Install, output: dict[str, Any], expected: str) -> None:
    [doc] = tool_docs("o", tools(_tool("t", {}, outputSchema=output)))
    module = sys.modules[install("o", render_package("o", "o", None, [doc])).t.__module__]

    assert doc.result_type == expected
    assert f"Returns:\n    {expected}: the tool's structured content." in (inspect.getdoc(module.t) or "")
    if expected == "TResult":
        assert typing.get_type_hints(module.TResult) == {"n": int}


def test_deep_schemas_are_cut_off_at_a_bounded_depth() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(50):
        schema = {"type": "array", "items": schema}

    [param] = tool_docs("s", tools(_tool("t", {"p": schema}, required=["p"])))[0].params

    ast.parse(param.type_expr, mode="eval")
    assert param.type_expr.startswith("list[list[") and param.type_expr.endswith("[Any]" + "]" * 8)
    assert param.type_expr.count("list[") < 12


def test_a_tool_with_forty_parameters(install: Install, runtime: FakeRuntime) -> None:
    properties = {f"p{i}": {"type": "integer", "description": f"Parameter {i}"} for i in range(40)}
    package = install("big", _package("big", tools(_tool("many", properties, required=[f"p{i}" for i in range(20)]))))

    signature = inspect.signature(package.many_sync)
    package.many_sync(**{f"p{i}": i for i in range(20)}, p30=30)

    assert list(signature.parameters) == [f"p{i}" for i in range(40)]
    assert [p.default for p in signature.parameters.values()][19:21] == [inspect.Parameter.empty, None]
    assert runtime.calls[0][3] == {**{f"p{i}": i for i in range(20)}, "p30": 30}


def test_a_server_with_two_hundred_tools_imports_without_loading_them(install: Install) -> None:
    properties = {"path": {"type": "string"}, "limit": {"type": "integer", "default": 10}}
    files = _package("wide", tools(*(_tool(f"tool_{i:03}", properties, required=["path"]) for i in range(200))))

    started = time.perf_counter()
    package = install("wide", files)
    elapsed = time.perf_counter() - started
    loaded = [name for name in sys.modules if name.startswith("mcp.servers.wide.")]
    _ = package.tool_123

    assert len(files) == 201
    assert loaded == []
    assert elapsed < 1.0
    assert [name for name in sys.modules if name.startswith("mcp.servers.wide.")] == ["mcp.servers.wide.tool_123"]


# Hostile servers

_PAYLOAD = '__import__("builtins").PWNED = 1'
_HOSTILE_TEXT = f'"""; {_PAYLOAD}; """ \'\'\' \\ \\"""\n{_PAYLOAD}\r\n# coding: latin-1\x00\x1b\u2028\x85\ud800 end "'
_HOSTILE_ENUM = ["a'b", 'c"d', "e\nf", '"""', "\\", f"'); {_PAYLOAD} #"]


def _hostile_tools() -> list[mcp_types.Tool]:
    properties = {
        f'x"); {_PAYLOAD}  #': {"type": "string", "description": _HOSTILE_TEXT},
        "has space": {"type": "string", "enum": _HOSTILE_ENUM},
        "with'quote": {"type": "string", "default": f"'; {_PAYLOAD}; '"},
        "nested": {
            "type": "object",
            "description": _HOSTILE_TEXT,
            "properties": {f"k\n{_PAYLOAD}": {"type": "string", "description": _HOSTILE_TEXT}, "ok": {"const": "\n"}},
        },
        "plain": {"type": "object", "description": _HOSTILE_TEXT, "properties": {"ok": {"type": "integer"}}},
    }
    output = {"type": "object", "properties": properties}
    hostile = [
        _tool('a"); import os; os.system("x")  #', properties, description=_HOSTILE_TEXT, title=_HOSTILE_TEXT),
        _tool(f"\n# -*- coding: utf-7 -*-\n{_PAYLOAD}", {}, description=_HOSTILE_TEXT, outputSchema=output),
    ]
    return tools(*hostile)


_IMPORTS = {("__future__", ("annotations",)), ("mcp", ("runtime",))}
_TYPING = {"Any", "Literal", "NotRequired", "TypedDict"}
_CALLS = {"TypedDict", "_runtime.call_tool", "_runtime.call_tool_sync"}
_BODY = (ast.Expr, ast.AnnAssign, ast.If, ast.Assign, ast.Return)


def _check_shape(source: str) -> None:
    """Only the statements a tool module is made of, and no calls but the ones it makes."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Expr):
            assert isinstance(node.value, ast.Constant)  # the docstring
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            assert (node.module, names) in _IMPORTS or (node.module == "typing" and set(names) <= _TYPING)
        elif isinstance(node, ast.ClassDef):
            assert [ast.unparse(base) for base in node.bases] == ["TypedDict"] and not node.decorator_list
            assert all(isinstance(item, ast.AnnAssign | ast.Expr) for item in node.body)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert not node.decorator_list and all(isinstance(item, _BODY) for item in node.body)
        else:
            assert isinstance(node, ast.Assign), ast.dump(node)
    assert all(ast.unparse(node.func) in _CALLS for node in ast.walk(tree) if isinstance(node, ast.Call))


def _shape_only(source: str) -> str:
    """The AST with every string blanked: what is left is the code."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def test_hostile_names_descriptions_and_values_cannot_inject_code(install: Install) -> None:
    docs = tool_docs("evil", _hostile_tools())
    files = render_package("evil", _HOSTILE_TEXT, _HOSTILE_TEXT, docs)
    benign = render_package("evil", "benign", "benign", tool_docs("evil", tools(_tool("a", {}), _tool("b", {}))))

    assert _shape_only(files["__init__.py"]) == _shape_only(benign["__init__.py"])
    for path, source in files.items():
        source.encode("utf-8")  # lone surrogates were escaped, not written
        assert not any(re.match(r"[ \t\f]*#.*?coding[:=]", line) for line in source.splitlines()[:2])
        if path != "__init__.py":
            _check_shape(source)
    package = install("evil", files)
    first, second = (sys.modules[getattr(package, doc.python_name).__module__] for doc in docs)

    assert not hasattr(builtins, "PWNED")
    for module, doc in [(first, docs[0]), (second, docs[1])]:
        assert set(vars(module)) - set(vars(types.ModuleType("m"))) == {
            "__builtins__", "__file__", "__cached__", "__all__", "annotations", "_runtime",
            *doc.types.typing_names, *doc.types.class_names, doc.python_name, f"{doc.python_name}_sync",
        }  # fmt: skip
    function = getattr(package, docs[0].python_name)
    text = _HOSTILE_TEXT.replace("\r\n", "\n").replace("\ud800", "\ufffd")
    assert text in inspect.cleandoc(function.__doc__)
    assert package.__doc__ is not None
    assert package.__doc__.startswith(f"MCP server {one_line(_HOSTILE_TEXT)!r}, imported as mcp.servers.evil.")
    assert text.strip() in package.__doc__
    hints = typing.get_type_hints(function)
    assert typing.get_args(typing.get_args(hints["has_space"])[0]) == tuple(_HOSTILE_ENUM)
    assert inspect.signature(function).parameters["with_quote"].default == f"'; {_PAYLOAD}; '"
    assert set(typing.get_type_hints(typing.get_args(hints["nested"])[0])) == {f"k\n{_PAYLOAD}", "ok"}
    assert text in inspect.cleandoc(typing.get_args(hints["plain"])[0].__doc__)
    result = getattr(second, docs[1].result_type)
    assert set(result.__optional_keys__) == set(_hostile_tools()[0].input_schema["properties"])


def test_render_package_refuses_docs_of_another_server_or_repeated_names() -> None:
    docs = tool_docs("time", TIME)

    with pytest.raises(ValueError):
        render_package("other", "x", None, docs)
    with pytest.raises(ValueError):
        render_package("time", "x", None, [docs[0], docs[0]])
    with pytest.raises(ValueError):
        tool_docs("not-an-identifier", TIME)


def test_render_tool_module_refuses_names_that_are_not_identifiers() -> None:
    doc = tool_docs("time", TIME)[0]
    forged = dataclasses.replace(doc, python_name="x; import os")

    with pytest.raises(ValueError):
        render_tool_module(forged)
