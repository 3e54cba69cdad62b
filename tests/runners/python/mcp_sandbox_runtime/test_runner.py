"""The in-sandbox Python runner, run as the sandbox runs it (boot.py FD), without a sandbox.

The test plays the host with the frame codec over a socketpair: each EXEC frame carries the
write ends of two fresh pipes (SCM_RIGHTS), which the test reads to their end; then it reads
frames up to the run's DONE. One runner serves any number of runs (a session); an EXEC with
``last`` is a fresh run's, after which the runner exits with that run's exit code.
"""

from __future__ import annotations

import array
import os
import re
import select
import socket
import subprocess
import time
from collections.abc import Iterator
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
BOUND = 30.0  # bounds every wait; none comes near it when all is well

pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason=f"{PYTHON} is not installed")

FILE_LINE = re.compile(r'^\s*\|?\s*File "([^"]*)"', re.MULTILINE)


@dataclass(frozen=True)
class Output:
    """One run as the host saw it: the run's own pipes and the frames up to its DONE."""

    stdout: str
    stderr: str
    frames: list[tuple[Kind, dict[str, Any]]]

    @property
    def done(self) -> dict[str, Any]:
        kind, body = self.frames[-1]
        assert kind is Kind.DONE, self.frames
        return body

    @property
    def exit_code(self) -> int:
        code: int = self.done["exitCode"]
        return code

    @property
    def traceback_files(self) -> list[str]:
        return FILE_LINE.findall(self.stderr)


def _read_to_end(fds: list[int]) -> dict[int, bytes]:
    """Read every pipe in ``fds`` until each has ended (bounded)."""
    data = dict.fromkeys(fds, b"")
    open_fds = list(fds)
    deadline = time.monotonic() + BOUND
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the run's pipes did not end within {BOUND} s"
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                data[fd] += chunk
            else:
                open_fds.remove(fd)
    return data


