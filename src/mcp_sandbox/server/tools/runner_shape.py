"""The ``runner`` output mode: the earlier code runner's JSON text, which its users' scripts parse.

That runner's tools answered with one text item holding JSON: ``{"success":true,"output":…,
"files":[{"name","url"}]}`` from ``run_code``, ``{"success":true,"message":…,"file":{"name","url"}}``
from ``upload_file``, and ``{"success":false,"error":…}`` on failure. ``structuredContent`` keeps
this server's fields in every mode; only the text takes that shape.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_sandbox.engine.result import ExecutionResult

__all__ = ["runner_error", "runner_run", "runner_upload"]


def _text(value: dict[str, Any]) -> str:
    # Compact separators: its users grep for '"success":true' with no space after the colon.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _files(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": f["name"], "url": f.get("url")} for f in data.get("files") or []]


def runner_run(result: ExecutionResult, data: dict[str, Any]) -> str:
    """A run as that runner said it: its output (stdout, then stderr) and the conversation's files."""
    output = result.stdout + result.stderr
    if result.status == "success":
        return _text({"success": True, "output": output, "files": _files(data)})
    # The reason: this server's (a limit, a refusal), else what the code printed to stderr (a traceback).
    reason = result.error or result.stderr.strip() or f"exit code {result.exit_code}"
    return _text({"success": False, "error": reason, "output": output, "files": _files(data)})


def runner_upload(data: dict[str, Any]) -> str:
    """A stored upload: a message and the file's name and link."""
    message = f"File {data['name']} uploaded successfully ({data['size']} bytes)"
    return _text({"success": True, "message": message, "file": {"name": data["name"], "url": data["url"]}})


def runner_error(message: str) -> str:
    """A refused call."""
    return _text({"success": False, "error": message})
