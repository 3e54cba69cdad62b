"""``forkFrom``: a new conversation made of a copy of a live one (files, variables), through the tools on real bwrap.

Each test drives a whole service in this process over the SDK's in-memory pairing; the sandboxes
are real. What one side writes after the fork (files, variables, /tmp, background processes) is
checked from the other side. test_fork_containers.py runs the ones that tell backends apart on
podman and docker.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from engine.test_warm import _FRESH_STATE, _SCHEDULING_ATTACK
from mcp_test_helpers import CALL_BOUND, memory_client, new_conversation, run_in, run_ok, run_python, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture
async def client(state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    async with memory_client(state_dir, sandbox_runtime) as client:
        yield client


_SOURCE = """
import json, collections
numbers = [1, 2, 3]
counts = collections.Counter("abca")
def double(x, factor=2):
    return x * factor
class Local:
    pass
class Tagged(metaclass=type("Meta", (type,), {})):
    pass
gen = (i for i in range(3))
open('/workspace/data.txt', 'w').write('source data')
import os
os.makedirs('/workspace/sub/deeper', exist_ok=True)
open('/workspace/sub/deeper/n.txt', 'w').write('nested')
os.symlink('data.txt', '/workspace/link')
"""


async def test_a_fork_sees_the_sources_variables_functions_modules_and_files(client: Client) -> None:
    source, fork = new_conversation(), new_conversation()
    await run_ok(client, _SOURCE, source)

    data = await run_ok(
        client,
        "print(numbers, counts['a'], double(21), json.dumps({'k': 1}), open('data.txt').read(),"
        " open('sub/deeper/n.txt').read(), os.readlink('link'))",
        fork,
        forkFrom=source,
    )

    assert data["stdout"] == '[1, 2, 3] 2 42 {"k": 1} source data nested data.txt\n'
    assert data["session"] == "new"
    report = data["fork"]
    # json, collections, os and the class Local too
    assert (report["from"], report["files"], report["variables"]) == (source, 2, 7)
    assert report["modules"] > 0
    skipped = " ".join(report["skipped"])
    assert "Tagged (a class with a metaclass of its own" in skipped
    assert "gen (" in skipped
    assert sorted(entry["name"] for entry in data["files"]) == ["data.txt", "sub/deeper/n.txt"]


_MARKER = "fork-marker-sleeper"
_FIND = (
    "import os\n"
    "def running(marker):\n"
    "    found = False\n"
    "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "        try:\n"
    "            found |= marker.encode() in open(f'/proc/{pid}/cmdline', 'rb').read()\n"
    "        except OSError:\n"
    "            pass\n"
    "    return found\n"
)


async def test_writes_after_a_fork_stay_on_their_side(client: Client) -> None:
    source, fork = new_conversation(), new_conversation()
    await run_ok(
        client,
        "x = 1\nopen('shared.txt', 'w').write('before')\nopen('/tmp/t.txt', 'w').write('tmp before')\n"
        f"import subprocess\nworker = subprocess.Popen(['sh', '-c', 'sleep 300 # {_MARKER}'])",
        source,
    )
    forked = await run_ok(
        client,
        _FIND + "import os\nprint(os.path.exists('/tmp/t.txt'), running('" + _MARKER + "'))\n"
        "x = 2\nopen('shared.txt', 'w').write('fork')\nopen('/tmp/t.txt', 'w').write('tmp fork')\n"
        "open('fork-only.txt', 'w').write('f')",
        fork,
        forkFrom=source,
    )
    await run_ok(client, "x += 10\nopen('source-only.txt', 'w').write('s')", source)

    in_source = await run_ok(
        client,
        _FIND + "print(x, open('shared.txt').read(), open('/tmp/t.txt').read(), sorted(os.listdir('.')),"
        f" running('{_MARKER}'))",
        source,
    )
    in_fork = await run_ok(
        client,
        _FIND + "print(x, open('shared.txt').read(), open('/tmp/t.txt').read(), sorted(os.listdir('.')),"
        f" running('{_MARKER}'))",
        fork,
    )

    # /tmp and processes are each sandbox's own: the fork starts with neither of the source's.
    assert forked["stdout"] == "False False\n"
    assert in_source["stdout"] == "11 before tmp before ['shared.txt', 'source-only.txt'] True\n"
    assert in_fork["stdout"] == "2 fork tmp fork ['fork-only.txt', 'shared.txt'] False\n"


async def test_a_fork_of_a_fork_and_a_checkpoint_rolled_back(client: Client) -> None:
    work, checkpoint, second, rolled = new_conversation(), new_conversation(), new_conversation(), new_conversation()
    await run_ok(client, "state = ['a']\nopen('log.txt', 'w').write('a')", work)
    await run_ok(client, "pass", checkpoint, forkFrom=work)  # a checkpoint: a fork kept idle
    await run_ok(client, "state.append('b')\nopen('log.txt', 'a').write('b')", work)
    await run_ok(client, "state.append('c')", second, forkFrom=work)

    back = await run_ok(client, "print(state, open('log.txt').read())", rolled, forkFrom=checkpoint)
    of_fork = await run_ok(client, "print(state, open('log.txt').read())", new_conversation(), forkFrom=second)

    assert back["stdout"] == "['a'] a\n"
    assert of_fork["stdout"] == "['a', 'b', 'c'] ab\n"


async def test_a_fork_of_an_idle_source_carries_its_files_and_says_its_variables_were_not(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    source, fork = new_conversation(), new_conversation()
    async with memory_client(state_dir, sandbox_runtime, session_park_after=0) as client:  # not parked at its stop
        await run_ok(client, "x = 1\nopen('kept.txt', 'w').write('k')", source)
    async with memory_client(state_dir, sandbox_runtime) as client:  # a new server: no live interpreter
        data = await run_in(client, "print(open('kept.txt').read(), 'x' in globals())", fork, forkFrom=source)

    assert data["stdout"] == "k False\n"
    assert data["fork"]["variables"] == 0
    assert "no live interpreter" in data["fork"]["skipped"][0]


async def test_forks_that_cannot_be_made_are_refused_naming_what_was_wrong(client: Client) -> None:
    source = new_conversation()
    await run_ok(client, "x = 1", source)
    existing = new_conversation()
    await run_ok(client, "y = 1", existing)

    no_conversation = structured(await run_python(client, {"code": "1", "forkFrom": source}))
    exists = await run_in(client, "1", existing, forkFrom=source)
    missing = await run_in(client, "1", new_conversation(), forkFrom=new_conversation())
    itself = await run_in(client, "1", source, forkFrom=source)

    assert no_conversation["status"] == "validation_error"
    assert "conversationId" in no_conversation["error"]
    assert exists["status"] == "validation_error"
    assert exists["error"].startswith("conversationId:")
    assert missing["status"] == "validation_error"
    assert missing["error"].startswith("forkFrom:")
    assert itself["status"] == "validation_error"
    assert itself["error"].startswith("forkFrom:")


async def test_a_fork_over_the_quota_is_refused_and_leaves_nothing(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    source, fork = new_conversation(), new_conversation()
    async with memory_client(state_dir, sandbox_runtime) as client:
        await run_ok(client, "open('big.bin', 'wb').write(b'x' * 300_000)", source)
    before = set(os.listdir(state_dir / "workspaces"))
    # The operator lowered the quota since: the source is over it, and a fork would start over it.
    async with memory_client(state_dir, sandbox_runtime, quota_bytes=200_000) as client:
        data = await run_in(client, "print('ran')", fork, forkFrom=source)
        after = set(os.listdir(state_dir / "workspaces"))
        again = await run_in(client, "import os\nprint(os.listdir('.'))", fork)

    assert data["status"] == "validation_error"
    assert data["error"].startswith("forkFrom:")
    assert "quota" in data["error"]
    assert after == before  # no directory of the fork, no staging copy
    assert again["stdout"] == "[]\n"  # the fork's id was never made: a plain conversation starts empty


def _started(state_dir: Path) -> bool:
    return bool(list(state_dir.glob("workspaces/*/started")))


async def _running(state_dir: Path) -> None:
    """Until a run has written ``started`` in a conversation's directory: its call is running."""
    with anyio.fail_after(CALL_BOUND):
        while not _started(state_dir):  # noqa: ASYNC110 - no event to wait on
            await anyio.sleep(0.02)


