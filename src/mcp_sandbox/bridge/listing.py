"""What ``mcp-sandbox servers`` prints: the discovered servers, the problems and the skipped entries.

Neither form shows an env or header value: env and headers appear as their keys (JSON) or not at
all (text), and command lines and URLs are masked as :attr:`ServerSpec.target` masks them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from mcp_sandbox.bridge.discovery import Discovery, Problem

__all__ = ["describe", "describe_json"]

_HEADINGS = ("ALIAS", "NAME", "TRANSPORT", "TOOLS", "COMMAND / URL", "SOURCE")


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _problem_lines(title: str, problems: Sequence[Problem]) -> list[str]:
    if not problems:
        return []
    return ["", f"{title}:", *(f"  {problem}" for problem in problems)]


def describe(discovery: Discovery, tool_counts: Mapping[str, int | str] | None = None) -> str:
    """A table of the servers, then the problems and skipped entries, as text.

    Args:
        discovery: what :func:`~mcp_sandbox.bridge.discovery.discover` found.
        tool_counts: alias -> number of tools (or a short note such as ``"failed"``); ``-`` when absent.
    """
    counts = tool_counts or {}
    if discovery.servers:
        rows = [_HEADINGS] + [
            (alias, spec.name, spec.transport, str(counts.get(alias, "-")), spec.target, str(spec.source))
            for alias, spec in discovery.servers.items()
        ]
        lines = _table(rows)
    else:
        lines = ["No downstream MCP servers found. Searched:", *(f"  {path}" for path in discovery.searched)]
    lines += _problem_lines("Problems", discovery.problems)
    lines += _problem_lines("Skipped", discovery.skipped)
    return "\n".join(lines)


def _problem_data(problem: Problem) -> dict[str, str | None]:
    return {"source": str(problem.source), "server": problem.server, "reason": problem.reason}


def describe_json(discovery: Discovery, tool_counts: Mapping[str, int | str] | None = None) -> str:
    """The same as :func:`describe`, as a JSON document (plus the env and header keys, and every path searched)."""
    counts = tool_counts or {}
    servers = [
        {
            "alias": alias,
            "name": spec.name,
            "transport": spec.transport,
            "tools": counts.get(alias),
            "target": spec.target,
            "cwd": None if spec.cwd is None else str(spec.cwd),
            "env_keys": sorted(spec.env),
            "header_keys": sorted(spec.headers),
            "allow_tools": None if spec.allow_tools is None else sorted(spec.allow_tools),
            "deny_tools": sorted(spec.deny_tools),
            "tenants": None if spec.tenants is None else sorted(spec.tenants),
            "per_tenant": spec.per_tenant,
            "source": str(spec.source),
        }
        for alias, spec in discovery.servers.items()
    ]
    document = {
        "servers": servers,
        "problems": [_problem_data(problem) for problem in discovery.problems],
        "skipped": [_problem_data(problem) for problem in discovery.skipped],
        "searched": [str(path) for path in discovery.searched],
    }
    return json.dumps(document, ensure_ascii=False, indent=2)
