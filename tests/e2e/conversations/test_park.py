"""Parked sessions (issue 48) through the tools on real bwrap: park at idle and at a graceful stop,
resume with the same variables, what was not kept named, and a parked state altered on disk refused.

The service runs in this process (``memory_client``); a restart is a second service on the same
state directory. A park is seen where it lands: ``parked/`` of the state directory.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_sandbox.config import load_settings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import load_secret
from mcp_test_helpers import memory_client, poll, run_in, run_python, structured, text
from settings_helpers import store_of

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

_PARK_WAIT = 60.0  # a test's own bound on seeing a park land (the machine may be loaded)

_DEFINE = """
import math
import numpy as np
import pandas as pd
count, ratio, name = 42, 0.5, "parked"
items, table = [1, "two", [3.0]], {"a": {"b": (1, 2)}}
array = np.arange(12).reshape(3, 4)
frame = pd.DataFrame({"x": [1, 2, 3], "y": ["a", "b", "c"]})
big = np.arange(100_000, dtype="float64")  # its data travels out of band, read into place
wide = pd.DataFrame({"v": np.arange(100_000)})
def scaled(value, factor=3):
    return value * factor + count
class Shape:
    sides = 0
    def __init__(self, size):
        self.size = size
    def describe(self):
        return f"{type(self).__name__}:{self.sides}:{self.size}"
class Square(Shape):
    sides = 4
    def describe(self):
        return "square " + super().describe()
    @property
    def area(self):
        return self.size ** 2
square = Square(5)
pending = (n for n in range(3))
handle = open("notes.txt", "w")
"""

_CHECK = """
print(count, ratio, name, items, table, math.pi > 3)
print(array.sum(), array.shape, frame["x"].sum(), list(frame["y"]))
print(scaled(2), square.describe(), square.area, isinstance(square, Shape))
print("pending" in globals(), "handle" in globals())
big[0] = 1.0
print(big.sum(), big.flags.writeable, wide.v.sum())
"""

_CHECKED = (
    "42 0.5 parked [1, 'two', [3.0]] {'a': {'b': (1, 2)}} True\n"
    "66 (3, 4) 6 ['a', 'b', 'c']\n"
    "48 square Square:4:5 25 True\n"
    "False False\n"
    "4999950001.0 True 4999950000\n"
)


def _new() -> str:
    return f"park-{uuid.uuid4().hex}"


def _parked(state_dir: Path) -> list[Path]:
    parked = state_dir / "parked"
    return sorted(parked.glob("*.state")) if parked.is_dir() else []


def _state(state_dir: Path, conversation: str) -> Path:
    """Where the server parks the default tenant's ``conversation`` (its key, as the server's secret makes it)."""
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    key = store_of(settings, load_secret(state_dir)).key("default", conversation)
    return StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).parked_state(key)


@pytest.fixture
async def parking(state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    """A service that parks a session idle for a second."""
    async with memory_client(state_dir, sandbox_runtime, session_park_after=1.0) as client:
        yield client


async def test_an_idle_session_is_parked_and_resumed_with_its_variables_naming_what_was_not_kept(
    parking: Client, state_dir: Path
) -> None:
    conversation = _new()
    defined = await run_in(parking, _DEFINE, conversation)
    assert defined["status"] == "success", defined
    state = _state(state_dir, conversation)
    with anyio.fail_after(_PARK_WAIT):
        await poll(state.exists)
    parked = state.stat().st_ino

    result = await run_python(parking, {"code": _CHECK, "conversationId": conversation})
    resumed = structured(result)

    assert resumed["status"] == "success", resumed
    assert resumed["stdout"] == _CHECKED
    assert resumed["session"] == "resumed"
    not_kept = " ".join(resumed["notKept"])
    assert "pending" in not_kept and "handle" in not_kept
    assert "(session: resumed; not kept: pending" in text(result)
    assert not state.exists() or state.stat().st_ino != parked  # loaded, deleted (or parked anew since)


# A variable whose unpickling lists the descriptors the resumed sandbox holds at that moment.
_SPY = """
class Spy:
    def __reduce__(self):
        return (eval, ("[__import__('os').readlink('/proc/self/fd/' + fd) for fd in __import__('os').listdir("
                       "'/proc/self/fd') if __import__('os').path.lexists('/proc/self/fd/' + fd)]",))
