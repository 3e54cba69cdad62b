"""The pieces of the settings a conversation keeps between runs: its session's interpreter and its workspace.

Each a frozen piece of :class:`~mcp_sandbox.config.settings.Settings`, its fields declared with
:func:`~.fields.setting`; each checks its own values when made. What one run uses is in :mod:`.pieces`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_sandbox.config.fields import (
    BYTES,
    DURATION,
    check_fields,
    duration,
    duration_or_zero,
    non_negative,
    positive,
    setting,
)

__all__ = ["SessionSettings", "WorkspaceSettings"]


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Stateful sessions: a conversation's interpreter kept between runs."""

    sessions: bool = setting(True, "Keep a conversation's interpreter between runs.")
    session_ttl: float = setting(
        600.0, "An idle session's interpreter is stopped after this (its files stay).", check=duration, unit=DURATION
    )
    session_park_after: float = setting(
        300.0,
        (
            "An idle session's interpreter is parked after this: its variables saved with the conversation, "
            "its sandbox released, the next run resumes them (0: never; parked at `session_ttl` at the latest)."
        ),
        check=duration_or_zero,
        unit=DURATION,
    )
    max_sessions: int = setting(16, "Live interpreters; the least recently used idle one makes room.", check=positive)
    session_cpu_seconds: int = setting(3600, "CPU seconds one session's interpreter may use in all.", check=positive)
    tenant_sessions: int | None = setting(
        None,
        ("Live session interpreters of one tenant (its own least recently used idle one makes room)."),
        check=positive,
    )
    session_ready: int = setting(
        2,
        (
            "Sandboxes kept ready to become a new session (bwrap): a conversation's first Python "
            "run takes one, its runner started ahead, every other one preloading `pool_preload` for a "
            "run naming them, the rest light (0: none); per tenant's own uid, at most `tenant_concurrent_runs`."
        ),
        check=non_negative,
    )
    session_ready_burst: int = setting(
        8,
        (
            "Session-ready sandboxes all uids together may keep beyond `session_ready` each, for "
            "conversations that come faster: a uid's pool grows to its new conversations of the "
            "last 10 s, within this (the memory they hold; 0: no growth)."
        ),
        check=non_negative,
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, slots=True)
class WorkspaceSettings:
    """Conversations' files: quotas, retention, and each tenant's library."""

    quota_bytes: int = setting(1 << 30, "The files of one conversation.", check=positive, unit=BYTES)
    quota_files: int = setting(10_000, "Files of one conversation.", check=positive)
    max_checkpoints: int = setting(
        8,
        (
            "Named checkpoints one conversation keeps (a run's `checkpoint`); past it, only an existing "
            "name can be saved again. Their bytes count in the conversation's `quota_bytes`."
        ),
        check=positive,
    )
    conversation_ttl: float = setting(
        30 * 86400.0, "An idle conversation's files are deleted after this.", check=duration, unit=DURATION
    )
    max_workspaces_bytes: int = setting(
        20 << 30, "All conversations together; the least recently used go first.", check=positive, unit=BYTES
    )
    tenant_workspaces_bytes: int | None = setting(
        None,
        "All conversations of one tenant, its least recently used first (unset: 5g with several tenants).",
        check=positive,
        unit=BYTES,
    )
    volume_bytes: int | None = setting(
        None,
        "As root: the size of a sparse XFS image with reflinks holding the workspaces, so a fork shares its "
        "source's blocks instead of copying them (see docs/design.md); needs xfsprogs.",
        check=positive,
        unit=BYTES,
    )
    library_bytes: int = setting(1 << 20, "A tenant's library (saved tools and memories).", unit=BYTES)
    library_entries: int = setting(1000, "Entries of a tenant's library.")
    retention_interval: float = setting(
        300.0, "Time between retention sweeps (one also runs at start).", check=duration, unit=DURATION
    )
    history_ttl: float = setting(
        30 * 86400.0, "Runs older than this leave the run history.", check=duration, unit=DURATION
    )
    history_max_runs: int = setting(
        10_000, "Runs of one tenant the run history keeps (its oldest leave first).", check=positive
    )

    def __post_init__(self) -> None:
        check_fields(self)
