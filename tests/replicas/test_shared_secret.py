"""The server secret of servers sharing a metadata database: stored once, adopted by every other server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.replicas.shared_secret import load_shared_secret
from mcp_sandbox.workspace import Metadata
from postgres_helpers import MetadataTarget


@pytest.fixture
def metadata(metadata_target: MetadataTarget) -> Iterator[Metadata]:
    opened = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        yield opened
    finally:
        opened.close()


def test_the_first_server_stores_its_secret_and_the_others_adopt_it(metadata: Metadata, tmp_path: Path) -> None:
    first, second, fresh = tmp_path / "first", tmp_path / "second", tmp_path / "fresh"
    first.mkdir(mode=0o700)
    second.mkdir(mode=0o700)
    (first / "secret").write_bytes(b"1" * 32)
    (first / "secret").chmod(0o600)
    (second / "secret").write_bytes(b"2" * 32)
    (second / "secret").chmod(0o600)

    kept = load_shared_secret(metadata.database, first)  # a single server's secret carries over
    adopted = load_shared_secret(metadata.database, second)
    made = load_shared_secret(metadata.database, fresh)

    assert kept == adopted == made == b"1" * 32
    assert (second / "secret").read_bytes() == b"1" * 32
    assert (second / "secret.previous").read_bytes() == b"2" * 32
    assert not (fresh / "secret.previous").exists()
    assert (second / "secret").stat().st_mode & 0o777 == 0o600
