"""render(result, mode): the text a model reads, in compact, json and toon."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import toon_format

from mcp_sandbox.config import OutputMode
from mcp_sandbox.engine import ExecutionResult
from mcp_sandbox.server.tools.render import TEXT_STREAM_CHARS, render

SUCCESS = ExecutionResult(status="success", exit_code=0, stdout="4\n", duration_ms=12)
EMPTY = ExecutionResult(status="success", exit_code=0, duration_ms=3)
ERROR = ExecutionResult(
    status="error",
    exit_code=1,
    stdout="partial\n",
    stderr='Traceback (most recent call last):\n  File "<main>", line 1\nValueError: boom\n',
    duration_ms=40,
)
TIMEOUT = ExecutionResult(
    status="timeout", exit_code=124, stdout="tick\n", duration_ms=1001, error="timed out after 1 s"
)
INVALID = ExecutionResult.invalid("timeout: must be > 0")
WARNED = ExecutionResult(status="success", exit_code=0, stdout="done\n", stderr="UserWarning: careful\n")
TRUNCATED = ExecutionResult(status="success", exit_code=0, stdout="xxxx\n[output truncated]\n", truncated=True)
AWKWARD = ExecutionResult(
    status="error",
    exit_code=2,
    stdout='key: value\n- item\n"quoted", comma\n\ttab  ',
    stderr="héllo ✓ \ufffd\n\n",
    duration_ms=7,
    error="a: b",
)

IMAGES_DROPPED = ExecutionResult(status="success", exit_code=0, stdout="plotted\n", images_dropped=2)

ALL = [SUCCESS, EMPTY, ERROR, TIMEOUT, INVALID, WARNED, TRUNCATED, AWKWARD, IMAGES_DROPPED]
ALL_IDS = ["success", "empty", "error", "timeout", "invalid", "warned", "truncated", "awkward", "images-dropped"]


def test_compact_success_with_only_stdout_is_just_the_stdout() -> None:
    assert render(SUCCESS, "compact") == "4\n"


def test_compact_success_without_output_says_no_output() -> None:
    assert render(EMPTY, "compact") == "(no output)"


def test_compact_error_has_a_header_then_stdout_and_stderr_sections() -> None:
    lines = render(ERROR, "compact").splitlines()

    assert lines[0].startswith("status: error")
    assert "exit 1" in lines[0]
    assert "40 ms" in lines[0]
    stdout_at = lines.index("--- stdout ---")
    stderr_at = lines.index("--- stderr ---")
    assert stdout_at < stderr_at
    assert lines[stdout_at + 1] == "partial"
    assert lines[stderr_at + 1 :] == ERROR.stderr.rstrip("\n").splitlines()


def test_compact_timeout_shows_the_hosts_explanation() -> None:
    lines = render(TIMEOUT, "compact").splitlines()

    assert lines[0].startswith("status: timeout")
    assert "error: timed out after 1 s" in lines
    assert "tick" in lines


def test_compact_validation_error_has_no_exit_code_and_names_the_argument() -> None:
    text = render(INVALID, "compact")

    assert text.startswith("status: validation_error")
    assert "exit" not in text.splitlines()[0]
    assert "timeout: must be > 0" in text


@pytest.mark.parametrize("result", [WARNED, TRUNCATED], ids=["stderr", "truncated"])
def test_compact_success_with_stderr_or_truncation_is_not_just_the_stdout(result: ExecutionResult) -> None:
    text = render(result, "compact")

    assert text.startswith("status: success")
    assert "--- stdout ---" in text.splitlines()


@pytest.mark.parametrize("result", ALL, ids=ALL_IDS)
def test_json_parses_back_to_the_structured_content(result: ExecutionResult) -> None:
    assert json.loads(render(result, "json")) == result.structured()


def test_json_keeps_non_ascii_text_readable() -> None:
    assert "héllo ✓" in render(AWKWARD, "json")


def _toon_body(text: str) -> Any:
    # The earlier bridge's clients take the block between the fences (its tests' own pattern).
    match = re.fullmatch(r"```toon\s*\n(.*?)\n```", text, re.DOTALL)
    assert match is not None, text
    return toon_format.decode(match.group(1).strip())


@pytest.mark.parametrize("result", ALL, ids=ALL_IDS)
def test_toon_is_the_earlier_bridges_block_holding_the_structured_content(result: ExecutionResult) -> None:
    decoded = _toon_body(render(result, "toon"))
    data = result.structured()

    assert decoded["stdout"] == data["stdout"].splitlines()  # lists of lines, as the earlier bridge's
    assert decoded["stderr"] == data["stderr"].splitlines()
    assert decoded["summary"]
    rest = {key: value for key, value in decoded.items() if key not in ("stdout", "stderr", "summary")}
    assert rest == {key: value for key, value in data.items() if key not in ("stdout", "stderr")}


def test_toon_has_the_earlier_bridges_summaries() -> None:
    success = _toon_body(render(ExecutionResult(status="success", exit_code=0, stdout="line1\nline2\n"), "toon"))
    quiet = _toon_body(render(ExecutionResult(status="success", exit_code=0), "toon"))
    invalid = _toon_body(render(INVALID, "toon"))

    assert (success["summary"], success["stdout"], success["stderr"]) == ("Success", ["line1", "line2"], [])
    assert quiet["summary"] == "Success (no output)"
    assert invalid["summary"] == invalid["error"] == "timeout: must be > 0"


def test_toon_has_one_line_per_scalar_field() -> None:
    lines = render(SUCCESS, "toon").splitlines()

    assert "status: success" in lines
    assert "exitCode: 0" in lines
    assert "truncated: false" in lines


def test_compact_says_how_many_images_were_dropped_after_the_output() -> None:
    lines = render(IMAGES_DROPPED, "compact").splitlines()

    assert lines[0] == "plotted"
    assert lines[1].startswith("(2 images not returned")
    assert IMAGES_DROPPED.structured()["imagesDropped"] == 2
    assert "imagesDropped" not in SUCCESS.structured()


def test_compact_says_what_a_fork_carried_and_what_not_after_the_output() -> None:
    fork = {"from": "c-1", "files": 2, "bytes": 10, "reflinked": 0, "variables": 3, "modules": 9, "skipped": []}
    skipped = {**fork, "skipped": ["g (TypeError: cannot pickle 'generator' object)"]}

    assert render(SUCCESS, "compact", {"fork": fork}).splitlines()[1] == "(forked from c-1: 2 files, 3 variables)"
    assert render(SUCCESS, "compact", {"fork": skipped}).splitlines()[1] == (
        "(forked from c-1: 2 files, 3 variables; not carried: g (TypeError: cannot pickle 'generator' object))"
    )


HUGE = ExecutionResult(status="success", exit_code=0, stdout="A" + "x" * (1 << 20), stderr="E" * (200 << 10))


@pytest.mark.parametrize("mode", ["compact", "json", "toon"])
def test_a_large_output_is_not_repeated_whole_in_the_text(mode: OutputMode) -> None:
    # Issue 34, finding 6: a 5 MB print sent its kept 1 MiB in the text and again in structuredContent.
    text = render(HUGE, mode)

    assert len(text) < 3 * TEXT_STREAM_CHARS
    assert f"structuredContent.stdout has all {len(HUGE.stdout)}" in text
    assert "structuredContent.stderr has all" in text
    assert "A" + "x" * 100 in text  # the beginning is there to read
    assert HUGE.structured()["stdout"] == HUGE.stdout  # the contract keeps all of it
