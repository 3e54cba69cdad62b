"""The seal of a parked state (``engine/park_seal.py``): every byte, the trailer's own fields, the
conversation and the tenant are vouched for; a state sealed the earlier way still checks.

In process on files in ``tmp_path``: the seal is pure bytes. That a refused state is never loaded
is attacked through the tools in ``tests/e2e/conversations/test_park.py`` and ``test_park_verdict.py``
(a resumed session's sandbox maps its state while the seal is checked, and loads it only if it held).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.engine.park_seal import TRAILER, Sealer

KEY = bytes(range(32))
SNAPSHOT = os.urandom(3 << 20) + b"the end"


def _sealed(path: Path, conversation: str = "conv", tenant: str = "alice") -> bytes:
    seal = Sealer(KEY).seal(conversation, tenant)
    seal.update(SNAPSHOT[:1000])
    seal.update(memoryview(SNAPSHOT)[1000:])
    data = SNAPSHOT + seal.trailer(len(SNAPSHOT))
    path.write_bytes(data)
    return data


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[tuple[Path, list[int]]]:
    fds: list[int] = []
    yield tmp_path / "state", fds
    for fd in fds:
        os.close(fd)


def _check(path: Path, fds: list[int], conversation: str = "conv", tenant: str = "alice") -> int | None:
    fds.append(os.open(path, os.O_RDONLY))
    return Sealer(KEY).check(fds[-1], conversation, tenant)


def test_a_sealed_state_checks_for_its_own_conversation_and_tenant_only(opened: tuple[Path, list[int]]) -> None:
    path, fds = opened
    _sealed(path)

    assert _check(path, fds) == len(SNAPSHOT)
    assert _check(path, fds, conversation="other") is None
    assert _check(path, fds, tenant="bob") is None


@pytest.mark.parametrize(
    "where",
    [0, len(SNAPSHOT) // 2, len(SNAPSHOT) - 1, len(SNAPSHOT) + 3, len(SNAPSHOT) + 20, len(SNAPSHOT) + 35, -1],
    ids=["first byte", "middle", "last byte", "mark", "nonce", "size", "tag"],
)
def test_one_flipped_bit_anywhere_fails_the_check(opened: tuple[Path, list[int]], where: int) -> None:
    path, fds = opened
    data = bytearray(_sealed(path))
    data[where] ^= 0x01
    path.write_bytes(bytes(data))

    assert _check(path, fds) is None


def test_a_state_cut_short_or_grown_fails_the_check(opened: tuple[Path, list[int]]) -> None:
    path, fds = opened
    data = _sealed(path)

    for altered in (data[:-1], data[1:], data[: TRAILER - 1], b"x" + data, data[:100] + data[-TRAILER:]):
        path.write_bytes(altered)
        assert _check(path, fds) is None


def test_two_parks_of_the_same_variables_use_different_tag_keys(opened: tuple[Path, list[int]]) -> None:
    path, _ = opened

    first, second = _sealed(path)[-TRAILER:], _sealed(path)[-TRAILER:]

    assert first[16:32] != second[16:32] and first[-16:] != second[-16:]


def test_a_state_sealed_with_the_earlier_hmac_still_checks_and_its_tampering_fails(
    opened: tuple[Path, list[int]],
) -> None:
    path, fds = opened
    framed = b"".join(len(v).to_bytes(8, "big") + v for v in (b"conv", b"alice"))
    tag = hmac.new(KEY, framed + SNAPSHOT, hashlib.sha256).digest()
    earlier = SNAPSHOT + b"mcp-sandbox-park" + len(SNAPSHOT).to_bytes(8, "big") + tag
    path.write_bytes(earlier)
    good = _check(path, fds)
    path.write_bytes(earlier[:10] + b"X" + earlier[11:])

    assert (good, _check(path, fds)) == (len(SNAPSHOT), None)


def test_the_size_a_seal_claims_is_read_before_the_check_and_only_where_it_fits_the_file(
    opened: tuple[Path, list[int]],
) -> None:
    # A resume sends the state at this size while the check runs (the runtime loads nothing until it held).
    path, fds = opened
    data = _sealed(path)
    sizes = []
    for altered in (data, data[:-16] + bytes(16), data[:-1], b"x" + data, data[:-TRAILER] + b"y" * TRAILER):
        path.write_bytes(altered)
        fds.append(os.open(path, os.O_RDONLY))
        sizes.append(Sealer(KEY).sealed_size(fds[-1]))

    assert sizes == [len(SNAPSHOT), len(SNAPSHOT), None, None, None]
