"""TypeScript and JavaScript runs on each installed runtime (bun, deno): results, errors, limits, files.

Every run is a real bwrap sandbox running the runner under src/mcp_sandbox/runners/typescript.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mcp_sandbox.config import JS_RUNTIMES, load_settings
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.result import EXIT_TIMEOUT
from mcp_sandbox.engine.runtimes import js_binary, js_policy
from mcp_sandbox.provision.bundles import BUNDLES, ENTRIES, build_bundles, current_bundle
from mcp_sandbox.runners import RUNTIME_MOUNT, runner_dir

from .conftest import EngineFactory
from .helpers import HOST_BOUND, execute

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]


@pytest.fixture(params=JS_RUNTIMES)
def js_runtime(request: pytest.FixtureRequest) -> str:
    runtime: str = request.param
    binary = js_binary(load_settings(env={}, flags={}).paths, runtime)
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{runtime} is not installed at {binary}: run `make runtime`")
    return runtime


@pytest.fixture
def js_engine(make_engine: EngineFactory, js_runtime: str) -> Engine:
    return make_engine(js_runtime=js_runtime)


async def test_typescript_runs_with_its_types_and_top_level_await(js_engine: Engine) -> None:
    result = await execute(
        js_engine,
        """
        interface Point { x: number; y: number }
        const p: Point = { x: 40, y: 2 };
        const total: number = await Promise.resolve(p.x + p.y);
        console.log(`total ${total}`);
        console.error("to stderr");
        """,
        language="typescript",
    )
    assert (result.status, result.exit_code) == ("success", 0), result
    assert (result.stdout, result.stderr) == ("total 42\n", "to stderr\n")


async def test_javascript_runs_and_its_timers_finish_before_the_run_ends(js_engine: Engine) -> None:
    result = await execute(
        js_engine,
        """
        setTimeout(() => console.log("timer fired"), 50);
        async function main() { await new Promise((r) => setTimeout(r, 20)); console.log("main done"); }
        main();
        console.log("top level done");
        """,
        language="javascript",
    )
    assert result.status == "success", result
    assert result.stdout == "top level done\nmain done\ntimer fired\n"


async def test_an_uncaught_exception_is_exit_code_1_with_the_users_line_numbers(js_engine: Engine) -> None:
    result = await execute(
        js_engine,
        """
        const a: number = 1;
        function fail(): never {
          throw new Error("boom from line 4");
        }
        fail();
        """,
        language="typescript",
    )
    assert (result.status, result.exit_code) == ("error", 1)
    assert "Error: boom from line 4" in result.stderr
    # The submitted source starts with a newline: the throw is on its line 4.
    assert "main.ts:4:" in result.stderr, result.stderr
    assert "/opt/mcp-sandbox/typescript" not in result.stderr  # the runner's own frames are trimmed


async def test_the_runner_runs_the_same_bundled_by_setup_and_from_its_sources(
    make_engine: EngineFactory, js_runtime: str, state_dir: Path
) -> None:
    """Setup bundles the runner into one file per runtime; without a current bundle a sandbox runs its sources."""
    installed = load_settings(env={}, flags={"js_runtime": js_runtime}).paths.js_runtime_dir
    runtime_dir = state_dir.parent / "js"  # the same runtimes, without the bundles setup built
    runtime_dir.mkdir()
    runtime_dir.chmod(0o755)
    (runtime_dir / "node_modules").symlink_to(installed / "node_modules")
    code = "const n: number = 6 * 7; console.log(n); await import('node:fs'); throw new Error('line 1');"
    entries = []
    for bundled in (False, True):
        engine = make_engine(js_runtime=js_runtime, js_runtime_dir=str(runtime_dir))
        if bundled:
            (built,) = [
                path for path in build_bundles(engine.settings.paths, log=lambda _: None) if js_runtime in path.name
            ]
            assert current_bundle(engine.settings.paths, engine.settings.sandbox) == built
        else:
            assert current_bundle(engine.settings.paths, engine.settings.sandbox) is None
        policy = js_policy(engine.settings, language="typescript", workspace=None, timeout=5)
        entries.append(policy.command[-2])
        source = {mount.target: mount.source for mount in policy.mounts}[RUNTIME_MOUNT + "/typescript"]
        assert source == (built if bundled else runner_dir("typescript"))
        result = await execute(engine, code, language="typescript")
        assert (result.status, result.exit_code, result.stdout) == ("error", 1, "42\n"), result
        assert "Error: line 1" in result.stderr and "main.ts:1:" in result.stderr, result.stderr
        assert "/opt/mcp-sandbox/typescript" not in result.stderr  # the runner's frames are trimmed, bundled too
    assert entries == [
        f"{RUNTIME_MOUNT}/typescript/{ENTRIES[js_runtime]}",
        f"{RUNTIME_MOUNT}/typescript/{BUNDLES[js_runtime]}",
    ]


async def test_an_unhandled_rejection_is_an_error(js_engine: Engine) -> None:
    result = await execute(js_engine, "Promise.reject(new TypeError('rejected'));", language="javascript")
    assert (result.status, result.exit_code) == ("error", 1)
    assert "TypeError: rejected" in result.stderr


async def test_process_exit_gives_its_code_and_keeps_the_output_before_it(js_engine: Engine) -> None:
    result = await execute(
        js_engine, "console.log('before'); process.exit(7); console.log('after');", language="javascript"
    )
    assert (result.status, result.exit_code, result.stdout) == ("error", 7, "before\n")
    zero = await execute(js_engine, "process.exitCode = 0; console.log('fine')", language="javascript")
    assert (zero.status, zero.exit_code) == ("success", 0)
    set_code = await execute(js_engine, "process.exitCode = 5; console.log('ends')", language="javascript")
    assert (set_code.status, set_code.exit_code, set_code.stdout) == ("error", 5, "ends\n")
    imported = await execute(js_engine, "import process from 'node:process';\nprocess.exit(3);", language="typescript")
    assert (imported.status, imported.exit_code) == ("error", 3)


async def test_a_syntax_error_is_an_error(js_engine: Engine) -> None:
    result = await execute(js_engine, "const x: number = ;\n", language="typescript")
    assert (result.status, result.exit_code) == ("error", 1)
    assert result.stderr.strip()


async def test_an_endless_loop_times_out_and_is_killed(js_engine: Engine) -> None:
    started = time.monotonic()
    result = await execute(js_engine, "console.log('spinning'); for (;;) {}", language="javascript", time_limit=2)
    assert (result.status, result.exit_code) == ("timeout", EXIT_TIMEOUT)
    assert result.stdout == "spinning\n"
    assert time.monotonic() - started < 2 + HOST_BOUND / 4


async def test_huge_output_is_capped_and_marked_truncated(js_engine: Engine) -> None:
    result = await execute(
        js_engine,
        "const line = 'x'.repeat(1023) + '\\n'; for (let i = 0; i < 4096; i++) process.stdout.write(line);",
        language="javascript",
    )
    assert result.status == "success", result.error
    assert result.truncated
    assert 0 < len(result.stdout.encode()) <= js_engine.settings.limits.max_output + 1024


async def test_a_memory_hog_is_stopped_by_the_limit(make_engine: EngineFactory, js_runtime: str) -> None:
    engine = make_engine(js_runtime=js_runtime, memory="128m")
    result = await execute(
        engine,
        """
        const hog: number[][] = [];
        for (let i = 0; i < 4096; i++) hog.push(new Array(1 << 17).fill(i));  // ~4 GiB of heap
        console.log("survived", hog.length);
        """,
        language="typescript",
        time_limit=30,
    )
    assert result.status == "error", result
    assert "survived" not in result.stdout


async def test_code_that_does_not_fit_in_tmp_fails_saying_why(make_engine: EngineFactory, js_runtime: str) -> None:
    engine = make_engine(js_runtime=js_runtime, tmp_size="1m")
    code = "// " + "x" * (2 << 20) + "\nconsole.log('ran')\n"
    result = await execute(engine, code, language="typescript")
    assert result.status == "error", result
    assert "ran" not in result.stdout
    assert "cannot write the code to /tmp/.mcp-sandbox/main.ts" in result.stderr
    assert ("ENOSPC" if js_runtime == "bun" else "No space left on device") in result.stderr


async def test_environment_and_workspace_reach_the_code(js_engine: Engine, state_dir: Path) -> None:
    workspace = state_dir.parent / "ws"
    workspace.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(workspace, js_engine.settings.sandbox.sandbox_uid, js_engine.settings.sandbox.sandbox_gid)
    result = await execute(
        js_engine,
        """
        import { readdirSync, writeFileSync } from "node:fs";
        writeFileSync("/workspace/out.txt", `greeting=${process.env.GREETING} cwd=${process.cwd()}`);
        console.log(readdirSync("/data").join(","));
        """,
        language="typescript",
        environment={"GREETING": "héllo"},
        workspace=workspace,
    )
    assert result.status == "success", result
    assert result.stdout == "out.txt\n"
    assert (workspace / "out.txt").read_text() == "greeting=héllo cwd=/workspace"


async def test_a_conversations_javascript_runs_share_files_but_not_variables(
    make_engine: EngineFactory, js_runtime: str, state_dir: Path
) -> None:
    workspace = state_dir.parent / "conversation"
    workspace.mkdir(mode=0o700)
    async with make_engine(js_runtime=js_runtime).running() as engine:
        if os.geteuid() == 0:
            os.chown(workspace, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
        first = await execute(
            engine,
            "import { writeFileSync } from 'node:fs';\n"
            "(globalThis as any).kept = 1;\nwriteFileSync('/workspace/a.txt', 'A');",
            language="typescript",
            session="c",
            workspace=workspace,
        )
        second = await execute(
            engine,
            "import { readFileSync } from 'node:fs';\n"
            "console.log(typeof (globalThis as any).kept, readFileSync('/workspace/a.txt', 'utf8'));",
            language="typescript",
            session="c",
            workspace=workspace,
        )
    assert first.status == "success", first
    assert (second.status, second.stdout, second.session) == ("success", "undefined A\n", None)
