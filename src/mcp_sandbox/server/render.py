"""The text a model reads for an execution result: ``compact`` (default), ``json`` or ``toon``."""

from __future__ import annotations

import json
from typing import Any

import toon_format

from mcp_sandbox.config import OutputMode
from mcp_sandbox.engine.result import ExecutionResult

__all__ = ["render"]


def _compact(result: ExecutionResult) -> str:
    if result.status == "success" and not result.stderr and not result.truncated:
        return result.stdout if result.stdout else "(no output)"
    parts = [f"status: {result.status}"]
    if result.exit_code is not None:
        parts.append(f"exit {result.exit_code}")
    parts.append(f"{result.duration_ms} ms")
    lines = [" · ".join(parts)]
    if result.error:
        lines.append(f"error: {result.error}")
    if result.stdout:
        lines += ["--- stdout ---", result.stdout.rstrip("\n")]
    if result.stderr:
        lines += ["--- stderr ---", result.stderr.rstrip("\n")]
    return "\n".join(lines)


def render(result: ExecutionResult, mode: OutputMode) -> str:
    """Render ``result`` for the model in ``mode``."""
    data: dict[str, Any] = result.structured()
    if mode == "json":
        return json.dumps(data, ensure_ascii=False)
    if mode == "toon":
        text: str = toon_format.encode(data)
        return text
    return _compact(result)
