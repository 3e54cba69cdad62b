"""The in-sandbox Python runner, run as the sandbox runs it (boot.py FD), without a sandbox.

The host side here is the frame codec over a socketpair: the EXEC frame is written before the
runner starts reading (the socket buffers it), the runner's frames are read after it exits.
"""

from __future__ import annotations

import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import mcp_sandbox.runners.python
from mcp_sandbox.runners.python.mcp_sandbox_runtime import frames
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import Kind

# The interpreter the sandbox runs (Debian's); the runner must work on it, not only on the venv's.
PYTHON = Path("/usr/bin/python3")
BOOT = Path(mcp_sandbox.runners.python.__file__).with_name("boot.py")
EXIT_PROTOCOL = 76  # the runner's exit code for a broken host conversation
RUN_TIMEOUT_SECONDS = 30.0

pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason=f"{PYTHON} is not installed")

FILE_LINE = re.compile(r'^\s*\|?\s*File "([^"]*)"', re.MULTILINE)


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    frames: list[tuple[Kind, dict[str, Any]]]

    @property
    def done(self) -> dict[str, Any]:
        assert [kind for kind, _ in self.frames] == [Kind.READY, Kind.DONE]
        return self.frames[-1][1]

    @property
    def traceback_files(self) -> list[str]:
        return FILE_LINE.findall(self.stderr)


def read_frames(sock: socket.socket) -> list[tuple[Kind, dict[str, Any]]]:
    """Every frame left in ``sock`` by a runner that has exited."""
    received: list[tuple[Kind, dict[str, Any]]] = []
    try:
        while (frame := frames.read_frame(sock.fileno())) is not None:
            received.append(frame)
    except ConnectionResetError:
        # The runner exited with bytes of ours unread (a rejected request): Linux reports that
        # as a reset once the frames it sent before are read.
        pass
    return received


def run_boot(request: bytes, *, hang_up: bool = False) -> Run:
    """Start boot.py on a socketpair, hand it ``request``, and collect everything it says.

    With ``hang_up``, the host's side is shut down for writing after the request.
    """
    host, child = socket.socketpair()
    with host:
        with (
            child,
            subprocess.Popen(
                [str(PYTHON), "-I", "-B", str(BOOT), str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},  # as in the sandbox: nothing of the host's environment
            ) as process,
        ):
            child.close()  # the runner's exit must end the stream
            host.sendall(request)
            if hang_up:
                host.shutdown(socket.SHUT_WR)
            try:
                out, err = process.communicate(timeout=RUN_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                raise
        received = read_frames(host)
    return Run(process.returncode, out.decode(), err.decode(), received)


def run_code(code: str) -> Run:
    return run_boot(frames.encode(Kind.EXEC, {"code": code}))


def test_the_runner_announces_itself_before_running_code() -> None:
    run = run_code("pass")

    kind, body = run.frames[0]
    assert kind is Kind.READY
    assert body["runtime"] == "python"


def test_code_that_finishes_reports_exit_code_zero() -> None:
    run = run_code("print('hello')")

    assert (run.returncode, run.done, run.stdout, run.stderr) == (
        0,
        {"exitCode": 0, "exception": None},
        "hello\n",
        "",
    )


def test_top_level_await_works() -> None:
    run = run_code(
        "import asyncio\nasync def answer():\n    await asyncio.sleep(0)\n    return 42\nprint(await answer())\n"
    )

    assert (run.returncode, run.done["exitCode"], run.stdout) == (0, 0, "42\n")


def test_the_code_runs_as_main() -> None:
    run = run_code("if __name__ == '__main__':\n    print('main')\n")

    assert run.stdout == "main\n"


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("import sys\nsys.exit(3)\n", id="top-level"),
        pytest.param("import sys\nasync def leave():\n    sys.exit(3)\nawait leave()\n", id="in-async-function"),
        pytest.param("raise SystemExit(3)\n", id="raise-system-exit"),
    ],
)
def test_sys_exit_with_a_number_gives_that_exit_code(code: str) -> None:
    run = run_code(code)

    assert (run.returncode, run.done) == (3, {"exitCode": 3, "exception": None})
    assert run.traceback_files == []


@pytest.mark.parametrize(
    "code", ["import sys\nsys.exit()\n", "import sys\nsys.exit(None)\n", "import sys\nsys.exit(0)\n"]
)
def test_sys_exit_without_a_number_or_with_zero_is_success(code: str) -> None:
    run = run_code(code)

    assert (run.returncode, run.done["exitCode"]) == (0, 0)


def test_sys_exit_with_a_message_gives_exit_code_one_and_prints_the_message() -> None:
    run = run_code("import sys\nprint('before')\nsys.exit('goodbye, cruel world')\n")

    assert (run.returncode, run.done) == (1, {"exitCode": 1, "exception": None})
    assert run.stdout == "before\n"
    assert run.stderr == "goodbye, cruel world\n"


