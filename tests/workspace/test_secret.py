"""The server secret is made once, privately, kept across starts, and refused when exposed."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from mcp_sandbox.errors import ConfigError
from mcp_sandbox.workspace import derive_key, load_secret


def test_the_first_start_creates_a_private_32_byte_secret(tmp_path: Path) -> None:
    secret = load_secret(tmp_path / "state")

    info = os.lstat(tmp_path / "state" / "secret")
    assert len(secret) == 32
    assert stat.S_ISREG(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.geteuid()
    assert os.listdir(tmp_path / "state") == ["secret"]  # no temporary file left


def test_later_starts_reuse_the_same_secret(tmp_path: Path) -> None:
    assert load_secret(tmp_path) == load_secret(tmp_path)


def test_servers_starting_together_agree_on_one_secret(tmp_path: Path) -> None:
    results: list[bytes] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait(timeout=10)
        results.append(load_secret(tmp_path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(results) == 8
    assert len(set(results)) == 1
    assert os.listdir(tmp_path) == ["secret"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_a_secret_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    load_secret(tmp_path)
    (tmp_path / "secret").chmod(mode)

    with pytest.raises(ConfigError):
        load_secret(tmp_path)


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_a_secret_of_the_wrong_size_is_refused(tmp_path: Path, size: int) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"k" * size)
    path.chmod(0o600)

    with pytest.raises(ConfigError):
        load_secret(tmp_path)


def test_a_secret_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.write_bytes(b"k" * 32)
    real.chmod(0o600)
    (tmp_path / "secret").symlink_to(real)

    with pytest.raises(ConfigError):
        load_secret(tmp_path)


def test_keys_for_different_purposes_differ_and_depend_on_the_secret() -> None:
    one, other = b"a" * 32, b"b" * 32

    assert derive_key(one, "workspace") != derive_key(one, "url")
    assert derive_key(one, "workspace") != derive_key(other, "workspace")
    assert derive_key(one, "url") == derive_key(one, "url")
    assert len(derive_key(one, "url")) == 32
