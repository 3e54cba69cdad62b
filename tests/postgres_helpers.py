"""A throw-away PostgreSQL cluster for the tests (Debian's `postgresql`; test set-up, not product).

:func:`postgres_cluster` runs ``initdb`` as the ``postgres`` user into a directory under
``/tmp/mcp-sandbox-test-pg-*``, starts ``postgres`` on a free loopback port with its socket in
that directory (TCP connections need the password, so the tests' URLs carry one), and stops it
by its pid when the block ends. The server is started with a parent-death signal, so a pytest
killed with ``kill -9`` takes it along; the directory such a run leaves is removed by the next.
psycopg is imported on use: tests/conftest.py imports this module in environments without it
(the VM job's).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["INSTALL_HINT", "Cluster", "postgres_bin_dir", "postgres_cluster", "require_postgres"]

INSTALL_HINT = "PostgreSQL is not installed: run `make postgres` (Debian's postgresql package)"
_PREFIX = "mcp-sandbox-test-pg-"
_PR_SET_PDEATHSIG = 1
_START_SECONDS = 60


def postgres_bin_dir() -> Path | None:
    """Debian's newest PostgreSQL binaries (``/usr/lib/postgresql/<major>/bin``), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def require_postgres() -> Path:
    """The binaries; where they (or psycopg) are missing, fail under ``make test``
    (``MCP_SANDBOX_TEST_REQUIRE`` names postgres), else skip, either way saying how to install them."""
    bin_dir = postgres_bin_dir()
    reason = None
    if bin_dir is None:
        reason = INSTALL_HINT
    elif importlib.util.find_spec("psycopg") is None:
        reason = "psycopg is not installed: run `make venv` (it installs the `postgres` extra)"
    elif os.geteuid() != 0:
        reason = "the PostgreSQL tests run initdb as the postgres user: run them as root"
    if reason is not None:
        if "postgres" in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    assert bin_dir is not None
    return bin_dir


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _sweep_stale() -> None:
    """Remove the clusters of test runs that were killed (their pytest's pid is gone)."""
    for directory in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = int((directory / "owner.pid").read_text())
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):
            continue


def _as_postgres(user: pwd.struct_passwd) -> None:
    """In the child: become the postgres user, then die with the test process (the signal is
    cleared by a change of uid, so it is set after)."""
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Cluster:
    """One running cluster: its binaries, directory, port and the superuser's password."""

    bin_dir: Path
    root: Path
    port: int
    password: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def start(self) -> None:
        import psycopg

        user = pwd.getpwnam("postgres")
        log = open(self.root / "postgres.log", "ab")
        with log:
            self.process = subprocess.Popen(
                [
                    *(str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port)),
                    *("-k", str(self.root), "-h", "127.0.0.1", "-c", "fsync=off"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=lambda: _as_postgres(user),
            )
        deadline = time.monotonic() + _START_SECONDS
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"postgres did not start: {(self.root / 'postgres.log').read_text(errors='replace')[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), bounded; then SIGKILL."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def postgres_cluster() -> Iterator[Cluster]:
    """A fresh cluster for the block (see the module's docstring)."""
    bin_dir = require_postgres()
    _sweep_stale()
    root = Path(tempfile.mkdtemp(prefix=_PREFIX))
    (root / "owner.pid").write_text(str(os.getpid()))
    user = pwd.getpwnam("postgres")
    os.chown(root, user.pw_uid, user.pw_gid)
    password = secrets.token_urlsafe(16)
    (root / "pwfile").write_text(password)
    os.chown(root / "pwfile", user.pw_uid, user.pw_gid)
    cluster = Cluster(bin_dir, root, _free_port(), password)
    try:
        subprocess.run(
            [
                *(str(bin_dir / "initdb"), "-D", str(cluster.data), "-U", "postgres", "--pwfile", str(root / "pwfile")),
                *("--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"),
            ],
            preexec_fn=lambda: _as_postgres(user),
            capture_output=True,
            check=True,
            timeout=120,
        )
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class MetadataTarget:
    """Where a test's metadata index lives: the SQLite file at ``path``, or PostgreSQL at ``url``."""

    engine: str  # "sqlite" or "postgresql"
    path: Path
    url: str | None = None

    def query(self, sql: str) -> list[tuple[object, ...]]:
        """Rows of ``sql`` read beside the server's own connection (no ``?`` parameters)."""
        if self.url is None:
            import sqlite3

            with contextlib.closing(sqlite3.connect(self.path)) as db:
                return [tuple(row) for row in db.execute(sql).fetchall()]
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            return db.execute(sql).fetchall()

    def execute(self, sql: str) -> None:
        """Run one statement beside the server's own connection, committed."""
        if self.url is None:
            import sqlite3

            with contextlib.closing(sqlite3.connect(self.path, isolation_level=None)) as db:
                db.execute(sql)
            return
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute(sql)

    def tables(self) -> dict[str, list[str]]:
        """Each table of the index, with its columns."""
        if self.url is None:
            names = [str(row[0]) for row in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {name: [str(row[1]) for row in self.query(f"PRAGMA table_info({name})")] for name in names}
        rows = self.query(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'"
        )
        tables: dict[str, list[str]] = {}
        for table, column in rows:
            tables.setdefault(str(table), []).append(str(column))
        return tables
