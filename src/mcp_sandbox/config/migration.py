"""The earlier systems' settings and names: what a user of the stdio bridge or the HTTP code runner brings.

The bridge (``MCP_BRIDGE_*``, one ``run_python`` over stdio whose files carried over between
calls) and the code runner (``MCP_API_TOKEN``, ``PUBLIC_BASE_URL``, ``MCP_HTTP_ADDR``, its
``SANDBOX_ROOT`` of conversations named with ``FILE_SECRET``) are served as they were
(docs/migration.md). Their variables that name one of our settings are declared with it as its
``alias`` (:func:`~.fields.setting`); what only they had is here: :class:`MigrationSettings`,
the variables that give an address in one, and those that say a runner's user configured the server.
"""

# ruff: noqa: RUF009 - each default is a dataclasses.field made by setting(), which declares the field.

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.config.fields import check_fields, setting

__all__ = ["ADDRESS_ALIASES", "RUNNER_ENV", "MigrationSettings"]

# Variables that give host and port in one ``host:port`` (Go's form: ``:8080`` is every address).
ADDRESS_ALIASES: tuple[str, ...] = ("MCP_HTTP_ADDR",)

# The earlier code runner's own variables: a server configured with any of them (and no output mode
# given) answers in that runner's JSON shape, which its users' scripts parse.
RUNNER_ENV: tuple[str, ...] = ("MCP_API_TOKEN", "PUBLIC_BASE_URL", "MCP_HTTP_ADDR", "SANDBOX_ROOT", "FILE_SECRET")


@dataclass(frozen=True, slots=True)
class MigrationSettings:
    """The bridge's stdio conversation, and the code runner's data to import at start."""

    stdio_conversation: str | None = setting(
        None,
        (
            "Over stdio, the `conversationId` of every call that names none: variables and "
            "files carry over between calls (the earlier bridge's default)."
        ),
    )
    runner_data: Path | None = setting(
        None,
        "The earlier code runner's `SANDBOX_ROOT`: imported at start with `runner_secret` (see docs/migration.md).",
        alias="SANDBOX_ROOT",
    )
    runner_secret: str | None = setting(
        None,
        "The earlier code runner's `FILE_SECRET`, which named its conversations' directories.",
        alias="FILE_SECRET",
    )

    def __post_init__(self) -> None:
        check_fields(self)
