"""The seal of a parked state (``engine/park_seal.py``): every byte, the trailer's own fields, the
conversation and the tenant are vouched for; a state sealed the earlier way still checks.

In process on files in ``tmp_path``: the seal is pure bytes; so is the check run beside a resume's
claim of its sandbox (``SealCheck``). That a refused state never reaches a sandbox is attacked
through the tools in ``tests/e2e/conversations/test_park.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.engine.park_seal import TRAILER, Sealer
from mcp_sandbox.engine.parking import TAMPERED, ParkedStates, SealCheck
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.state import StateLayout

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


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.anyio
async def test_a_seal_check_beside_the_claim_hands_over_a_sound_state_refuses_a_tampered_one_closing_all(
    tmp_path: Path,
) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(tmp_path / "state")})
    layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
    states = ParkedStates(layout, bytes(32))
    source = tmp_path / "snapshot"
    source.write_bytes(SNAPSHOT)
    snapshot = ForkState(os.open(source, os.O_RDONLY), len(SNAPSHOT))
    await states.save("sound", "alice", snapshot)
    await states.save("tampered", "alice", snapshot)
    snapshot.close()
    data = bytearray(layout.parked_state("tampered").read_bytes())
    data[7] ^= 0x01
    layout.parked_state("tampered").write_bytes(bytes(data))
    before = _fds()

    sound, tampered = SealCheck(states, "sound", "alice"), SealCheck(states, "tampered", "alice")
    async with anyio.create_task_group() as group:
        group.start_soon(sound.run)
        group.start_soon(tampered.run)
    refusals = (await sound.refused(), await tampered.refused())
    handed = sound.state
    read = b"" if handed is None else handed.read(0, 16)
    open_while_held = _fds() - before
    for check in (sound, tampered):
        await check.close()
    cancelled = SealCheck(states, "sound", "alice")
    with anyio.CancelScope() as scope:  # the caller gives up while the check runs: it still ends, closed
        async with anyio.create_task_group() as group:
            group.start_soon(cancelled.run)
            scope.cancel()
    await cancelled.close()

    assert refusals[0] is None and isinstance(refusals[1], WorkspaceError)
    assert TAMPERED in str(refusals[1]) and tampered.state is None
    assert handed is not None and handed.mapped and handed.size == len(SNAPSHOT) and read == SNAPSHOT[:16]
    assert not layout.parked_state("tampered").exists() and layout.parked_state("sound").exists()
    assert len(open_while_held) == 1 and _fds() == before