class Runner:
    """boot.py on one end of a socketpair; the test on the other."""

    def __init__(self, *options: str) -> None:
        """``options``: the runner's own, before the channel's descriptor (``--ready=MODULES``)."""
        self.host, child = socket.socketpair()
        with child:
            self.process = subprocess.Popen(
                [str(PYTHON), "-I", "-B", str(BOOT), *options, str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},  # as in the sandbox: nothing of the host's environment
            )
        self.runs = 0
        self.ready = self.frame()

    def frame(self) -> tuple[Kind, dict[str, Any]]:
        ready, _, _ = select.select([self.host], [], [], BOUND)
        assert ready, f"no frame from the runner within {BOUND} s"
        frame = frames.read_frame(self.host.fileno())
        assert frame is not None, "the runner closed the channel"
        return frame

    def send(self, kind: Kind, body: dict[str, Any], fds: list[int] | None = None) -> None:
        data = frames.encode(kind, body)
        sent = 0
        if fds:
            sent = self.host.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        if sent < len(data):  # an empty sendall still writes, and the runner may be gone already
            self.host.sendall(data[sent:])

    def run(self, code: str, *, last: bool = False, pipes: bool = True, **fields: Any) -> Output:
        """Send one EXEC (with two fresh pipes unless ``pipes`` is off) and collect the run."""
        self.runs += 1
        body = {"run": self.runs, "code": code, "last": last, **fields}
        if not pipes:
            self.send(Kind.EXEC, body)
            output = {0: b"", 1: b""}
        else:
            (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
            try:
                self.send(Kind.EXEC, body, [out_w, err_w])
                os.close(out_w)
                os.close(err_w)
                data = _read_to_end([out_r, err_r])
                output = {0: data[out_r], 1: data[err_r]}
            finally:
                for fd in (out_r, out_w, err_r, err_w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        received: list[tuple[Kind, dict[str, Any]]] = []
        while not received or received[-1][0] is not Kind.DONE:
            received.append(self.frame())
        return Output(output[0].decode(), output[1].decode(), received)

    def hang_up(self) -> tuple[int, str, str]:
        """Close the test's side; the runner's exit code and its own stdout/stderr."""
        self.host.shutdown(socket.SHUT_WR)
        return self.finish()

    def finish(self) -> tuple[int, str, str]:
        try:
            out, err = self.process.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise
        return self.process.returncode, out.decode(), err.decode()

    def rest(self) -> list[tuple[Kind, dict[str, Any]]]:
        """Every frame left in the socket by a runner that has exited."""
        received: list[tuple[Kind, dict[str, Any]]] = []
        try:
            while (frame := frames.read_frame(self.host.fileno())) is not None:
                received.append(frame)
        except ConnectionResetError:
            pass  # the runner exited with bytes of ours unread (a rejected request)
        return received

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()
        self.host.close()


@pytest.fixture
def runner() -> Iterator[Runner]:
    started = Runner()
    try:
        yield started
    finally:
        started.close()


def run_once(code: str) -> tuple[Output, int]:
    """A fresh run: one EXEC with ``last``; the run and the runner's exit code."""
    runner = Runner()
    try:
        output = runner.run(code, last=True)
        returncode, own_out, own_err = runner.finish()
        assert (own_out, own_err) == ("", "")  # the process's own streams stay quiet
        return output, returncode
    finally:
        runner.close()


# --- one run ----------------------------------------------------------------------------------


def test_the_runner_announces_itself_before_running_code(runner: Runner) -> None:
    kind, body = runner.ready
    assert kind is Kind.READY
    assert body["runtime"] == "python"


def test_code_that_finishes_reports_exit_code_zero_and_its_output_comes_on_its_pipes() -> None:
    output, returncode = run_once("print('hello')")

    assert (returncode, output.done, output.stdout, output.stderr) == (
        0,
        {"run": 1, "exitCode": 0, "exception": None},
        "hello\n",
        "",
    )


def test_top_level_await_works() -> None:
    output, returncode = run_once(
        "import asyncio\nasync def answer():\n    await asyncio.sleep(0)\n    return 42\nprint(await answer())\n"
    )

    assert (returncode, output.exit_code, output.stdout) == (0, 0, "42\n")


def test_the_code_runs_as_main_in_the_main_modules_namespace() -> None:
    output, _ = run_once(
        "import sys\nx = 1\nif __name__ == '__main__':\n    print('main', sys.modules['__main__'].x)\n"
    )

    assert output.stdout == "main 1\n"


def test_a_class_defined_by_the_code_pickles_by_reference_to_main() -> None:
    output, _ = run_once(
        "import pickle\nclass Point:\n    pass\nprint(type(pickle.loads(pickle.dumps(Point()))).__name__)\n"
    )

    assert output.stdout == "Point\n"


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("import sys\nsys.exit(3)\n", id="top-level"),
        pytest.param("import sys\nasync def leave():\n    sys.exit(3)\nawait leave()\n", id="in-async-function"),
        pytest.param("raise SystemExit(3)\n", id="raise-system-exit"),
    ],
)
def test_sys_exit_with_a_number_gives_that_exit_code(code: str) -> None:
    output, returncode = run_once(code)

    assert (returncode, output.done) == (3, {"run": 1, "exitCode": 3, "exception": None})
    assert output.traceback_files == []


@pytest.mark.parametrize(
    "code", ["import sys\nsys.exit()\n", "import sys\nsys.exit(None)\n", "import sys\nsys.exit(0)\n"]
)
def test_sys_exit_without_a_number_or_with_zero_is_success(code: str) -> None:
    output, returncode = run_once(code)

    assert (returncode, output.exit_code) == (0, 0)


def test_sys_exit_with_a_message_gives_exit_code_one_and_prints_the_message() -> None:
    output, returncode = run_once("import sys\nprint('before')\nsys.exit('goodbye, cruel world')\n")

    assert (returncode, output.exit_code) == (1, 1)
    assert output.stdout == "before\n"
    assert output.stderr == "goodbye, cruel world\n"


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
    output, returncode = run_once(code)

    assert (returncode, output.done) == (1, {"run": 1, "exitCode": 1, "exception": exception})
    assert output.stderr.rstrip().splitlines()[-1].startswith(exception)


@pytest.mark.parametrize(("code", "exception"), RAISING)
def test_a_traceback_shows_only_the_users_frames(code: str, exception: str) -> None:
    output, _ = run_once(code)

    assert output.traceback_files != []
    assert set(output.traceback_files) == {"<main>"}


def test_a_chained_traceback_shows_both_exceptions() -> None:
    output, _ = run_once(
        "def load():\n    try:\n        {}['key']\n    except KeyError as error:\n"
        "        raise RuntimeError('no config') from error\nload()\n"
    )

    exception_lines = [line.split(":")[0] for line in output.stderr.splitlines() if re.match(r"^\w+(Error)?:", line)]
    assert exception_lines == ["KeyError", "RuntimeError"]