RAISING = [
    pytest.param("raise ValueError('boom')\n", "ValueError", id="top-level"),
    pytest.param(
        "def inner():\n    raise ValueError('boom')\ndef outer():\n    inner()\nouter()\n",
        "ValueError",
        id="nested",
    ),
    pytest.param("async def fail():\n    raise ValueError('boom')\nawait fail()\n", "ValueError", id="awaited"),
    pytest.param(
        "import asyncio\nasync def fail():\n    raise ValueError('boom')\nawait asyncio.gather(fail())\n",
        "ValueError",
        id="gathered",
    ),
    pytest.param(
        "def load():\n    try:\n        {}['key']\n    except KeyError as error:\n"
        "        raise RuntimeError('no config') from error\nload()\n",
        "RuntimeError",
        id="chained-cause",
    ),
    pytest.param(
        "def load():\n    try:\n        1 / 0\n"
        "    except ZeroDivisionError:\n        raise LookupError('lost')\n"
        "load()\n",
        "LookupError",
        id="chained-context",
    ),
    pytest.param(
        "async def inner():\n    raise KeyError('k')\nasync def outer():\n    try:\n        await inner()\n"
        "    except KeyError as error:\n        raise RuntimeError('wrapped') from error\nawait outer()\n",
        "RuntimeError",
        id="async-chained",
    ),
]


@pytest.mark.parametrize(("code", "exception"), RAISING)
def test_an_uncaught_exception_gives_exit_code_one_and_names_it(code: str, exception: str) -> None:
    run = run_code(code)

    assert (run.returncode, run.done) == (1, {"exitCode": 1, "exception": exception})
    assert run.stderr.rstrip().splitlines()[-1].startswith(exception)


@pytest.mark.parametrize(("code", "exception"), RAISING)
def test_a_traceback_shows_only_the_users_frames(code: str, exception: str) -> None:
    run = run_code(code)

    assert run.traceback_files != []
    assert set(run.traceback_files) == {"<main>"}


def test_a_chained_traceback_shows_both_exceptions() -> None:
    run = run_code(
        "def load():\n    try:\n        {}['key']\n    except KeyError as error:\n"
        "        raise RuntimeError('no config') from error\nload()\n"
    )

    exception_lines = [line.split(":")[0] for line in run.stderr.splitlines() if re.match(r"^\w+(Error)?:", line)]
    assert exception_lines == ["KeyError", "RuntimeError"]


@pytest.mark.parametrize(
    "code", [pytest.param("x = (\n", id="unclosed"), pytest.param("def f(:\n    pass\n", id="bad-def")]
)
def test_a_syntax_error_gives_exit_code_one_without_runtime_frames(code: str) -> None:
    run = run_code(code)

    assert (run.returncode, run.done) == (1, {"exitCode": 1, "exception": "SyntaxError"})
    assert "SyntaxError" in run.stderr
    assert set(run.traceback_files) == {"<main>"}
    assert run.stdout == ""


def test_output_printed_by_user_code_never_reaches_the_channel() -> None:
    forged = frames.encode(Kind.DONE, {"exitCode": 0, "exception": "forged"})
    run = run_code(f"import sys\nsys.stdout.buffer.write({forged!r})\nsys.exit(5)\n")

    assert run.done == {"exitCode": 5, "exception": None}
    assert run.stdout.encode() == forged


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(frames.encode(Kind.READY, {"code": "print(1)"}), id="READY"),
        pytest.param(frames.encode(Kind.DONE, {"code": "print(1)"}), id="DONE"),
        pytest.param(frames.encode(Kind.CALL, {"code": "print(1)"}), id="CALL"),
        pytest.param(frames.encode(Kind.REPLY, {"code": "print(1)"}), id="REPLY"),
        pytest.param(frames.encode(Kind.ERROR, {"code": "print(1)"}), id="ERROR"),
        pytest.param(frames.encode(Kind.EXEC, {"source": "print(1)"}), id="EXEC-without-code"),
        pytest.param(frames.encode(Kind.EXEC, {"code": ["print(1)"]}), id="EXEC-code-not-a-string"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="not-a-frame"),
        pytest.param(frames.encode(Kind.EXEC, {"code": "print(1)"})[:-2], id="truncated-exec"),
    ],
)
def test_anything_but_an_exec_frame_is_answered_with_an_error_frame(request_bytes: bytes) -> None:
    run = run_boot(request_bytes, hang_up=True)

    assert run.returncode == EXIT_PROTOCOL
    assert [kind for kind, _ in run.frames] == [Kind.READY, Kind.ERROR]
    assert run.stdout == ""


def test_a_host_that_hangs_up_without_a_request_ends_the_runner() -> None:
    run = run_boot(b"", hang_up=True)

    assert run.returncode == EXIT_PROTOCOL
    assert [kind for kind, _ in run.frames] == [Kind.READY]