spy = Spy()
"""


async def test_a_resumed_sandbox_holds_no_descriptor_of_the_state_when_any_of_its_code_runs(
    parking: Client, state_dir: Path
) -> None:
    conversation = _new()
    assert (await run_in(parking, _SPY + "payload = bytes(1 << 20)", conversation))["status"] == "success"
    state = _state(state_dir, conversation)
    with anyio.fail_after(_PARK_WAIT):
        await poll(state.exists)

    resumed = await run_in(parking, "print(type(spy).__name__, len(payload))\nprint(*spy, sep='\\n')", conversation)

    assert resumed["session"] == "resumed", resumed
    listed, *links = resumed["stdout"].splitlines()
    assert listed == "list 1048576"  # the spy ran while the state was loaded
    assert links and not [link for link in links if "parked" in link or state.name in link]


# In a resumed session whose 4 MiB array is mapped from its parked file: where the file is mapped,
# an attempt to open it again through /proc/self/map_files (read-only, then read-write), and a write.
_MAPPED_ATTACK = """
import os
ranges = [line.split()[0] for line in open('/proc/self/maps') if '/parked/' in line]
opened = []
for name in ranges:
    for mode in (os.O_RDONLY, os.O_RDWR):
        try:
            os.close(os.open('/proc/self/map_files/' + name, mode))
            opened.append((name, mode))
        except OSError:
            pass