@pytest.mark.parametrize(
    "code", [pytest.param("x = (\n", id="unclosed"), pytest.param("def f(:\n    pass\n", id="bad-def")]
)
def test_a_syntax_error_gives_exit_code_one_without_runtime_frames(code: str) -> None:
    output, returncode = run_once(code)

    assert (returncode, output.done) == (1, {"run": 1, "exitCode": 1, "exception": "SyntaxError"})
    assert "SyntaxError" in output.stderr
    assert set(output.traceback_files) == {"<main>"}
    assert output.stdout == ""


def test_output_printed_by_user_code_never_reaches_the_channel() -> None:
    forged = frames.encode(Kind.DONE, {"run": 1, "exitCode": 0, "exception": "forged"})
    output, _ = run_once(f"import sys\nsys.stdout.buffer.write({forged!r})\nsys.exit(5)\n")

    assert output.done == {"run": 1, "exitCode": 5, "exception": None}
    assert output.stdout.encode() == forged


def test_a_subprocess_writes_to_the_runs_pipes() -> None:
    output, _ = run_once(
        "import subprocess, sys\n"
        "subprocess.run(['/bin/sh', '-c', 'echo out; echo err >&2'], check=True)\n"
        "print('after', flush=True)\n"
    )

    assert (output.stdout, output.stderr) == ("out\nafter\n", "err\n")


def test_an_exec_without_pipes_writes_to_the_processs_own_stdout(runner: Runner) -> None:
    output = runner.run("print('on the process stdout')", pipes=False, last=True)
    returncode, own_out, _ = runner.finish()

    assert (output.exit_code, returncode, own_out) == (0, 0, "on the process stdout\n")


# --- many runs: a session ---------------------------------------------------------------------


def test_variables_and_imports_are_kept_between_runs(runner: Runner) -> None:
    runner.run("import json\ncounter = 41")
    second = runner.run("counter += 1\nprint(json.dumps({'counter': counter}))")

    assert (second.exit_code, second.stdout) == (0, '{"counter": 42}\n')


def test_each_run_reports_its_own_exit_code_and_the_runner_goes_on(runner: Runner) -> None:
    codes = [runner.run(code).done for code in ("import sys\nsys.exit(4)", "raise KeyError('k')", "x = 1", "undefined")]

    assert [(done["run"], done["exitCode"], done["exception"]) for done in codes] == [
        (1, 4, None),
        (2, 1, "KeyError"),
        (3, 0, None),
        (4, 1, "NameError"),
    ]


def test_each_run_has_its_own_output_and_the_processs_streams_stay_quiet(runner: Runner) -> None:
    first = runner.run("print('one')\nimport sys\nprint('one err', file=sys.stderr)")
    second = runner.run("print('two')")
    returncode, own_out, own_err = runner.hang_up()

    assert [(run.stdout, run.stderr) for run in (first, second)] == [("one\n", "one err\n"), ("two\n", "")]
    assert (returncode, own_out, own_err) == (0, "", "")


def test_a_run_that_replaced_or_closed_sys_stdout_does_not_break_the_next(runner: Runner) -> None:
    runner.run("import sys, io\nsys.stdout.close()\nsys.stderr = io.StringIO()")
    second = runner.run("print('fine')\nimport sys\nprint('also', file=sys.stderr)")

    assert (second.stdout, second.stderr) == ("fine\n", "also\n")


def test_the_environment_of_a_run_is_applied_for_that_run_only(runner: Runner) -> None:
    show = (
        "import os, subprocess\n"
        "env = subprocess.run(['/usr/bin/env'], capture_output=True, text=True).stdout\n"
        "print(os.environ.get('TOKEN'), env.count('TOKEN='))"
    )
    first = runner.run(show, env={"TOKEN": "s3cret"})
    runner.run("import os\nos.environ['LEFT'] = 'x'")
    second = runner.run(show + "\nprint(os.environ.get('LEFT'))")

    assert first.stdout == "s3cret 1\n"
    assert second.stdout == "None 0\nNone\n"