async def test_a_fork_of_a_running_conversation_waits_for_its_call(client: Client, state_dir: Path) -> None:
    source, fork = new_conversation(), new_conversation()
    await run_ok(client, "x = 0", source)
    results: dict[str, dict[str, Any]] = {}

    async def slow() -> None:
        results["source"] = await run_ok(
            client,
            "import time\nopen('started', 'w').close()\ntime.sleep(1.5)\nx = 1\nopen('late.txt', 'w').write('late')",
            source,
        )

    with anyio.fail_after(CALL_BOUND):
        async with anyio.create_task_group() as group:
            group.start_soon(slow)
            await _running(state_dir)
            results["fork"] = await run_ok(client, "print(x, open('late.txt').read())", fork, forkFrom=source)

    assert results["fork"]["stdout"] == "1 late\n"  # of the moment after the running call


async def test_a_fork_of_a_conversation_still_running_at_the_timeout_is_refused_as_busy(
    client: Client, state_dir: Path
) -> None:
    source, fork = new_conversation(), new_conversation()
    await run_ok(client, "x = 0", source)
    results: dict[str, dict[str, Any]] = {}

    async def slow() -> None:
        results["source"] = await run_ok(client, "import time\nopen('started', 'w').close()\ntime.sleep(4)", source)

    with anyio.fail_after(CALL_BOUND):
        async with anyio.create_task_group() as group:
            group.start_soon(slow)
            await _running(state_dir)
            results["fork"] = await run_in(client, "print(x)", fork, forkFrom=source, timeout=1)

    assert results["fork"]["status"] == "error"
    assert results["fork"]["error"].startswith("busy:")
    after = await run_ok(client, "import os\nprint(os.listdir('.'))", fork)
    assert after["stdout"] == "[]\n"


