"""Retention deletes idle conversations, then the least recently used over the total budget, never busy ones."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.replicas.leases import STOPPED, LeaseTable
from mcp_sandbox.workspace import ExecutionRecord, Metadata, WorkspaceStore, load_secret, sweep
from mcp_sandbox.workspace.executions import record_executions
from postgres_helpers import MetadataTarget
from settings_helpers import store_of

DAY = 86400.0
NOW = 1_000 * DAY


@pytest.fixture
def budget_settings(state_dir: Path) -> Settings:
    return load_settings(
        env={}, flags={"state_dir": str(state_dir), "conversation_ttl": "30d", "max_workspaces_bytes": 1000}
    )


@pytest.fixture
def store(budget_settings: Settings) -> WorkspaceStore:
    return store_of(budget_settings, load_secret(budget_settings.paths.state_dir))


@pytest.fixture
def metadata(metadata_target: MetadataTarget) -> Iterator[Metadata]:
    opened = Metadata.open(metadata_target.path, metadata_target.url)
    yield opened
    opened.close()


def _conversation(
    store: WorkspaceStore, metadata: Metadata, name: str, size: int, last_used: float, tenant: str = "alice"
) -> str:
    key = store.key(tenant, name)
    metadata.touch_conversation(key, tenant, last_used)
    store.write_file(key, "data.bin", b"x" * size)
    metadata.record_files(key, store.list_files(key).files, store.usage(key))
    return key


def test_conversations_idle_longer_than_the_ttl_are_deleted(
    store: WorkspaceStore, metadata: Metadata, budget_settings: Settings
) -> None:
    old = _conversation(store, metadata, "old", 10, NOW - 31 * DAY)
    recent = _conversation(store, metadata, "recent", 10, NOW - 29 * DAY)

    report = sweep(store, metadata, budget_settings.workspaces, NOW, busy=())

    assert (report.idle, report.evicted, report.failed) == ([old], [], [])
    assert report.freed_bytes == 10
    assert not store.directory(old).exists()
    assert store.directory(recent).exists()
    assert [row.key for row in metadata.conversations_by_last_use()] == [recent]


def test_over_the_total_budget_the_least_recently_used_go_first_until_it_fits(
    store: WorkspaceStore, metadata: Metadata, budget_settings: Settings
) -> None:
    oldest = _conversation(store, metadata, "oldest", 400, NOW - 3 * DAY)
    older = _conversation(store, metadata, "older", 400, NOW - 2 * DAY)
    newer = _conversation(store, metadata, "newer", 400, NOW - 1 * DAY)

    report = sweep(store, metadata, budget_settings.workspaces, NOW, busy=())

    assert (report.idle, report.evicted) == ([], [oldest])
    assert report.total_bytes == 800
    assert [row.key for row in metadata.conversations_by_last_use()] == [older, newer]


def test_busy_conversations_are_spared_however_idle_or_old(
    store: WorkspaceStore, metadata: Metadata, budget_settings: Settings
) -> None:
    idle_but_running = _conversation(store, metadata, "running", 10, NOW - 90 * DAY)
    lru_but_live = _conversation(store, metadata, "live", 600, NOW - 3 * DAY)
    newest = _conversation(store, metadata, "newest", 600, NOW - 1 * DAY)

    report = sweep(store, metadata, budget_settings.workspaces, NOW, busy={idle_but_running, lru_but_live})

    assert (report.idle, report.evicted) == ([], [newest])
    assert store.directory(idle_but_running).exists()
    assert store.directory(lru_but_live).exists()


def test_a_directory_without_a_row_is_dated_by_its_mtime_and_measured_on_disk(
    store: WorkspaceStore, metadata: Metadata, budget_settings: Settings
) -> None:
    orphan_old = store.key("alice", "crashed-long-ago")
    store.write_file(orphan_old, "a.bin", b"x" * 10)
    os.utime(store.directory(orphan_old), (NOW - 40 * DAY, NOW - 40 * DAY))
    orphan_big = store.key("alice", "crashed-yesterday")
    store.write_file(orphan_big, "a.bin", b"x" * 900)
    os.utime(store.directory(orphan_big), (NOW - 2 * DAY, NOW - 2 * DAY))
    recorded = _conversation(store, metadata, "recorded", 200, NOW - 1 * DAY)

    report = sweep(store, metadata, budget_settings.workspaces, NOW, busy=())

    assert (report.idle, report.evicted) == ([orphan_old], [orphan_big])
    assert report.freed_bytes == 910
    assert store.keys() == [recorded]


def test_a_row_without_a_directory_is_forgotten_when_idle(
    store: WorkspaceStore, metadata: Metadata, budget_settings: Settings
) -> None:
    key = store.key("alice", "never-wrote")
    metadata.touch_conversation(key, "alice", NOW - 31 * DAY)

    report = sweep(store, metadata, budget_settings.workspaces, NOW, busy=())

    assert report.idle == [key]
    assert metadata.conversations_by_last_use() == []


def test_a_deleted_conversations_mark_of_a_lost_interpreter_goes_with_it(
    store: WorkspaceStore, metadata: Metadata, budget_settings: Settings
) -> None:
    old = _conversation(store, metadata, "old", 10, NOW - 31 * DAY)
    recent = _conversation(store, metadata, "recent", 10, NOW - 29 * DAY)
    leases = LeaseTable(metadata.database, "http://a.replica:1")
    leases.release({}, lost=[old, recent])  # a replica stopped with both interpreters live

    sweep(store, metadata, budget_settings.workspaces, NOW, busy=())

    assert leases.take_lost(old) is None  # no row left to outlive the conversation
    assert leases.take_lost(recent) == STOPPED


def test_a_sweep_within_every_limit_deletes_nothing(
    store: WorkspaceStore, metadata: Metadata, budget_settings: Settings
) -> None:
    keys = [_conversation(store, metadata, str(index), 100, NOW - index * DAY) for index in range(3)]

    report = sweep(store, metadata, budget_settings.workspaces, NOW, busy=())

    assert (report.idle, report.evicted, report.freed_bytes, report.total_bytes) == ([], [], 0, 300)
    assert store.keys() == sorted(keys)


def test_a_tenant_over_its_own_budget_loses_its_own_oldest_never_another_tenants(
    state_dir: Path, metadata_target: MetadataTarget
) -> None:
    settings = load_settings(
        env={}, flags={"state_dir": str(state_dir), "tenant_workspaces_bytes": 1000, "max_workspaces_bytes": 10_000}
    )
    store = store_of(settings, load_secret(state_dir))
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        bobs = _conversation(store, metadata, "b", 500, NOW - 9 * DAY, tenant="bob")  # the oldest of all
        alices = [_conversation(store, metadata, str(i), 400, NOW - (5 - i) * DAY) for i in range(5)]

        report = sweep(store, metadata, settings.workspaces, NOW, busy={alices[0]})

        # 2,000 bytes of alice's against her 1,000: her oldest go (the busy one is spared), bob's stays.
        assert report.evicted == alices[1:4]
        assert store.directory(bobs).exists()
        assert store.directory(alices[0]).exists()
        assert store.directory(alices[4]).exists()
    finally:
        metadata.close()


def test_over_the_total_the_tenant_holding_the_most_gives_up_its_oldest(
    state_dir: Path, metadata_target: MetadataTarget
) -> None:
    settings = load_settings(
        env={}, flags={"state_dir": str(state_dir), "tenant_workspaces_bytes": 5000, "max_workspaces_bytes": 1500}
    )
    store = store_of(settings, load_secret(state_dir))
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        bobs = _conversation(store, metadata, "b", 300, NOW - 9 * DAY, tenant="bob")  # the oldest of all
        alices = [_conversation(store, metadata, str(i), 400, NOW - (5 - i) * DAY) for i in range(4)]

        report = sweep(store, metadata, settings.workspaces, NOW, busy=())

        assert report.evicted == alices[:1]
        assert report.total_bytes == 1500
        assert store.directory(bobs).exists()
    finally:
        metadata.close()


def _runs(metadata: Metadata, tenant: str, started: list[float]) -> None:
    record_executions(
        metadata.database,
        (ExecutionRecord(tenant, None, "python", at, 10, "success", 0, 1, 0, id=f"{tenant}-{at}") for at in started),
    )


def _kept(target: MetadataTarget) -> dict[str, list[float]]:
    rows = target.query("SELECT tenant, started_at FROM executions ORDER BY tenant, started_at")
    kept: dict[str, list[float]] = {}
    for tenant, started in rows:
        kept.setdefault(str(tenant), []).append(float(str(started)))
    return kept


def test_the_history_loses_runs_older_than_its_ttl_and_each_tenants_oldest_past_its_count(
    state_dir: Path, metadata_target: MetadataTarget
) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(state_dir), "history_ttl": "10d", "history_max_runs": 3})
    store = store_of(settings, load_secret(state_dir))
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        _runs(metadata, "alice", [NOW - day * DAY for day in (12, 11, 5, 4, 3, 2, 1)])
        _runs(metadata, "bob", [NOW - 20 * DAY, NOW - 2 * DAY, NOW - DAY])

        report = sweep(store, metadata, settings.workspaces, NOW, busy=())

        # alice: two past the ttl, then her two oldest past 3; bob: one past the ttl, his other two kept.
        assert report.history_pruned == 5
        assert _kept(metadata_target) == {
            "alice": [NOW - 3 * DAY, NOW - 2 * DAY, NOW - DAY],
            "bob": [NOW - 2 * DAY, NOW - DAY],
        }
        assert sweep(store, metadata, settings.workspaces, NOW, busy=()).history_pruned == 0
    finally:
        metadata.close()


def test_a_tenant_with_many_runs_never_prunes_another_tenants_history(
    state_dir: Path, metadata_target: MetadataTarget
) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(state_dir), "history_max_runs": 2})
    store = store_of(settings, load_secret(state_dir))
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        _runs(metadata, "bob", [NOW - 3 * DAY, NOW - 2 * DAY])  # older than all of alice's
        _runs(metadata, "alice", [NOW - 60 * i for i in range(50)])

        sweep(store, metadata, settings.workspaces, NOW, busy=())

        assert _kept(metadata_target) == {"alice": [NOW - 60, NOW], "bob": [NOW - 3 * DAY, NOW - 2 * DAY]}
    finally:
        metadata.close()