def test_the_event_loop_and_its_tasks_survive_between_runs(runner: Runner) -> None:
    runner.run(
        "import asyncio\nticks = 0\nasync def tick():\n    global ticks\n    while True:\n"
        "        ticks += 1\n        await asyncio.sleep(0)\n"
        "ticker = asyncio.create_task(tick())\nawait asyncio.sleep(0)"
    )
    second = runner.run("before = ticks\nawait asyncio.sleep(0.01)\nprint(ticks > before, ticker.done())")

    assert second.stdout == "True False\n"


def test_a_later_runs_traceback_names_that_run_and_shows_earlier_runs_lines(runner: Runner) -> None:
    runner.run("def explode():\n    raise ValueError('from run one')\n")
    second = runner.run("x = 1\nexplode()\n")

    assert second.traceback_files == ["<main-2>", "<main>"]
    assert "raise ValueError('from run one')" in second.stderr


def test_a_stale_reply_is_ignored_and_the_next_exec_runs(runner: Runner) -> None:
    runner.send(Kind.REPLY, {"id": 99, "ok": True, "result": None})
    output = runner.run("print('still serving')")

    assert output.stdout == "still serving\n"


def test_after_the_host_hangs_up_the_runner_exits_with_the_last_runs_exit_code(runner: Runner) -> None:
    runner.run("x = 1")
    runner.run("import sys\nsys.exit(9)")

    assert runner.hang_up()[0] == 9


def test_a_last_exec_ends_the_runner_with_its_exit_code(runner: Runner) -> None:
    runner.run("x = 1")
    runner.run("import sys\nsys.exit(7)", last=True)

    assert runner.finish()[0] == 7


# --- protocol errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(frames.encode(Kind.READY, {"code": "print(1)"}), id="READY"),
        pytest.param(frames.encode(Kind.DONE, {"code": "print(1)"}), id="DONE"),
        pytest.param(frames.encode(Kind.CALL, {"code": "print(1)"}), id="CALL"),
        pytest.param(frames.encode(Kind.DISPLAY, {"code": "print(1)"}), id="DISPLAY"),
        pytest.param(frames.encode(Kind.EXEC, {"source": "print(1)"}), id="EXEC-without-code"),
        pytest.param(frames.encode(Kind.EXEC, {"code": ["print(1)"]}), id="EXEC-code-not-a-string"),
        pytest.param(frames.encode(Kind.EXEC, {"code": "1", "env": {"A": 1}}), id="EXEC-env-not-strings"),
        pytest.param(frames.encode(Kind.EXEC, {"code": "1", "servers": ["not an alias"]}), id="EXEC-bad-server"),
        pytest.param(frames.encode(Kind.EXEC, {"code": "1", "run": -1}), id="EXEC-negative-run"),
        pytest.param(frames.encode(Kind.EXEC, {"code": "1", "last": "yes"}), id="EXEC-last-not-a-boolean"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="not-a-frame"),
        pytest.param(frames.encode(Kind.EXEC, {"code": "print(1)"})[:-2], id="truncated-exec"),
    ],
)
def test_anything_but_a_valid_exec_frame_is_answered_with_an_error_frame(runner: Runner, request_bytes: bytes) -> None:
    runner.host.sendall(request_bytes)
    returncode, own_out, _ = runner.hang_up()

    assert returncode == EXIT_PROTOCOL
    assert [kind for kind, _ in runner.rest()] == [Kind.ERROR]
    assert own_out == ""


def test_an_exec_with_one_descriptor_is_refused_and_the_descriptor_closed(runner: Runner) -> None:
    read_end, write_end = os.pipe()
    try:
        runner.send(Kind.EXEC, {"run": 1, "code": "print(1)"}, [write_end])
        os.close(write_end)
        returncode, _, _ = runner.hang_up()
        # Every copy of the write end is gone, the runner's included: the pipe reads as ended.
        assert os.read(read_end, 10) == b""
    finally:
        os.close(read_end)

    assert returncode == EXIT_PROTOCOL
    assert [kind for kind, _ in runner.rest()] == [Kind.ERROR]


def test_an_error_frame_from_the_host_ends_the_runner_without_an_answer(runner: Runner) -> None:
    runner.send(Kind.ERROR, {"message": "the host is confused"})
    returncode, _, _ = runner.finish()

    assert returncode == EXIT_PROTOCOL
    assert runner.rest() == []


def test_a_host_that_hangs_up_without_a_request_ends_the_runner(runner: Runner) -> None:
    returncode, _, _ = runner.hang_up()

    assert returncode == EXIT_PROTOCOL
    assert runner.rest() == []


