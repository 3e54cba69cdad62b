"""The conformance suite's attacks that make sense for JavaScript, run from TypeScript on each runtime.

Parametrized over backends and sandbox kinds (as the whole suite: a warm JavaScript run is a
pre-started sandbox's on every backend) and over the JavaScript runtimes (bun, deno), skipped
with a reason where one is not installed. The sandbox is the same as Python's; these
attacks check that nothing of it is lost to the runtime: network, filesystem, privileges,
processes, limits, output and the host channel. Attack code reports what happened as one JSON
object on its last stdout line (see :data:`PRELUDE`).
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.config import JS_RUNTIMES, load_settings
from mcp_sandbox.engine import ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.runtimes import js_binary

from .harness import RunnerFactory, SandboxRunner, wait_until_gone

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# Runs before each attack. `outcome` turns an attempt into "ok" or its error code (EACCES, ...);
# `syscall` makes a raw system call through the runtime's FFI and gives "ok <result>" or the errno.
PRELUDE = """\
import * as fs from "node:fs";
import * as net from "node:net";
import * as cp from "node:child_process";
const report: Record<string, unknown> = {};
const isDeno = typeof (globalThis as any).Deno !== "undefined";
function outcome(action: () => unknown): string {
  try { action(); return "ok"; } catch (error: any) { return String(error?.code ?? error?.name ?? error); }
}
async function outcomeAsync(action: () => Promise<unknown>): Promise<string> {
  try { await action(); return "ok"; } catch (error: any) { return String(error?.code ?? error?.name ?? error); }
}
const libc: any = isDeno
  ? (globalThis as any).Deno.dlopen("libc.so.6", {
      syscall: { parameters: ["i64", "i64", "i64", "i64"], result: "i64" },
      __errno_location: { parameters: [], result: "pointer" },
    }).symbols
  : (await import("bun:ffi" as string)).dlopen("libc.so.6", {
      syscall: { args: ["i64", "i64", "i64", "i64"], returns: "i64" },
      __errno_location: { args: [], returns: "ptr" },
    }).symbols;
