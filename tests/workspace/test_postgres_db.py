"""The metadata index on PostgreSQL (``database_url``) as on SQLite: quotas no race passes, a database
restarted between calls, one that is down, and URLs that are wrong; never a password shown."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.errors import ConfigError, UnavailableError, WorkspaceError
from mcp_sandbox.workspace import FileEntry, Metadata
from mcp_sandbox.workspace.metadata import MIGRATIONS
from mcp_test_helpers import mcp_sandbox_cli
from postgres_helpers import Cluster, MetadataTarget, postgres_cluster

KEY = "a" * 64
ROUNDS = 25
QUOTA = 100


def _open(target: MetadataTarget) -> Metadata:
    return Metadata.open(target.path, target.url)


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A cluster of this test's own, to restart or stop without disturbing the others."""
    with postgres_cluster() as cluster:
        yield cluster


def _race(writers: list[Metadata], key: str, sizes: list[int]) -> list[bool]:
    """Each writer records one file of ``sizes`` at once (a barrier lines them up); who won."""
    won = [False] * len(writers)
    failures: list[BaseException] = []
    start = threading.Barrier(len(writers))

    def write(index: int) -> None:
        try:
            start.wait(timeout=30)
            won[index] = writers[index].record_file_within_quota(
                key, FileEntry(f"file-{index}.bin", sizes[index], 1.0), QUOTA, 10
            )
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(index,)) for index in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    return won


def test_two_writers_that_together_pass_the_quota_cannot_both_be_recorded(metadata_target: MetadataTarget) -> None:
    # Two servers sharing the database: each its own connection (on SQLite, to the same file).
    writers = [_open(metadata_target), _open(metadata_target)]
    try:
        for round_ in range(ROUNDS):
            key = f"{round_:064x}"
            writers[0].touch_conversation(key, "alice", 1.0)

            won = _race(writers, key, [60, 60])  # each fits alone; together 120 > 100

            assert sorted(won) == [False, True], (round_, won)
            (row,) = [row for row in writers[1].conversations_by_last_use() if row.key == key]
            assert (row.bytes, row.files) == (60, 1)
    finally:
        for writer in writers:
            writer.close()


def test_a_file_recorded_within_the_quota_replaces_its_own_size_and_counts_once(
    metadata_target: MetadataTarget,
) -> None:
    metadata = _open(metadata_target)
    try:
        metadata.touch_conversation(KEY, "alice", 1.0)
        assert metadata.record_file_within_quota(KEY, FileEntry("a.bin", 80, 1.0), QUOTA, 10)
        # Replacing a.bin with 90 bytes fits (80 are given back); a second file of 20 does not.
        assert metadata.record_file_within_quota(KEY, FileEntry("a.bin", 90, 2.0), QUOTA, 10)
        assert not metadata.record_file_within_quota(KEY, FileEntry("b.bin", 20, 3.0), QUOTA, 10)
        # The file count is a quota too.
        assert not metadata.record_file_within_quota(KEY, FileEntry("c.bin", 1, 3.0), QUOTA, 1)

        (row,) = metadata.conversations_by_last_use()
        assert (row.bytes, row.files) == (90, 1)
        assert metadata_target.query("SELECT name, size FROM files") == [("a.bin", 90)]
        with pytest.raises(WorkspaceError):
            metadata.record_file_within_quota("f" * 64, FileEntry("a.bin", 1, 1.0), QUOTA, 10)
    finally:
        metadata.close()


def test_a_database_restarted_between_two_calls_is_reconnected(own_cluster: Cluster, tmp_path: Path) -> None:
    metadata = Metadata.open(tmp_path / "unused.sqlite3", own_cluster.create_database())
    try:
        metadata.touch_conversation(KEY, "alice", 1.0)

        own_cluster.restart()  # every connection the server had is gone

        metadata.touch_conversation(KEY, "alice", 2.0)
        assert [(row.key, row.last_used) for row in metadata.conversations_by_last_use()] == [(KEY, 2.0)]
    finally:
        metadata.close()
    assert not (tmp_path / "unused.sqlite3").exists()


