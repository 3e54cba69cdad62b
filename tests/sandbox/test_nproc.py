"""RLIMIT_NPROC where no pids cgroup is writable: a sandbox's room is above what its uid runs already."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from mcp_sandbox.sandbox import nproc

# A host uid nothing else on this machine runs as (above useradd's and the tenants' ranges).
_UID = 2_000_123_457
_THREADS = 150


@pytest.fixture
def busy_program() -> Iterator[int]:
    """A process of uid ``_UID`` holding ``_THREADS`` threads (as a browser or an IDE of that user
    would), until the test ends; its pid."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a process as another uid")
    ready_read, ready_write = os.pipe()
    stop_read, stop_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready_read)
            os.close(stop_write)
            os.setresuid(_UID, _UID, _UID)
            hold = threading.Event()
            for _ in range(_THREADS):
                threading.Thread(target=hold.wait, daemon=True).start()
            os.write(ready_write, b"x")
            os.read(stop_read, 1)
        finally:
            os._exit(0)
    os.close(ready_write)
    os.close(stop_read)
    try:
        assert os.read(ready_read, 1) == b"x"
        yield pid
    finally:
        os.close(stop_write)
        os.waitpid(pid, 0)
        os.close(ready_read)


def test_every_thread_of_the_uid_is_counted_as_the_kernel_counts_them(busy_program: int) -> None:
    assert nproc.tasks_of(_UID) == _THREADS + 1  # its threads and its main thread


def test_a_sandboxs_process_limit_is_its_pids_above_what_the_uid_runs(busy_program: int) -> None:
    assert nproc.nproc_limit(_UID, 128) == _THREADS + 1 + 128


def test_a_uid_that_runs_nothing_gets_its_pids_alone() -> None:
    assert nproc.tasks_of(_UID + 1) == 0
    assert nproc.nproc_limit(_UID + 1, 128) == 128