const errnoNames: Record<number, string> = { 1: "EPERM", 13: "EACCES", 22: "EINVAL", 38: "ENOSYS", 97: "EAFNOSUPPORT" };
async function errno(): Promise<number> {
  const where = libc.__errno_location();
  if (isDeno) return new (globalThis as any).Deno.UnsafePointerView(where).getInt32();
  return (await import("bun:ffi" as string)).read.i32(where, 0);
}
// The runtime's own work between two FFI calls can overwrite errno (Deno once gave ENOENT for a
// socket() that seccomp refused), so a failure whose errno is not one we expect is tried again.
async function syscall(number: number, ...args: number[]): Promise<string> {
  const padded = [...args, 0, 0, 0].slice(0, 3).map((value) => BigInt(value));
  let code = 0;
  for (let attempt = 0; attempt < 3; attempt++) {
    const result = Number(libc.syscall(BigInt(number), ...padded));
    if (result !== -1) return `ok ${result}`;
    code = await errno();
    if (code in errnoNames) return errnoNames[code];
  }
  return String(code);
}
"""
_POSTLUDE = "\nconsole.log(JSON.stringify(report));\n"


@pytest.fixture(params=JS_RUNTIMES)
def js_runtime(request: pytest.FixtureRequest) -> str:
    runtime: str = request.param
    binary = js_binary(load_settings(env={}, flags={}).paths, runtime)
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{runtime} is not installed at {binary}: run `make runtime`")
    return runtime


@pytest.fixture
def js_sandbox(make_sandbox: RunnerFactory, js_runtime: str) -> SandboxRunner:
    return make_sandbox(js_runtime=js_runtime)


async def run_js(
    sandbox: SandboxRunner,
    code: str,
    *,
    time_limit: float = 10.0,
    workspace: Path | None = None,
    language: str = "typescript",
) -> ExecutionResult:
    request = ExecutionRequest(
        code=PRELUDE + textwrap.dedent(code) + _POSTLUDE, timeout=time_limit, workspace=workspace, language=language
    )
    return await sandbox.execute(request)


async def report_js(sandbox: SandboxRunner, code: str, **options: Any) -> dict[str, Any]:
    result = await run_js(sandbox, code, **options)
    assert result.status == "success", f"{result.status}: {result.error}\n{result.stderr}"
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


# --- network ---------------------------------------------------------------------------------


async def test_tcp_connect_to_a_host_listener_fails_and_nothing_arrives(js_sandbox: SandboxRunner) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        report = await report_js(
            js_sandbox,
            f"""
            report.tcp = await new Promise<string>((resolve) => {{
              const s = net.connect({port}, "127.0.0.1");
              s.on("connect", () => resolve("ok"));
              s.on("error", (e: any) => resolve(String(e.code ?? e.name)));
            }});
            report.fetch = await outcomeAsync(() => fetch("http://127.0.0.1:{port}/"));
            """,
        )
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert report["tcp"] != "ok"
    assert report["fetch"] != "ok"


async def test_non_unix_sockets_cannot_be_created(js_sandbox: SandboxRunner) -> None:
    report = await report_js(
        js_sandbox,
        """
        report.inet = await syscall(41, 2, 1, 0);   // socket(AF_INET, SOCK_STREAM)
        report.inet6 = await syscall(41, 10, 2, 0); // socket(AF_INET6, SOCK_DGRAM)
        report.netlink = await syscall(41, 16, 3, 0);
        report.unix = (await syscall(41, 1, 1, 0)).split(" ")[0];
        """,
    )
    assert {report["inet"], report["inet6"], report["netlink"]} <= {"EACCES", "EPERM", "EAFNOSUPPORT"}
    assert report["unix"] == "ok"


# --- filesystem ------------------------------------------------------------------------------


async def test_system_directories_and_the_runtime_are_read_only(js_sandbox: SandboxRunner) -> None:
    report = await report_js(
        js_sandbox,
        """
        for (const path of ["/usr/x", "/etc/x", "/x", "/opt/mcp-sandbox/typescript/runner.ts", "/opt/x"]) {
          report[path] = outcome(() => fs.writeFileSync(path, "x"));
        }
        const runtime = isDeno ? "deno" : "bun";
        report.binary = outcome(() => fs.appendFileSync(`/opt/mcp-sandbox/${runtime}/${runtime}`, "x"));
        report.shadow = outcome(() => fs.readFileSync("/etc/shadow"));
        report.root = outcome(() => fs.readdirSync("/root"));
        """,
    )
    assert all(report[path] in {"EROFS", "EACCES", "ENOENT", "PermissionDenied", "NotCapable"} for path in report), (
        report
    )
    assert "ok" not in report.values()


async def test_workspace_and_tmp_are_writable_and_tmp_is_capped(make_sandbox: RunnerFactory, js_runtime: str) -> None:
    sandbox = make_sandbox(js_runtime=js_runtime, tmp_size="16m")
    report = await report_js(
        sandbox,
        """
        report.workspace = outcome(() => fs.writeFileSync("/workspace/a.txt", "a"));
        report.data = fs.readFileSync("/data/a.txt", "utf8");
        const chunk = new Uint8Array(1 << 20);
        report.tmp = outcome(() => { for (let i = 0; i < 64; i++) fs.appendFileSync("/tmp/fill", chunk); });
        report.tmpSize = fs.statSync("/tmp/fill").size;
        """,
    )
    assert (report["workspace"], report["data"]) == ("ok", "a")
    assert report["tmp"] == "ENOSPC"
    assert report["tmpSize"] <= 16 << 20


async def test_file_size_is_limited(make_sandbox: RunnerFactory, js_runtime: str, state_root: Path) -> None:
    sandbox = make_sandbox(js_runtime=js_runtime, max_file_size="4m")
    workspace = state_root / "ws"
    workspace.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(workspace, sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    result = await run_js(sandbox, "fs.writeFileSync('/workspace/big', new Uint8Array(16 << 20));", workspace=workspace)
    assert result.status == "error"  # EFBIG, or SIGXFSZ for a runtime that does not ignore it
    assert (workspace / "big").stat().st_size <= 4 << 20


async def test_the_servers_environment_does_not_leak(
    js_sandbox: SandboxRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_SANDBOX_TEST_SECRET", "leaked-secret-value")
    report = await report_js(
        js_sandbox,
        """
        report.env = Object.keys(process.env).sort();
        report.environ1 = outcome(() => fs.readFileSync("/proc/1/environ", "utf8"));
        try {
          report.proc = fs.readdirSync("/proc").filter((name) => /^\\d+$/.test(name)).length;
        } catch (error: any) {
          report.proc = String(error?.code ?? error?.name);  // deno's own permissions: /proc needs --allow-all
        }
        """,
    )
    assert "MCP_SANDBOX_TEST_SECRET" not in report["env"]
    assert "leaked-secret-value" not in json.dumps(report)
    # Its own pid namespace: a handful of processes, not the host's.
    assert report["proc"] == "NotCapable" or report["proc"] < 10


# --- privileges ------------------------------------------------------------------------------


async def test_code_runs_unprivileged_without_capabilities_under_seccomp(
    js_sandbox: SandboxRunner, sandbox_ids: tuple[int, int]
) -> None:
    report = await report_js(
        js_sandbox,
        """
        report.uid = process.getuid?.();
        // Through cat, which inherits all of it: deno's own permissions keep /proc from the code.
        report.status = cp.execFileSync("/bin/cat", ["/proc/self/status"]).toString().split("\\n")
          .filter((line) => /^(Uid|CapEff|CapPrm|NoNewPrivs|Seccomp):/.test(line));
        report.shell = cp.execFileSync("/bin/sh", ["-c", "id -u"]).toString().trim();
        """,
    )
    status = {line.split(":")[0]: line.split(":", 1)[1].split() for line in report["status"]}
    uid = sandbox_ids[0]
    assert report["uid"] == uid and report["shell"] == str(uid)
    assert status["Uid"] == [str(uid)] * 4
    assert status["CapEff"] == ["0000000000000000"] and status["CapPrm"] == ["0000000000000000"]
    assert status["NoNewPrivs"] == ["1"] and status["Seccomp"] == ["2"]


async def test_dangerous_syscalls_are_denied(js_sandbox: SandboxRunner, backend_name: str) -> None:
    report = await report_js(
        js_sandbox,
        """
        report.unshare = await syscall(272, 0x10000000);  // unshare(CLONE_NEWUSER)
        report.mount = await syscall(165, 0, 0, 0);
        report.ptrace = await syscall(101, 16, 1, 0);       // PTRACE_ATTACH to pid 1
        report.setuid = await syscall(105, 0);
        report.bpf = await syscall(321, 0, 0, 0);
        report.keyctl = await syscall(250, 0, 0, 0);
        """,
    )
    # bwrap: uid 0 is not mapped in the sandbox's user namespace; a container: no CAP_SETUID.
    assert report["setuid"] == ("EINVAL" if backend_name == "bwrap" else "EPERM")
    del report["setuid"]
    assert all(value in {"EPERM", "ENOSYS", "EACCES"} for value in report.values()), report


# --- processes -------------------------------------------------------------------------------


async def test_a_detached_child_does_not_outlive_the_run(js_sandbox: SandboxRunner) -> None:
    marker = f"jsorphan{uuid.uuid4().hex[:12]}"
    result = await run_js(
        js_sandbox,
        f"""
        const child = cp.spawn("/bin/sh", ["-c", "sleep 300; : {marker}"], {{ detached: true, stdio: "ignore" }});
        child.unref();
        report.pid = child.pid;
        """,
    )
    assert result.status == "success", result.stderr
    assert await wait_until_gone(marker) == []


async def test_host_processes_cannot_be_signalled(js_sandbox: SandboxRunner) -> None:
    report = await report_js(
        js_sandbox,
        f"""
        report.host = outcome(() => process.kill({os.getpid()}, 0));
        """,
    )
    assert report["host"] == "ESRCH"


async def test_a_process_bomb_hits_the_pids_limit(make_sandbox: RunnerFactory, js_runtime: str) -> None:
    sandbox = make_sandbox(js_runtime=js_runtime, pids=32)
    result = await run_js(
        sandbox,
        """
        let started = 0;
        let failure = "none";
        const children: any[] = [];
        for (let i = 0; i < 200 && failure === "none"; i++) {
          try {
            const child = cp.spawn("/bin/sleep", ["60"], { stdio: "ignore" });
            const error = await new Promise<string | null>((resolve) => {
              child.once("spawn", () => resolve(null));
              child.once("error", (e: any) => resolve(String(e.code ?? e.name)));
            });
            if (error !== null) failure = error; else { started++; children.push(child); }
          } catch (e: any) {
            failure = String(e.code ?? e.name);
          }
        }
        for (const child of children) child.kill("SIGKILL");
        report.started = started;
        report.failure = failure;
        """,
        time_limit=30,
    )
    # The engine says the limit was reached; the runtime either reports the failed spawn or dies of
    # it (bun aborts when it cannot start a thread).
    assert result.status == "error"
    assert result.error is not None and "process limit of 32 reached" in result.error
    if result.stdout.strip():  # the runtime survived to report
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["failure"] != "none" and report["started"] < 32


# --- limits ----------------------------------------------------------------------------------


async def test_a_cpu_spin_times_out_within_its_bound(js_sandbox: SandboxRunner) -> None:
    started = time.monotonic()
    result = await run_js(js_sandbox, "for (;;) {}", time_limit=2)
    assert result.status == "timeout"
    assert time.monotonic() - started < 2 + 5


async def test_a_memory_bomb_is_killed(make_sandbox: RunnerFactory, js_runtime: str) -> None:
    sandbox = make_sandbox(js_runtime=js_runtime, memory="128m")
    result = await run_js(
        sandbox,
        "const hog: Uint8Array[] = []; for (let i = 0; i < 64; i++) hog.push(new Uint8Array(64 << 20).fill(1));",
        time_limit=30,
    )
    assert result.status == "error"
    assert result.exit_code != 0


# --- output and the channel -------------------------------------------------------------------


async def test_a_stdout_flood_is_truncated_near_the_cap(make_sandbox: RunnerFactory, js_runtime: str) -> None:
    sandbox = make_sandbox(js_runtime=js_runtime, max_output="64k")
    result = await run_js(sandbox, "const s = 'y'.repeat(1 << 16); for (let i = 0; i < 256; i++) console.log(s);")
    assert result.truncated
    assert len(result.stdout.encode()) <= (64 << 10) + 1024


_FRAME = """
const channel = fs.readdirSync("/proc/self/fd").map(Number)
  .find((fd) => { try { return fs.fstatSync(fd).isSocket(); } catch { return false; } });
function frame(kind: number, body: object): Uint8Array {
  const payload = new TextEncoder().encode(JSON.stringify(body));
  const out = new Uint8Array(10 + payload.length);
  out.set([0x4d, 0x53, 0x42, 0x58, 2, kind], 0);
  new DataView(out.buffer).setUint32(6, payload.length);
  out.set(payload, 10);
  return out;
}
"""


async def test_garbage_on_the_channel_ends_the_run_without_hurting_the_host(js_sandbox: SandboxRunner) -> None:
    result = await run_js(js_sandbox, _FRAME + "fs.writeSync(channel!, 'garbage garbage garbage');")
    assert result.status == "error"
    after = await run_js(js_sandbox, "report.ok = 1;")
    assert after.status == "success"


async def test_a_forged_done_frame_does_not_make_a_failed_run_a_success(js_sandbox: SandboxRunner) -> None:
    result = await run_js(
        js_sandbox, _FRAME + "fs.writeSync(channel!, frame(3, { run: 1, exitCode: 0 }));\nthrow new Error('failed');"
    )
    # As for Python: the host judges by the process's end, never by a frame's claim (the run may
    # also be ended at once for the forged frame, hence any failing exit code).
    assert result.status == "error"
    assert result.exit_code not in (0, None)
