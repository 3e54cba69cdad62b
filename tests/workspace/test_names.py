"""File names stay inside the workspace; conversation ids are short printable strings."""

from __future__ import annotations

import pytest

from mcp_sandbox.errors import ValidationError
from mcp_sandbox.workspace import RESERVED_PREFIX, check_conversation_id, check_filename


@pytest.mark.parametrize(
    "name",
    ["data.csv", "plots/a.png", "a/b/c/d.txt", ".hidden", "ünïcödé ✓.txt", "x" * 255, "/".join(["d"] * 16)],
)
def test_relative_posix_paths_are_accepted_unchanged(name: str) -> None:
    assert check_filename(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "../x",
        "a/../../x",
        "a/..",
        "./x",
        "a//b",
        "a/",
        "/etc/x",
        "/",
        "a\x00b",
        "a\\b",
        "..\\x",
        "line\nbreak",
        "tab\there",
        "del\x7f",
        "x" * 256,
        "é" * 128,  # 256 bytes of UTF-8 in 128 characters
        "/".join(["d"] * 17),
        "/".join(["x" * 200] * 6),  # every component fine, 1,205 bytes in all
        "bad\udcffsurrogate",
        f"{RESERVED_PREFIX}upload-123",
        f"sub/{RESERVED_PREFIX}removing-1/x",
    ],
)
def test_names_that_could_leave_the_workspace_or_cannot_be_served_are_refused(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_filename(name)

    assert caught.value.argument == "filename"


def test_the_refusal_names_the_argument_the_caller_gives() -> None:
    with pytest.raises(ValidationError) as caught:
        check_filename("../x", argument="path")

    assert caught.value.argument == "path"


@pytest.mark.parametrize("value", [None, 42, b"data.csv", ["a"]])
def test_a_filename_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(ValidationError):
        check_filename(value)


@pytest.mark.parametrize("value", ["c", "chat-42", "x" * 256, "any thing: / .. \\ ünïcödé"])
def test_conversation_ids_of_1_to_256_printable_characters_are_accepted(value: str) -> None:
    assert check_conversation_id(value) == value


@pytest.mark.parametrize("value", ["", "x" * 257, "a\x00b", "a\nb", "\x1b[31m", None, 7, b"id", {"id": 1}])
def test_bad_conversation_ids_are_refused_naming_conversationId(value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        check_conversation_id(value)

    assert caught.value.argument == "conversationId"
