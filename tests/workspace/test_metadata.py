"""The metadata index on each engine (SQLite, PostgreSQL): migrated in order, free of code, environment
and tokens; and SQLite's file: private, crash-safe."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.errors import ConfigError, WorkspaceError
from mcp_sandbox.workspace import METADATA_FILE, ExecutionRecord, FileEntry, Metadata, Usage, WorkspaceStore
from mcp_sandbox.workspace.executions import record_execution, record_executions
from mcp_sandbox.workspace.metadata import MIGRATIONS
from postgres_helpers import MetadataTarget


@pytest.fixture
def metadata(metadata_target: MetadataTarget) -> Iterator[Metadata]:
    opened = Metadata.open(metadata_target.path, metadata_target.url)
    yield opened
    opened.close()


def _record(number: int, tenant: str = "alice", conversation: str | None = None) -> ExecutionRecord:
    return ExecutionRecord(
        id=f"run-{number}",
        tenant=tenant,
        conversation=conversation,
        language="python",
        started_at=1000.0 + number,
        duration_ms=12,
        status="success",
        exit_code=0,
        stdout_bytes=5,
        stderr_bytes=0,
    )


def test_the_database_and_its_wal_are_private_and_in_wal_mode(tmp_path: Path) -> None:
    metadata = Metadata.open(tmp_path / METADATA_FILE)
    metadata.touch_conversation("k" * 64, "alice", 1.0)

    for name in (METADATA_FILE, f"{METADATA_FILE}-wal", f"{METADATA_FILE}-shm"):
        assert stat.S_IMODE(os.lstat(tmp_path / name).st_mode) == 0o600, name
    with sqlite3.connect(tmp_path / METADATA_FILE) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    other.close()
    metadata.close()


def test_opening_twice_applies_the_migrations_once(metadata_target: MetadataTarget) -> None:
    first = Metadata.open(metadata_target.path, metadata_target.url)
    first.touch_conversation("k" * 64, "alice", 1.0)
    first.close()

    second = Metadata.open(metadata_target.path, metadata_target.url)

    assert second.version == len(MIGRATIONS)
    assert [row.key for row in second.conversations_by_last_use()] == ["k" * 64]
    second.close()


def _schema_version(target: MetadataTarget) -> int:
    if target.url is None:
        return int(str(target.query("PRAGMA user_version")[0][0]))
    return int(str(target.query("SELECT version FROM mcp_sandbox_schema")[0][0]))


def test_a_database_from_a_newer_version_is_refused_untouched(metadata_target: MetadataTarget) -> None:
    Metadata.open(metadata_target.path, metadata_target.url).close()
    newer = len(MIGRATIONS) + 1
    if metadata_target.url is None:
        metadata_target.execute(f"PRAGMA user_version = {newer}")
    else:
        metadata_target.execute(f"UPDATE mcp_sandbox_schema SET version = {newer}")

    with pytest.raises(ConfigError, match="newer than this mcp-sandbox knows"):
        Metadata.open(metadata_target.path, metadata_target.url)

    assert _schema_version(metadata_target) == newer


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / METADATA_FILE).write_bytes(b"this is not SQLite" * 100)

    with pytest.raises(ConfigError):
        Metadata.open(tmp_path / METADATA_FILE)


def test_conversations_come_least_recently_used_first_and_touching_moves_them(metadata: Metadata) -> None:
    metadata.touch_conversation("a" * 64, "alice", 10.0)
    metadata.touch_conversation("b" * 64, "bob", 20.0)
    metadata.touch_conversation("c" * 64, "alice", 30.0)
    metadata.touch_conversation("a" * 64, "alice", 40.0)
    metadata.touch_conversation("b" * 64, "bob", 5.0)  # an older time never moves one back

    rows = metadata.conversations_by_last_use()

    assert [(row.key[0], row.tenant, row.created, row.last_used) for row in rows] == [
        ("b", "bob", 20.0, 20.0),
        ("c", "alice", 30.0, 30.0),
        ("a", "alice", 10.0, 40.0),
    ]


def test_a_tenants_conversations_come_most_recently_used_first_and_only_its_own(metadata: Metadata) -> None:
    metadata.touch_conversation("a" * 64, "alice", 10.0)
    metadata.touch_conversation("b" * 64, "bob", 20.0)
    metadata.touch_conversation("c" * 64, "alice", 30.0)
    metadata.touch_conversation("a" * 64, "alice", 40.0)

    assert [(row.key[0], row.last_used) for row in metadata.conversations_of("alice")] == [("a", 40.0), ("c", 30.0)]
    assert [row.key[0] for row in metadata.conversations_of("bob")] == ["b"]
    assert metadata.conversations_of("carol") == []


def test_the_bytes_a_tenants_conversations_and_everyones_hold_are_summed_by_the_database(metadata: Metadata) -> None:
    empty = metadata.bytes_held("alice")
    for key, tenant, size in (("a", "alice", 5), ("b", "bob", 7), ("c", "alice", 11)):
        metadata.touch_conversation(key * 64, tenant, 1.0)
        metadata.record_files(key * 64, [FileEntry("f", size, 1.0)])

    assert empty == (0, 0)
    assert metadata.bytes_held("alice") == (16, 23)
    assert metadata.bytes_held("bob") == (7, 23)
    assert metadata.bytes_held("carol") == (0, 23)


def test_recorded_files_replace_the_previous_ones_and_set_the_usage(
    metadata: Metadata, metadata_target: MetadataTarget
) -> None:
    key = "a" * 64
    metadata.touch_conversation(key, "alice", 1.0)
    metadata.record_files(key, [FileEntry("old.txt", 3, 1.0)], Usage(bytes=3, files=1))

    metadata.record_files(key, [FileEntry("a.txt", 5, 2.0), FileEntry("b/c.txt", 7, 3.0)], Usage(bytes=12, files=2))

    (row,) = metadata.conversations_by_last_use()
    assert (row.bytes, row.files) == (12, 2)
    assert metadata_target.query("SELECT name, size FROM files ORDER BY name") == [("a.txt", 5), ("b/c.txt", 7)]


def test_recording_files_of_an_unknown_conversation_is_refused(metadata: Metadata) -> None:
    with pytest.raises(WorkspaceError):
        metadata.record_files("f" * 64, [FileEntry("a", 1, 1.0)], Usage(bytes=1, files=1))


def test_forgetting_a_conversation_drops_its_files_and_keeps_its_executions(
    metadata: Metadata, metadata_target: MetadataTarget
) -> None:
    key = "a" * 64
    metadata.touch_conversation(key, "alice", 1.0)
    metadata.record_files(key, [FileEntry("a.txt", 5, 2.0)], Usage(bytes=5, files=1))
    record_execution(metadata.database, _record(1, conversation=key))

    metadata.forget_conversation(key)

    assert metadata.conversations_by_last_use() == []
    assert metadata_target.query("SELECT count(*) FROM files") == [(0,)]
    assert metadata_target.query("SELECT id, conversation FROM executions") == [("run-1", key)]


def test_a_duplicate_execution_id_is_refused(metadata: Metadata) -> None:
    record_execution(metadata.database, _record(1))

    with pytest.raises(WorkspaceError):
        record_execution(metadata.database, _record(1))


def test_executions_recorded_together_are_all_kept_or_none(metadata: Metadata, metadata_target: MetadataTarget) -> None:
    record_executions(metadata.database, [_record(1), _record(2, tenant="bob"), _record(3)])
    with pytest.raises(WorkspaceError):
        record_executions(metadata.database, [_record(4), _record(2)])  # run-2 is there: run-4 is not kept either

    rows = metadata_target.query("SELECT id, tenant FROM executions ORDER BY id")
    tenants = metadata_target.query("SELECT name FROM tenants ORDER BY name")
    assert rows == [("run-1", "alice"), ("run-2", "bob"), ("run-3", "alice")]
    assert tenants == [("alice",), ("bob",)]


def test_threads_can_share_one_metadata_object(metadata: Metadata) -> None:
    failures: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for number in range(offset, offset + 50):
                record_execution(metadata.database, _record(number))
                metadata.touch_conversation(f"{number:064x}", "alice", float(number))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(offset,)) for offset in range(0, 400, 50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert failures == []
    assert len(metadata.conversations_by_last_use()) == 400


_SECRETS = ("sk-live-TOPSECRET-0123", "hunter2-PASSWORD", "print('CODE-MARKER')", "chat-ID-RAW-77")


def test_no_table_holds_code_environment_tokens_or_raw_conversation_ids(
    store: WorkspaceStore, metadata_target: MetadataTarget
) -> None:
    """A run's inputs with secret-looking values go through the whole recording path; none lands in the file."""
    token, password, code, conversation_id = _SECRETS
    key = store.key("alice", conversation_id)
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    metadata.touch_conversation(key, "alice", 100.0)
    store.write_file(key, "notes.txt", f"{code}\nAPI_TOKEN={token}\nPASSWORD={password}\n".encode())
    metadata.record_files(key, store.list_files(key).files, store.usage(key))
    # What a caller records for run_code(code, environment={"API_TOKEN": token, ...}) whose stdout echoed them.
    record_execution(
        metadata.database,
        ExecutionRecord(
            id="exec-1",
            tenant="alice",
            conversation=key,
            language="python",
            started_at=100.0,
            duration_ms=40,
            status="success",
            exit_code=0,
            stdout_bytes=len(token) + len(password),
            stderr_bytes=0,
            files_bytes=store.usage(key).bytes,
        ),
    )
    metadata.close()

    # SQLite: the bytes of the file and its WAL; both engines: every value of every table.
    raw = b"".join(path.read_bytes() for path in metadata_target.path.parent.glob(f"{METADATA_FILE}*"))
    columns = metadata_target.tables()
    values = [
        str(value) for table in columns for row in metadata_target.query(f"SELECT * FROM {table}") for value in row
    ]
    for secret in _SECRETS:
        assert secret.encode() not in raw
        assert not any(secret in value for value in values)
    # The one exception by design: with database_url, replicas share the server secret through
    # server_secret (replicas/shared_secret.py); recording runs never writes it.
    assert metadata_target.query("SELECT * FROM server_secret") == []
    assert not [
        (table, column)
        for table, names in columns.items()
        for column in names
        if any(word in column.lower() for word in ("code", "env", "token", "secret", "password", "argument", "text"))
        and column != "exit_code"
        and (table, column) != ("server_secret", "secret")
    ]


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from mcp_sandbox.workspace import ExecutionRecord, Metadata
    from mcp_sandbox.workspace.executions import record_execution

    metadata = Metadata.open(Path(sys.argv[1]) / "metadata.sqlite3")
    number = 0
    while True:
        record_execution(metadata.database, ExecutionRecord(
            id=f"run-{number}", tenant="alice", conversation=None, language="python",
            started_at=float(number), duration_ms=1, status="success", exit_code=0,
            stdout_bytes=0, stderr_bytes=0,
        ))
        print(number, flush=True)  # committed
        number += 1
    """
)


@pytest.mark.anyio
async def test_every_committed_row_survives_the_writer_being_killed(tmp_path: Path) -> None:
    last = -1
    with anyio.fail_after(60):
        process = await anyio.open_process(
            [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        async with process:
            assert process.stdout is not None
            buffered = b""
            async for chunk in process.stdout:
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                if lines:
                    last = int(lines[-1])
                if last >= 300:
                    process.send_signal(signal.SIGKILL)  # mid-stream: it is writing the next rows
                    break
            await process.wait()
        assert process.returncode == -signal.SIGKILL

    reopened = Metadata.open(tmp_path / METADATA_FILE)
    reopened.close()
    with sqlite3.connect(tmp_path / METADATA_FILE) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = {row[0] for row in db.execute("SELECT id FROM executions")}
    db.close()
    assert {f"run-{number}" for number in range(last + 1)} <= ids
