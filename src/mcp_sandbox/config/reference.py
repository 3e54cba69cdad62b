"""The settings table of the docs, rendered from the declarations of :mod:`.settings`.

``docs/configuration.md`` embeds :func:`settings_table` between its ``settings-table`` markers,
and a test checks the page matches: a setting added, renamed or redescribed shows there.
"""

from __future__ import annotations

from dataclasses import MISSING, Field
from typing import Any

from mcp_sandbox.config.fields import BYTES, DURATION
from mcp_sandbox.config.migration import ADDRESS_ALIASES
from mcp_sandbox.config.settings import SETTINGS

__all__ = ["FLAGS", "env_names", "settings_table"]

# The settings that are also command-line flags (``--state-dir`` for ``state_dir``); the CLI's
# parser declares them, and a test keeps the two the same.
FLAGS = frozenset(
    {
        "state_dir",
        "backend",
        "servers_config",
        "output_mode",
        "timeout",
        "max_timeout",
        "memory",
        "pids",
        "cpus",
        "log_level",
        "host",
        "port",
        "public_url",
        "data_dir",
        "accept_weaker_isolation",
    }
)

_SIZES = ((1 << 40, "t"), (1 << 30, "g"), (1 << 20, "m"), (1 << 10, "k"))
_DURATIONS = ((86400, "d"), (3600, "h"), (60, "m"))


def _size(value: int) -> str:
    for factor, unit in _SIZES:
        if value and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def _duration(value: float) -> str:
    for factor, unit in _DURATIONS:
        if value and value % factor == 0:
            return f"{value // factor:g}{unit}"
    return f"{value:g}s"


def _default(declaration: Field[Any]) -> str:
    shown = declaration.metadata.get("shown")
    if shown is not None:
        return str(shown)
    value = declaration.default
    assert value is not MISSING, declaration.name  # only computed() settings have no fixed default
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if declaration.metadata["unit"] == BYTES:
        return f"`{_size(value)}`"
    if declaration.metadata["unit"] == DURATION:
        return f"`{_duration(value)}`"
    if isinstance(value, tuple):
        return f"`{','.join(str(item) for item in value)}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def env_names(name: str) -> tuple[str, ...]:
    """The environment variables that set ``name``: ``MCP_SANDBOX_<NAME>``, then its alias if any."""
    alias = SETTINGS[name].metadata["alias"]
    return (f"MCP_SANDBOX_{name.upper()}", *((alias,) if alias else ()))


def settings_table() -> str:
    """Every setting as a markdown table: key, flag, environment variables, default, what it does."""
    lines = ["| Setting | Flag | Environment | Default | What it does |", "| --- | --- | --- | --- | --- |"]
    for name, declaration in SETTINGS.items():
        env = [f"`{variable}`" for variable in env_names(name)]
        if name in ("host", "port"):
            env += [f"`{variable}` (host:port)" for variable in ADDRESS_ALIASES]
        flag = f"`--{name.replace('_', '-')}`" if name in FLAGS else ""
        doc = declaration.metadata["doc"]
        lines.append(f"| `{name}` | {flag} | {', '.join(env)} | {_default(declaration)} | {doc} |")
    return "\n".join(lines) + "\n"


def _main() -> None:  # pragma: no cover - python -m mcp_sandbox.config.reference
    print(settings_table(), end="")


if __name__ == "__main__":  # pragma: no cover
    _main()