# --- a session-ready sandbox's runner ---------------------------------------------------------


@pytest.mark.parametrize(("modules", "loaded"), [("fractions", "True"), ("", "False")])
def test_a_ready_runner_imports_its_modules_first_then_serves_a_session(modules: str, loaded: str) -> None:
    # `--ready=MODULES`: started ahead of its session, it imports MODULES before it says READY,
    # and then is a session's runner: one namespace over runs, each run's own exit code.
    runner = Runner(f"--ready={modules},no_such_module_here")
    try:
        assert runner.ready[0] is Kind.READY
        first = runner.run("import sys\nprint('fractions' in sys.modules)\nkept = 41")
        missing = runner.run("import no_such_module_here")
        second = runner.run("kept += 1\nprint(kept)\nraise SystemExit(3)")
        returncode, own_out, own_err = runner.hang_up()
    finally:
        runner.close()

    assert (first.stdout, first.exit_code) == (f"{loaded}\n", 0)
    assert missing.exit_code == 1 and "ModuleNotFoundError" in missing.stderr  # the run sees it itself
    assert (second.stdout, second.exit_code) == ("42\n", 3)
    assert (returncode, own_out, own_err) == (3, "", "")


# --- a resumed session's state, loaded on the host's verdict ----------------------------------


def _tripwire_state(tmp_path: Path) -> tuple[int, int, Path]:
    """A read-only descriptor of a state whose one variable writes a file when it is unpickled, its
    size, and that file (not there yet)."""
    from mcp_sandbox.runners.python.mcp_sandbox_runtime import fork

    marker = tmp_path / "built"

    class Tripwire:
        def __reduce__(self) -> tuple[Any, ...]:
            return (eval, (f"open({str(marker)!r}, 'w').write('built') and 'tripped'",))

    path = tmp_path / "state"
    path.write_bytes(b"".join(bytes(piece) for piece in fork.dump({"tripwire": Tripwire()}, 1 << 20)))
    return os.open(path, os.O_RDONLY), path.stat().st_size, marker


def test_a_state_awaiting_its_verdict_is_loaded_once_the_host_says_it_held(runner: Runner, tmp_path: Path) -> None:
    state, size, marker = _tripwire_state(tmp_path)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    body = {"run": 1, "code": "print(tripwire)", "last": False, "state": size, "verdict": True}
    runner.send(Kind.EXEC, body, [out_w, err_w, state])
    for fd in (out_w, err_w, state):
        os.close(fd)
    runner.send(Kind.VERDICT, {"run": 1, "ok": True})
    output = _read_to_end([out_r, err_r])
    kind, done = runner.frame()
    os.close(out_r)
    os.close(err_r)

    assert (kind, done["exitCode"], done["fork"]["variables"]) == (Kind.DONE, 0, 1), done
    assert output[out_r] == b"tripped\n" and marker.read_text() == "built"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(frames.encode(Kind.VERDICT, {"run": 1, "ok": False}), id="refused"),
        pytest.param(frames.encode(Kind.VERDICT, {"run": 2, "ok": True}), id="another-runs-verdict"),
        pytest.param(frames.encode(Kind.EXEC, {"run": 2, "code": "print(1)"}), id="an-exec-instead"),
        pytest.param(b"", id="hang-up"),
    ],
)
def test_a_state_not_vouched_for_ends_the_runner_before_anything_of_it_is_built_or_any_code_runs(
    runner: Runner, tmp_path: Path, answer: bytes
) -> None:
    # The answer is sent at once, behind the EXEC: a runner that loaded before reading it would build the tripwire.
    state, size, marker = _tripwire_state(tmp_path)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    code = f"open({str(tmp_path / 'ran')!r}, 'w')"
    runner.send(
        Kind.EXEC, {"run": 1, "code": code, "last": False, "state": size, "verdict": True}, [out_w, err_w, state]
    )
    for fd in (out_w, err_w, state):
        os.close(fd)
    runner.host.sendall(answer)
    returncode, _, _ = runner.hang_up()
    _read_to_end([out_r, err_r])
    os.close(out_r)
    os.close(err_r)

    assert returncode == 77  # EXIT_REFUSED
    assert not marker.exists() and not (tmp_path / "ran").exists()
    assert Kind.DONE not in [kind for kind, _ in runner.rest()]
