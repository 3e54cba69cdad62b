"""CPU of one start of the TypeScript runner, per runtime (bun, deno), without a sandbox around it.

A pre-started JavaScript sandbox serves one run and is replaced, so back to back on 2 cores its
whole start is paid for every run, and the runtime's share of it is the largest. This measures
that share alone: the runtime runs the runner as a sandbox would (the same command, environment
and bundle, with the sandbox's paths mapped to the host's), says READY on a socketpair, gets one
EXEC of a small TypeScript program with its stdout and stderr pipes, runs it and exits; the CPU
(user + system, all threads) and minor page faults are the child's own, from ``wait4``.

Peers, measured in the same run: the runtime on an empty file (its start and exit, nothing else)
and on the same program as a file (``bun run hello.ts``: what the code alone costs).

The code's directory (``/tmp/.mcp-sandbox``) is the host's here, shared by the runs; nothing else
is written. Medians and p95 of CPU ms per start; nothing is asserted.

Run: `.venv/bin/python bench/runner_cpu.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import array
import os
import resource
import socket
import statistics
import subprocess
import tempfile
from pathlib import Path

from mcp_sandbox import load_settings
from mcp_sandbox.config import JS_RUNTIMES, EngineSettings, Settings
from mcp_sandbox.engine.runtimes import js_binary, js_policy
from mcp_sandbox.runners.python.mcp_sandbox_runtime.wire import Kind, encode

_TS = "const n: number = 6 * 7;\nconsole.log(n);\n"


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _cost(usage: resource.struct_rusage) -> tuple[float, int]:
    return (usage.ru_utime + usage.ru_stime) * 1000, usage.ru_minflt


def _host_command(settings: Settings) -> tuple[list[str], dict[str, str]]:
    """The runner's command and environment as a sandbox gets them, its paths mapped to the host's."""
    policy = js_policy(EngineSettings.of(settings), language="typescript", workspace=None, timeout=30)
    targets = sorted(policy.mounts, key=lambda mount: len(mount.target), reverse=True)

    def host(argument: str) -> str:  # the runtime's and the runner's mounts, under /opt/mcp-sandbox
        for mount in targets:
            if mount.target.startswith("/opt/") and f"{mount.target}/" in argument:
                return argument.replace(f"{mount.target}/", f"{mount.source}/", 1)
        return argument

    return [host(argument) for argument in policy.command], dict(policy.environment)


def _runner_start(command: list[str], environment: dict[str, str]) -> tuple[float, int]:
    host_end, sandbox_end = socket.socketpair()
    with host_end:
        process = subprocess.Popen(
            [*command, str(sandbox_end.fileno())],
            pass_fds=[sandbox_end.fileno()],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        sandbox_end.close()
        if not host_end.recv(65536):
            raise RuntimeError(f"the runner said nothing: {command}")
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        exec_frame = encode(Kind.EXEC, {"run": 1, "code": _TS, "servers": [], "env": {}})
        fds = array.array("i", [out_write, err_write])
        host_end.sendmsg([exec_frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        os.close(out_write)
        os.close(err_write)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        output = os.read(out_read, 1024)
        errors = os.read(err_read, 4096)
        os.close(out_read)
        os.close(err_read)
    if process.returncode != 0 or output != b"42\n":
        raise RuntimeError(f"the runner's run failed ({process.returncode}): {output!r} {errors!r}")
    return _cost(usage)


def _plain_start(command: list[str], environment: dict[str, str]) -> tuple[float, int]:
    process = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{command} exited with {process.returncode}")
    return _cost(usage)


def _row(name: str, samples: list[tuple[float, int]]) -> float:
    cpu = [sample[0] for sample in samples]
    faults = statistics.median(sample[1] for sample in samples)
    median = statistics.median(cpu)
    print(f"  {name:<44} {median:7.2f} {_p95(cpu):7.2f}   {faults:6.0f}")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    runs = parser.parse_args().runs
    print(f"{'CPU per start (ms)':<46} {'median':>7} {'p95':>7}   minor faults  (n={runs})")
    for runtime in JS_RUNTIMES:
        settings = load_settings(env={}, flags={"js_runtime": runtime})
        if not os.access(js_binary(settings.paths, runtime), os.X_OK):
            print(f"{runtime}: not installed at {js_binary(settings.paths, runtime)} (make runtime)")
            continue
        command, environment = _host_command(settings)
        entry = next(argument for argument in command if argument.endswith((".js", ".ts")))
        bundled = entry.endswith(".js")
        with tempfile.TemporaryDirectory() as scratch:
            empty, hello = Path(scratch) / "empty.js", Path(scratch) / "hello.ts"
            empty.write_text("")
            hello.write_text(_TS)
            binary = command[0]
            quiet = ["--quiet"] if runtime == "deno" else []
            base = {**environment, "HOME": scratch, "DENO_DIR": f"{scratch}/deno"}
            peers = {"empty": [binary, "run", *quiet, str(empty)], "hello": [binary, "run", *quiet, str(hello)]}
            samples: dict[str, list[tuple[float, int]]] = {"runner": [], "empty": [], "hello": []}
            for _ in range(runs):  # interleaved, so that drift hits all three alike
                samples["runner"].append(_runner_start(command, environment))
                for name, peer in peers.items():
                    samples[name].append(_plain_start(peer, base))
        print(f"{runtime} ({'bundled runner' if bundled else 'runner from its sources: no current bundle'})")
        runner = _row("runner: READY, one EXEC, exit", samples["runner"])
        empty_cpu = _row(f"peer: {runtime} run empty.js", samples["empty"])
        hello_cpu = _row(f"peer: {runtime} run hello.ts", samples["hello"])
        print(f"  runner / empty {runner / empty_cpu:.2f}x (+{runner - empty_cpu:.2f} ms), "
              f"runner / hello {runner / hello_cpu:.2f}x (+{runner - hello_cpu:.2f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