async def test_a_fork_starts_in_the_state_of_a_new_conversation_whatever_its_source_did(client: Client) -> None:
    # The red-team checks of warm residue (issue 21, finding 9) on forks: the source's scheduling
    # policy, xattrs, directory modes and descriptor flags are its sandbox's, not carried.
    source, fork = new_conversation(), new_conversation()
    await run_ok(client, textwrap.dedent(_SCHEDULING_ATTACK), source)
    fresh = await run_ok(client, textwrap.dedent(_FRESH_STATE), new_conversation())
    forked = await run_ok(client, textwrap.dedent(_FRESH_STATE), fork, forkFrom=source)

    assert eval(forked["stdout"]) == eval(fresh["stdout"])
    assert eval(forked["stdout"])["xattrs"] == [[], [], []]


async def test_a_javascript_fork_carries_the_files_and_says_the_variables_were_not(client: Client) -> None:
    source, fork = new_conversation(), new_conversation()
    await run_ok(client, "x = 1\nopen('note.txt', 'w').write('from python')", source)

    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool(
            "run_code",
            {
                "language": "javascript",
                "code": "import { readFileSync } from 'node:fs';\n"
                "console.log(readFileSync('/workspace/note.txt', 'utf8'));",
                "conversationId": fork,
                "forkFrom": source,
            },
        )
    data = structured(result)

    assert (data["status"], data["stdout"]) == ("success", "from python\n")
    assert data["fork"]["files"] == 1
    assert data["fork"]["variables"] == 0
    assert data["fork"]["skipped"] == ["all variables: only a Python run in a session carries them"]


async def test_a_fork_cut_short_while_its_source_dumps_ends_the_sources_interpreter_and_makes_nothing(
    client: Client,
) -> None:
    source, fork = new_conversation(), new_conversation()
    await run_ok(
        client,
        "import time\nclass Slow:\n    def __reduce__(self):\n        time.sleep(30)\n        return (int, ())\n"
        "slow = Slow()\nx = 1",
        source,
    )

    refused = await run_in(client, "print('ran')", fork, forkFrom=source, timeout=1)
    after = await run_ok(client, "print('x' in globals())", source)
    forked_id = await run_ok(client, "import os\nprint(os.listdir('.'))", fork)

    assert refused["status"] == "error"
    assert refused["error"].startswith("busy:")
    # A dump cut short cannot be trusted to end: the source's interpreter was killed, its files kept.
    assert (after["session"], after["stdout"]) == ("new", "False\n")
    assert forked_id["stdout"] == "[]\n"


_PARENT = "import os\nprint(b'--ready=' in open('/proc/self/cmdline', 'rb').read(), flush=True)\n"


async def test_a_forks_first_run_is_born_of_a_session_ready_sandbox_with_the_variables(client: Client) -> None:
    source = new_conversation()
    await run_ok(client, "import pandas as pd\nframe = pd.DataFrame({'a': [1, 2, 3]})", source)

    with anyio.fail_after(CALL_BOUND):
        while True:  # until a session-ready sandbox is idle (the first conversation started the pool)
            data = await run_ok(client, _PARENT + "print(int(frame.a.sum()))", new_conversation(), forkFrom=source)
            if data["stdout"].startswith("True\n"):
                break
            await anyio.sleep(0.2)

    assert data["stdout"] == "True\n6\n"
    assert data["fork"]["skipped"] == []