def test_a_database_that_is_down_fails_the_call_naming_it_in_the_log_and_serves_once_back(
    own_cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = own_cluster.create_database()
    database = url.rsplit("/", 1)[1]
    metadata = Metadata.open(tmp_path / "unused.sqlite3", url)
    try:
        metadata.touch_conversation(KEY, "alice", 1.0)
        own_cluster.stop()

        with caplog.at_level(logging.ERROR), pytest.raises(UnavailableError) as caught:
            metadata.touch_conversation(KEY, "alice", 2.0)

        # Tenants read the error: it says what (an outage: retry), not where. The operator's log says where.
        assert caught.value.service == "the metadata database"
        assert "127.0.0.1" not in str(caught.value)
        logged = "\n".join(record.getMessage() for record in caplog.records)
        assert f"postgres@127.0.0.1:{own_cluster.port}/{database}" in logged, logged
        assert own_cluster.password not in logged + str(caught.value)

        own_cluster.start()
        metadata.touch_conversation(KEY, "alice", 3.0)
        assert [row.last_used for row in metadata.conversations_by_last_use()] == [3.0]
    finally:
        metadata.close()


def test_an_unreachable_server_is_a_start_up_error_naming_the_database_not_its_password(
    postgres: Cluster, tmp_path: Path
) -> None:
    closed = postgres.url("nowhere").replace(f":{postgres.port}/", ":1/")

    with pytest.raises(ConfigError) as caught:
        Metadata.open(tmp_path / "unused.sqlite3", closed)

    assert "postgres@127.0.0.1:1/nowhere" in str(caught.value)
    assert postgres.password not in str(caught.value)


def test_a_wrong_password_is_refused_at_start_without_showing_either(postgres: Cluster, tmp_path: Path) -> None:
    wrong = postgres.url().replace(postgres.password, "Not-The-Password-42")

    with pytest.raises(ConfigError, match="password authentication failed") as caught:
        Metadata.open(tmp_path / "unused.sqlite3", wrong)

    assert "Not-The-Password-42" not in str(caught.value)
    assert postgres.password not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("mysql://root:S3cret-Pass@db.example/app", id="another-engine"),
        pytest.param("postgressql://root:S3cret-Pass@db.example/app", id="a-typo"),
        pytest.param("root:S3cret-Pass@db.example/app", id="no-scheme"),
        pytest.param("root:S3cret-Pass://db.example/app", id="a-password-before-the-scheme-mark"),
        pytest.param("postgresql://root:S3cret-Pass@db.example:port/app", id="a-bad-port"),
    ],
)
def test_a_database_url_of_another_kind_is_refused_naming_the_setting_and_the_schemes(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"MCP_SANDBOX_DATABASE_URL": url})

    message = str(caught.value)
    assert message.startswith("database_url: ")
    assert "S3cret-Pass" not in message
    if "port" not in url:
        assert "postgresql://" in message


def test_the_settings_never_show_the_database_password() -> None:
    settings = load_settings(env={"MCP_SANDBOX_DATABASE_URL": "postgresql://app:S3cret-Pass@db.example/app"})

    assert settings.replicas.database_url == "postgresql://app:S3cret-Pass@db.example/app"
    assert "S3cret-Pass" not in repr(settings)


def test_both_engines_have_the_same_number_of_schema_versions() -> None:
    from mcp_sandbox.workspace.schema import POSTGRES_MIGRATIONS

    assert len(POSTGRES_MIGRATIONS) == len(MIGRATIONS)


def test_servers_starting_together_migrate_the_database_once(postgres: Cluster, tmp_path: Path) -> None:
    url = postgres.create_database()
    opened: list[Metadata] = []
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        try:
            start.wait(timeout=30)
            opened.append(Metadata.open(tmp_path / "unused.sqlite3", url))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert failures == []
        assert [metadata.version for metadata in opened] == [len(MIGRATIONS)] * 4
    finally:
        for metadata in opened:
            metadata.close()


@pytest.mark.e2e
def test_doctor_reports_the_postgresql_index_without_its_password(
    postgres: Cluster, state_dir: Path, packaged_runtime: Path
) -> None:
    url = postgres.create_database()
    Metadata.open(state_dir / "unused.sqlite3", url).close()

    done = mcp_sandbox_cli(
        "doctor", state_dir=state_dir, runtime=packaged_runtime, env={"MCP_SANDBOX_DATABASE_URL": url}
    )

    database = url.rsplit("/", 1)[1]
    expected = f"metadata index: PostgreSQL postgres@127.0.0.1:{postgres.port}/{database}, reachable, schema version"
    assert expected in done.stdout, done.stdout
    assert postgres.password not in done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr

    closed = postgres.url("nowhere").replace(f":{postgres.port}/", ":1/")
    down = mcp_sandbox_cli(
        "doctor", state_dir=state_dir, runtime=packaged_runtime, env={"MCP_SANDBOX_DATABASE_URL": closed}
    )

    assert "metadata index: PostgreSQL postgres@127.0.0.1:1/nowhere\n  FAILED: cannot be reached" in down.stdout
    assert postgres.password not in down.stdout + down.stderr
    assert down.returncode == 1, down.stdout + down.stderr


@pytest.mark.e2e
def test_doctor_reports_the_sqlite_index_and_its_schema_version(state_dir: Path, packaged_runtime: Path) -> None:
    path = state_dir / "metadata.sqlite3"
    Metadata.open(path).close()

    done = mcp_sandbox_cli("doctor", state_dir=state_dir, runtime=packaged_runtime)

    assert f"metadata index: SQLite {path}, schema version {len(MIGRATIONS)} of {len(MIGRATIONS)}\n" in done.stdout
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.e2e
def test_serve_refuses_to_start_when_the_database_is_unreachable(
    postgres: Cluster, state_dir: Path, packaged_runtime: Path
) -> None:
    closed = postgres.url("nowhere").replace(f":{postgres.port}/", ":1/")

    done = mcp_sandbox_cli(
        "serve", state_dir=state_dir, runtime=packaged_runtime, env={"MCP_SANDBOX_DATABASE_URL": closed}
    )

    assert done.returncode != 0 and done.stdout == ""
    assert "postgres@127.0.0.1:1/nowhere" in done.stderr, done.stderr
    assert postgres.password not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_conversation_has_a_row_from_its_first_touch_until_it_is_forgotten(metadata_target: MetadataTarget) -> None:
    # What a fork checks before it makes a conversation: the id must not exist yet.
    metadata = _open(metadata_target)
    try:
        before = metadata.has_conversation(KEY)
        metadata.touch_conversation(KEY, "alice", 1.0)
        touched = metadata.has_conversation(KEY)
        metadata.forget_conversation(KEY)
        forgotten = metadata.has_conversation(KEY)
    finally:
        metadata.close()

    assert (before, touched, forgotten) == (False, True, False)
