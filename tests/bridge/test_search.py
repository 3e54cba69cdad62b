"""Tool search: BM25 over the tools of several real-looking servers."""

from __future__ import annotations

import pytest

from bridge.tool_fixtures import SERVERS, tools
from mcp_sandbox.bridge.search import DETAILS, ToolIndex, render, tokenize
from mcp_sandbox.bridge.stubs import ToolDoc, render_tool_module, tool_docs


@pytest.fixture(scope="module")
def docs() -> list[ToolDoc]:
    return [doc for alias, tools in SERVERS.items() for doc in tool_docs(alias, tools)]


@pytest.fixture(scope="module")
def index(docs: list[ToolDoc]) -> ToolIndex:
    return ToolIndex(docs)


def _names(hits: list[tuple[ToolDoc, float]]) -> list[str]:
    return [f"{doc.server}.{doc.name}" for doc, _ in hits]


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("current time in tokyo", "time.get_current_time"),
        ("convert a time between timezones", "time.convert_time"),
        ("read file", "filesystem.read_file"),
        ("read a text file", "filesystem.read_text_file"),
        ("write a file", "filesystem.write_file"),
        ("list directory", "filesystem.list_directory"),
        ("git log", "git.git_log"),
        ("commit changes", "git.git_commit"),
        ("remember entity", "memory.create_entities"),
        ("knowledge graph", "memory.read_graph"),
        ("tiny image", "everything.getTinyImage"),
        ("long running", "everything.longRunningOperation"),
        ("add two numbers", "everything.add"),
        ("search issues", "issues.search_issues"),
        ("weather conditions", "everything.getStructuredContent"),  # words of the result schema
    ],
)
def test_the_right_tool_ranks_first(index: ToolIndex, query: str, best: str) -> None:
    assert _names(index.search(query))[0] == best


def test_hits_are_ranked_best_first(index: ToolIndex) -> None:
    hits = index.search("repo path")

    scores = [score for _, score in hits]
    assert scores == sorted(scores, reverse=True) and all(score > 0 for score in scores)
    assert {doc.server for doc, _ in hits[:6]} == {"git"}  # repo and path; then filesystem's path


def test_ties_go_by_server_then_name() -> None:
    same = {"description": "Copies a thing.", "inputSchema": {"type": "object", "properties": {}}}
    twins = tools({"name": "zeta_tool", **same}, {"name": "beta_tool", **same})

    hits = ToolIndex([*tool_docs("two", twins), *tool_docs("one", twins)]).search("tool")

    assert len({score for _, score in hits}) == 1
    assert _names(hits) == ["one.beta_tool", "one.zeta_tool", "two.beta_tool", "two.zeta_tool"]


def test_the_server_filter_and_the_limit(index: ToolIndex) -> None:
    assert {doc.server for doc, _ in index.search("file", servers={"git", "memory"})} <= {"git", "memory"}
    assert _names(index.search("read", servers=["memory"])) == ["memory.read_graph"]
    assert index.search("read", servers=[]) == []
    assert len(index.search("the file", limit=2)) == 2
    assert index.search("file", limit=0) == []


@pytest.mark.parametrize("query", ["", "   ", "the of and", "xyzzy", "!!!"])
def test_a_blank_query_or_one_without_matches_finds_nothing(index: ToolIndex, query: str) -> None:
    assert index.search(query) == []


def test_an_empty_index_finds_nothing() -> None:
    assert ToolIndex([]).search("time") == []


def test_tokens_split_camel_case_snake_case_kebab_dots_and_digits() -> None:
    assert tokenize("longRunningOperation") == ["long", "running", "operation"]
    assert tokenize("HTTPServer.get_file-info v2") == ["http", "server", "get", "file", "info", "2"]
    assert tokenize("base64Encode") == ["base", "64", "encode"]
    assert tokenize("The entities of the Files") == ["entity", "file"]
    assert tokenize("status process analysis") == ["status", "process", "analysis"]
    assert tokenize("Café ÜBER") == ["café", "über"]


def test_a_camel_case_query_finds_a_snake_case_tool(index: ToolIndex) -> None:
    assert _names(index.search("gitDiffUnstaged"))[0] == "git.git_diff_unstaged"
    assert _names(index.search("get-tiny-image"))[0] == "everything.getTinyImage"


def test_render_at_each_detail(docs: list[ToolDoc]) -> None:
    [doc] = [doc for doc in docs if doc.name == "get_current_time"]

    assert DETAILS == ("name", "summary", "full")
    assert render(doc, "name") == "time.get_current_time"
    assert render(doc, "summary") == (
        "time.get_current_time(*, timezone: str) -> GetCurrentTimeResult — Get current time in a specific timezones"
    )
    assert render(doc, "full") == render_tool_module(doc)
    with pytest.raises(ValueError):
        render(doc, "everything")  # type: ignore[arg-type]
