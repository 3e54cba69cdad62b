"""The earlier code runner's libraries import in the sandbox: psycopg2 (Python); postgres, pg,
csv-parser, papaparse (TypeScript on bun). They matter once a run is granted network; here they
load, parse, and fail to connect cleanly (no network).

The runtimes are the ones `make runtime` builds (``.runtime/python``, ``.runtime/js``), or those
under ``$MCP_SANDBOX_TEST_RUNTIMES`` (``python/`` and ``js/``) when a change to their pins is
tested before the repository's are rebuilt.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from mcp_test_helpers import run_python, stdio_client, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

_ROOT = Path(os.environ.get("MCP_SANDBOX_TEST_RUNTIMES") or Path(__file__).resolve().parents[3] / ".runtime")


@pytest.fixture
def environment() -> dict[str, str]:
    return {"MCP_SANDBOX_DISCOVER_SERVERS": "false", "MCP_SANDBOX_JS_RUNTIME_DIR": str(_ROOT / "js")}


async def test_psycopg2_imports_and_fails_to_connect_without_network(
    state_dir: Path, environment: dict[str, str]
) -> None:
    code = """
        import psycopg2
        print(psycopg2.__version__.split()[0])
        try:
            psycopg2.connect(host="127.0.0.1", port=5432, user="u", dbname="d", connect_timeout=2)
        except psycopg2.OperationalError as error:
            print("OperationalError")
    """
    async with stdio_client(state_dir, _ROOT / "python", environment=environment) as client:
        data = structured(await run_python(client, {"code": textwrap.dedent(code)}))
    assert data["status"] == "success", data
    version, outcome = data["stdout"].split()
    assert version.startswith("2.9")
    assert outcome == "OperationalError"


TYPESCRIPT = """
import postgres from "postgres";
import pg from "pg";
import csv from "csv-parser";
import Papa from "papaparse";
import { Readable } from "node:stream";

const parsed = Papa.parse("name,age\\nAlice,30", { header: true });
console.log(JSON.stringify(parsed.data));
const rows: unknown[] = [];
await new Promise((resolve) =>
  Readable.from(["x,y\\n3,4\\n"]).pipe(csv()).on("data", (row) => rows.push(row)).on("end", resolve),
);
console.log(JSON.stringify(rows));
console.log(typeof postgres, typeof pg.Client, typeof pg.Pool);
"""


async def test_the_typescript_runtime_imports_the_earlier_runners_packages(
    state_dir: Path, environment: dict[str, str]
) -> None:
    async with stdio_client(state_dir, _ROOT / "python", environment=environment) as client:
        ran = structured(await client.call_tool("run_code", {"code": TYPESCRIPT, "language": "typescript"}))
        runners = structured(await client.call_tool("list_runners", {}))
    assert ran["status"] == "success", ran
    assert ran["stdout"].splitlines() == [
        '[{"name":"Alice","age":"30"}]',
        '[{"x":"3","y":"4"}]',
        "function function function",
    ]
    typescript = next(r for r in runners["runners"] if r["language"] == "typescript")
    assert {"postgres", "pg", "csv-parser", "papaparse"} <= {p["name"] for p in typescript["packages"]}
