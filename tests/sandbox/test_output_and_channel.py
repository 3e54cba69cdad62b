"""Attacks on what the host reads: floods and bad bytes on stdout, garbage on the frame channel.

The host must always come back with a result, within the run's bound, and the next run on the
same engine must work: nothing the sandbox writes may crash or hang the server.
"""

from __future__ import annotations

import textwrap

import anyio
import pytest

from mcp_sandbox.engine import ExecutionResult
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import PROTOCOL_VERSION

from .harness import RunnerFactory, SandboxRunner

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

TRUNCATION_MARKER = "[output truncated"
# Room for the truncation note the host appends after the kept bytes.
NOTE_ROOM = 200


async def _next_run_works(sandbox: SandboxRunner) -> None:
    after = await sandbox.run("print('next')")
    assert (after.status, after.stdout) == ("success", "next\n")


async def test_stdout_flood_is_truncated_near_the_cap(make_sandbox: RunnerFactory) -> None:
    sandbox = make_sandbox(max_output="256k")
    result = await sandbox.run(
        """
        chunk = "x" * (1 << 20)
        for _ in range(50):
            sys.stdout.write(chunk)
        sys.stderr.write(chunk * 4)
    """,
        time_limit=20,
    )
    assert result.status == "success", result.error
    assert result.truncated is True
    for stream in (result.stdout, result.stderr):
        assert TRUNCATION_MARKER in stream
        assert len(stream.encode()) <= sandbox.settings.limits.max_output + NOTE_ROOM
    assert result.stdout.startswith("x" * 1000)


async def test_non_utf8_output_comes_back_with_replacement_characters(sandbox: SandboxRunner) -> None:
    result = await sandbox.run("""
        sys.stdout.buffer.write(b"ok\\xff\\xfe\\x80end\\n")
        sys.stderr.buffer.write(b"\\xc3(\\n")
    """)
    assert result.status == "success", result.stderr
    assert result.stdout == "ok\ufffd\ufffd\ufffdend\n"
    assert result.stderr == "\ufffd(\n"


def _channel_attack(payload: str) -> str:
    """Sandboxed code writing ``payload`` (a bytes expression) on every channel socket it holds.

    The expression may use ``frame(kind, body)``, which builds a well-formed frame header.
    """
    return textwrap.dedent(f"""
        import struct
        def frame(kind, body):
            return struct.pack(">4sBBI", b"MSBX", {PROTOCOL_VERSION}, kind, len(body)) + body
        fds = channel_fds()
        assert fds, "no channel socket found"
        # Said first: the host may end the run as soon as the garbage arrives.
        print("attacked", fds, flush=True)
        for fd in fds:
            os.write(fd, {payload})
    """)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param('b"\\xff" * 4096', id="junk"),
        pytest.param('b"MSBX" + bytes([99]) + bytes(5)', id="unknown-version"),
        pytest.param('frame(99, b"{}")', id="unknown-kind"),
        pytest.param(f'struct.pack(">4sBBI", b"MSBX", {PROTOCOL_VERSION}, 3, 0xFFFFFFFF)', id="oversized-length"),
        pytest.param('frame(3, b"not json")', id="body-not-json"),
        pytest.param('frame(3, b"[]")', id="body-not-object"),
        pytest.param('frame(3, b"{\\"a\\":\\"\\xff\\"}")', id="body-not-utf8"),
        pytest.param('frame(3, b"{\\"a\\":" + b"[" * 100_000 + b"]" * 100_000 + b"}")', id="deeply-nested-body"),
        pytest.param('frame(3, b"{\\"exitCode\\":" + b"9" * 100_000 + b"}")', id="huge-integer-body"),
    ],
)
async def test_garbage_on_the_channel_ends_the_run_without_hurting_the_host(
    sandbox: SandboxRunner, payload: str
) -> None:
    result = await sandbox.run(_channel_attack(payload))
    assert result.status == "error"
    assert result.error is not None
    assert "attacked" in result.stdout  # the attack ran
    await _next_run_works(sandbox)


async def test_frame_header_promising_more_than_is_sent_does_not_hang_the_host(sandbox: SandboxRunner) -> None:
    # 60 MiB promised, a few bytes sent, then the code keeps running: the host must not wait for
    # the rest beyond the run's own end.
    attack = _channel_attack(f'struct.pack(">4sBBI", b"MSBX", {PROTOCOL_VERSION}, 3, 60 << 20)')
    result = await sandbox.run(attack + "\nimport time\ntime.sleep(0.2)\n")
    assert result.status == "error"
    await _next_run_works(sandbox)


async def test_forged_done_frame_does_not_make_a_failed_run_a_success(sandbox: SandboxRunner) -> None:
    # The host judges by the process's exit code, not by what a frame claims (even with the run's number).
    attack = _channel_attack('frame(3, b\'{"run":1,"exitCode":0,"exception":null}\')')
    result = await sandbox.run(attack + "\nsys.exit(3)\n")
    assert result.status == "error"
    assert result.exit_code not in (0, None)
    await _next_run_works(sandbox)


async def test_closing_the_channel_early_still_gives_a_result(sandbox: SandboxRunner) -> None:
    result = await sandbox.run("""
        for fd in channel_fds():
            os.close(fd)
        print("closed")
    """)
    assert result.status == "error"
    assert result.stdout == "closed\n"
    await _next_run_works(sandbox)


def _rss() -> int:
    """This process's resident set (the engine, as in the server, runs in it), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_a_63_mb_call_frame_ends_its_run_and_stalls_no_other(sandbox: SandboxRunner) -> None:
    # Issue 21, finding 1: the host used to buffer and parse such a frame on its event loop (another
    # run's print(1) took 12 s, the server grew by 3 GB). A CALL is now refused on its header.
    attack = f"""
        import struct
        body_size = 63_000_000
        chunk = b"{{\\"op\\":\\"call_tool\\",\\"x\\":\\"" + b"a" * ((1 << 20) - 20)
        fds = channel_fds()
        print("attacking", fds, flush=True)
        for fd in fds:
            try:
                os.write(fd, struct.pack(">4sBBI", b"MSBX", {PROTOCOL_VERSION}, 4, body_size))
                for _ in range(body_size // len(chunk)):
                    os.write(fd, chunk)
            except OSError as exc:
                print("refused:", type(exc).__name__, flush=True)
        import time
        time.sleep(30)
    """
    baseline = _rss()
    peak = baseline
    results: dict[str, object] = {}

    async def run(name: str, code: str, time_limit: float) -> None:
        results[name] = await sandbox.run(code, time_limit=time_limit)

    async def sample() -> None:
        nonlocal peak
        while "attacker" not in results:
            peak = max(peak, _rss())
            await anyio.sleep(0.02)

    async with anyio.create_task_group() as group:
        group.start_soon(sample)
        group.start_soon(run, "attacker", attack, 20.0)
        group.start_soon(run, "other", "print(1)", 20.0)
    attacker, other = results["attacker"], results["other"]
    assert isinstance(attacker, ExecutionResult) and isinstance(other, ExecutionResult)
    assert (other.status, other.stdout) == ("success", "1\n")
    assert attacker.status == "error"  # not a timeout: the frame ended it
    assert attacker.error is not None and "CALL frame" in attacker.error
    assert "attacking" in attacker.stdout
    assert peak - baseline < 300 << 20
    await _next_run_works(sandbox)