big[0] = -1.0
print(len(ranges), opened, big[:2].tolist(), big.sum() == (1 << 19) * ((1 << 19) - 1) // 2 - 1)
"""


async def test_a_resumed_state_is_mapped_copy_on_write_held_in_the_quota_and_deleted_when_its_session_ends(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    conversation = _new()
    async with memory_client(state_dir, sandbox_runtime) as client:
        made = await run_in(client, "import numpy as np\nbig = np.arange(1 << 19, dtype='float64')", conversation)
        assert made["status"] == "success", made
    state = _state(state_dir, conversation)  # parked at the graceful stop
    held = state.with_suffix(".held")
    left = state.with_name("0" * 64 + ".held")  # what a session of a server killed -9 held
    left.write_bytes(b"stale")
    whole = state.read_bytes()

    async with memory_client(state_dir, sandbox_runtime) as client:
        swept = not left.exists()
        resumed = await run_in(client, _MAPPED_ATTACK, conversation)
        held_then, parked_then = held.exists(), state.exists()
        unchanged = held_then and held.read_bytes() == whole
        settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
        usage = store_of(settings, load_secret(state_dir)).usage(state.stem).bytes
        fresh = await run_in(client, "print('big' in globals())", conversation, reset=True)
        released = not held.exists()

    assert swept
    assert (resumed["session"], resumed["stdout"]) == ("resumed", "1 [] [-1.0, 1.0] True\n"), resumed
    assert held_then and not parked_then and unchanged  # the session's write never reached the file
    assert usage >= len(whole)  # counted in the conversation's quota while its session holds it
    assert (fresh["session"], fresh["stdout"]) == ("new", "False\n")
    assert released


async def test_a_graceful_stop_parks_every_session_and_the_restarted_server_resumes_it(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    conversation = _new()
    async with memory_client(state_dir, sandbox_runtime) as client:
        assert (await run_in(client, "total = sum(range(10))", conversation))["status"] == "success"
        assert _parked(state_dir) == []  # the default waits minutes before parking an idle session
    assert len(_parked(state_dir)) == 1

    async with memory_client(state_dir, sandbox_runtime) as client:
        resumed = await run_in(client, "print(total)", conversation)

    assert (resumed["status"], resumed["stdout"], resumed["session"]) == ("success", "45\n", "resumed")
    assert "notKept" not in resumed


async def test_twenty_conversations_past_the_session_cap_are_parked_and_each_resumes_its_own_variables(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    own = {_new(): index for index in range(20)}
    order = list(own)
    random.Random(48).shuffle(order)
    # Four live at most, parked only to make room (never at idle here): each new one parks another.
    async with memory_client(state_dir, sandbox_runtime, max_sessions=4, session_park_after=300.0) as client:
        for conversation, index in own.items():
            defined = await run_in(client, f"mine, name = {index}, {conversation!r}", conversation)
            assert defined["status"] == "success", defined
        parked = len(_parked(state_dir))
        resumed = [await run_in(client, "print(mine, name)", conversation) for conversation in order]

    assert parked == 16
    for conversation, result in zip(order, resumed, strict=True):
        assert result["stdout"] == f"{own[conversation]} {conversation}\n", result
        assert result["session"] in ("resumed", "kept")  # the last four may still have been live
    assert sum(result["session"] == "resumed" for result in resumed) >= 16


async def test_a_reset_deletes_the_parked_state_and_starts_afresh(parking: Client, state_dir: Path) -> None:
    conversation = _new()
    assert (await run_in(parking, "kept_value = 1", conversation))["status"] == "success"
    with anyio.fail_after(_PARK_WAIT):
        await poll(lambda: len(_parked(state_dir)) == 1)

    fresh = await run_in(parking, "print('kept_value' in globals())", conversation, reset=True)

    assert (fresh["session"], fresh["stdout"]) == ("new", "False\n")
    assert _parked(state_dir) == []


async def test_a_parked_state_altered_on_disk_is_refused_never_loaded(parking: Client, state_dir: Path) -> None:
    conversation = _new()
    assert (await run_in(parking, "value = 'original'", conversation))["status"] == "success"
    with anyio.fail_after(_PARK_WAIT):
        await poll(lambda: len(_parked(state_dir)) == 1)
    [path] = _parked(state_dir)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of the snapshot
    path.write_bytes(bytes(data))

    refused = await run_in(parking, "open('ran.txt', 'w').write('ran')\nprint(value)", conversation)
    deleted = _parked(state_dir) == []  # refused: deleted, no session started to park again
    listed = await run_in(parking, "import os\nprint(os.path.exists('ran.txt'), 'value' in globals())", conversation)

    assert refused["status"] == "error"
    assert "failed its integrity check" in refused["error"] and "nothing ran" in refused["error"]
    assert deleted
    assert (listed["session"], listed["stdout"]) == ("new", "False False\n")


async def test_a_parked_state_moved_to_another_conversation_is_refused(parking: Client, state_dir: Path) -> None:
    first, second = _new(), _new()
    assert (await run_in(parking, "owner = 'first'", first))["status"] == "success"
    assert (await run_in(parking, "owner = 'second'", second))["status"] == "success"
    with anyio.fail_after(_PARK_WAIT):
        await poll(lambda: len(_parked(state_dir)) == 2)
    one, other = _parked(state_dir)
    swap = one.with_suffix(".swap")
    one.rename(swap)
    other.rename(one)
    swap.rename(other)

    for conversation in (first, second):
        refused = await run_in(parking, "print(owner)", conversation)
        assert refused["status"] == "error", refused
        assert "failed its integrity check" in refused["error"]
    assert _parked(state_dir) == []


async def test_a_fork_of_a_parked_conversation_carries_its_variables_and_leaves_it_parked(
    parking: Client, state_dir: Path
) -> None:
    source, fork = _new(), _new()
    assert (await run_in(parking, "class Point:\n    x = 3\nplace = Point()", source))["status"] == "success"
    state = _state(state_dir, source)
    with anyio.fail_after(_PARK_WAIT):
        await poll(state.exists)

    forked = await run_in(parking, "print(place.x, type(place).__name__)", fork, forkFrom=source)
    still_parked = state.exists()
    resumed = await run_in(parking, "print(place.x)", source)

    assert (forked["status"], forked["stdout"]) == ("success", "3 Point\n"), forked
    assert forked["fork"]["variables"] == 2 and forked["session"] == "new"
    assert still_parked
    assert (resumed["session"], resumed["stdout"]) == ("resumed", "3\n")


async def test_with_parking_off_a_graceful_stop_parks_nothing(state_dir: Path, sandbox_runtime: Path | None) -> None:
    conversation = _new()
    async with memory_client(state_dir, sandbox_runtime, session_park_after=0) as client:
        assert (await run_in(client, "lost = 1", conversation))["status"] == "success"

    assert _parked(state_dir) == []


async def test_a_park_keeps_no_more_variables_than_the_conversations_quota_leaves(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    conversation = _new()
    code = "open('fill.bin', 'wb').write(b'f' * (700 << 10))\nbig = b'b' * (500 << 10)\nsmall = 7"
    async with memory_client(state_dir, sandbox_runtime, session_park_after=1.0, quota_bytes=1 << 20) as client:
        assert (await run_in(client, code, conversation))["status"] == "success"
        state = _state(state_dir, conversation)
        with anyio.fail_after(_PARK_WAIT):
            await poll(state.exists)
        size = state.stat().st_size
        resumed = await run_in(client, "print(small, 'big' in globals())", conversation)

    assert size < 300 << 10  # what the quota left: the 500 KiB variable is not in it
    assert (resumed["session"], resumed["stdout"]) == ("resumed", "7 False\n")
    assert any(entry.startswith("big (over the limit of") for entry in resumed["notKept"]), resumed
