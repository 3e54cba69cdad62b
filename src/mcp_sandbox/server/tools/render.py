"""The text a model reads for an execution result: ``compact`` (default), ``json``, ``toon`` or ``runner``.

``toon`` is the earlier bridge's: a fenced ```` ```toon ```` block with a ``summary`` and the
streams as lists of lines, then the other fields of ``structuredContent``.

A stream longer than :data:`TEXT_STREAM_CHARS` is not repeated whole in the text: the text
carries its beginning and a note, and ``structuredContent`` (the contract) carries all of it, so
a large output crosses the wire once rather than twice.
"""

from __future__ import annotations

import json
from typing import Any

import toon_format

from mcp_sandbox.config import OutputMode
from mcp_sandbox.engine.result import ExecutionResult
from mcp_sandbox.server.tools.runner_shape import runner_run

__all__ = ["render"]

_LISTED_FILES = 20  # in the text; structuredContent lists them all
# Past this many characters, a stream's text shows only its beginning (structuredContent has it all).
TEXT_STREAM_CHARS = 64 << 10


def _shortened(text: str, stream: str) -> str:
    if len(text) <= TEXT_STREAM_CHARS:
        return text
    rest = len(text) - TEXT_STREAM_CHARS
    return (
        f"{text[:TEXT_STREAM_CHARS]}\n[{rest} more characters of {stream} not repeated in this text:"
        f" structuredContent.{stream} has all {len(text)}]\n"
    )


def _notes(data: dict[str, Any]) -> list[str]:
    """What the result adds to the output: a fork's origin, a checkpoint, images not returned, a quota
    warning, the files."""
    lines = []
    if data.get("session") == "resumed":
        not_kept = data.get("notKept") or []
        lines.append("(session: resumed" + (f"; not kept: {'; '.join(not_kept)})" if not_kept else ")"))
    if fork := data.get("fork"):
        carried = f"(forked from {fork['from']}: {fork['files']} files, {fork['variables']} variables"
        skipped = fork.get("skipped") or []
        lines.append(carried + (f"; not carried: {'; '.join(skipped)})" if skipped else ")"))
    checkpoint = data.get("checkpoint") or {}
    for done in ("restored", "saved"):
        if step := checkpoint.get(done):
            variables = "its variables" if step["variables"] else "no variables"
            line = f"(checkpoint {step['name']!r} {done} before the run: {step['files']} files, {variables}"
            if step.get("notKept"):
                line += f"; not kept: {'; '.join(step['notKept'])}"
            if "checkpoints" in step:
                line += f"; this conversation's checkpoints: {', '.join(step['checkpoints'])}"
            lines.append(line + ")")
    if deleted := checkpoint.get("deleted"):
        left = ", ".join(deleted["checkpoints"]) or "none"
        freed = f"{deleted['bytes']} bytes freed; left: {left}"
        lines.append(f"(checkpoint {deleted['name']!r} deleted before the run: {freed})")
    if clamped := data.get("timeoutClamped"):
        lines.append(
            f"(timeout {clamped['requested']:g} s is above this server's maximum: the run had {clamped['used']:g} s)"
        )
    if dropped := data.get("imagesDropped"):
        lines.append(
            f"({dropped} image{'s' if dropped != 1 else ''} not returned: past this server's per-run cap or size "
            "limit, or not PNG/JPEG/GIF/WebP)"
        )
    if data.get("warning"):
        lines.append(str(data["warning"]))
    files = data.get("files") or []
    if files:
        lines.append(f"--- files in /workspace ({len(files)}) ---")
        shown = files[:_LISTED_FILES]
        lines += [f"{f['name']} ({f['size']} bytes)" + (f" {f['url']}" if f.get("url") else "") for f in shown]
        if len(files) > len(shown):
            lines.append(f"… and {len(files) - len(shown)} more (all in structuredContent.files)")
    return lines


def _compact(result: ExecutionResult, data: dict[str, Any]) -> str:
    stdout, stderr = _shortened(result.stdout, "stdout"), _shortened(result.stderr, "stderr")
    if result.status == "success" and not result.stderr and not result.truncated:
        body = stdout if stdout else "(no output)"
        extra = _notes(data)
        return "\n".join([body.rstrip("\n"), *extra]) if extra else body
    parts = [f"status: {result.status}"]
    if result.exit_code is not None:
        parts.append(f"exit {result.exit_code}")
    parts.append(f"{result.duration_ms} ms")
    lines = [" · ".join(parts)]
    if result.error:
        lines.append(f"error: {result.error}")
    if stdout:
        lines += ["--- stdout ---", stdout.rstrip("\n")]
    if stderr:
        lines += ["--- stderr ---", stderr.rstrip("\n")]
    lines += _notes(data)
    return "\n".join(lines)


def _summary(data: dict[str, Any]) -> str:
    status, error = data.get("status"), data.get("error")
    if status == "success":
        return "Success" if data.get("stdout") or data.get("stderr") else "Success (no output)"
    if status == "validation_error":
        return str(error or "Invalid arguments")
    what = "Timeout" if status == "timeout" else "Error"
    if error:
        return f"{what}: {error}"
    return f"{what}: exit code {data.get('exitCode')}" if data.get("exitCode") is not None else what


def _toon(data: dict[str, Any]) -> str:
    """The earlier bridge's TOON: a ```toon block of status, summary, and stdout/stderr as lists of lines."""
    payload: dict[str, Any] = {
        "status": data.get("status"),
        "summary": _summary(data),
        "exitCode": data.get("exitCode"),
    }
    payload["stdout"] = str(data.get("stdout") or "").splitlines()
    payload["stderr"] = str(data.get("stderr") or "").splitlines()
    payload.update({key: value for key, value in data.items() if key not in payload})
    body = toon_format.encode(payload).rstrip()
    return f"```toon\n{body}\n```"


def render(result: ExecutionResult, mode: OutputMode, data: dict[str, Any] | None = None) -> str:
    """Render ``result`` for the model in ``mode``; ``data`` is its structured form when the tool added to it."""
    data = result.structured() if data is None else data
    if mode == "runner":
        return runner_run(result, data)
    if mode != "compact":
        data = {**data, **{key: _shortened(data[key], key) for key in ("stdout", "stderr") if key in data}}
    if mode == "json":
        return json.dumps(data, ensure_ascii=False)
    if mode == "toon":
        return _toon(data)
    return _compact(result, data)
