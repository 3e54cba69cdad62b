"""The earlier code runner's scripts, replayed unchanged against a server given that runner's ``.env``.

Its tools answered with one text item of JSON (``{"success":true,"output":…,"files":[…]}``,
``{"success":true,"message":…,"file":{"name","url"}}``); its users' scripts grep for
``"success":true`` and parse the links out of it. With only that runner's variables set, the
server answers in that shape (the ``runner`` output mode); ``structuredContent`` is as always.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import CALL_BOUND, http_server

from .test_plain_http import RUN_CODE, UPLOAD_FILE

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "runner-token-0123456789abcdef"

# A script as that runner's users wrote them: curl, jq for the text, grep for success, node's
# JSON.parse for the link (as n8n's code node does), then curl again to download it.
SCRIPT = r"""
set -eu
call() {
  curl -sS -X POST "$BASE/mcp" -H "Authorization: Bearer $MCP_API_TOKEN" \
    -H "Content-Type: application/json" -d "$1" | jq -r '.result.content[0].text'
}
uploaded=$(call "$UPLOAD_FILE")
echo "$uploaded" | grep -q '"success":true'
url=$(node -e 'console.log(JSON.parse(process.argv[1]).file.url)' "$uploaded")
curl -sSf "$url" > "$OUT/uploaded.csv"
ran=$(call "$RUN_CODE")
echo "$ran" | grep -q '"success":true'
chart=$(node -e 'console.log(JSON.parse(process.argv[1]).files.find(f => f.name === "chart.png").url)' "$ran")
curl -sSf "$chart" > "$OUT/chart.png"
node -e 'process.stdout.write(JSON.parse(process.argv[1]).output)' "$ran" > "$OUT/output.txt"
"""


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    env = {"MCP_API_TOKEN": TOKEN}  # the runner's .env: no MCP_SANDBOX_OUTPUT_MODE
    async with http_server(module_state_dir, env=env, runtime=sandbox_runtime) as url:
        yield url


async def test_a_runner_script_that_greps_success_and_parses_the_links_works_unchanged(
    base: str, tmp_path: Path
) -> None:
    conversation = f"session-{uuid.uuid4().hex[:8]}"
    env = {
        "PATH": "/usr/bin:/bin",
        "BASE": base,
        "MCP_API_TOKEN": TOKEN,
        "OUT": str(tmp_path),
        "UPLOAD_FILE": UPLOAD_FILE.replace("session-123", conversation),
        "RUN_CODE": RUN_CODE.replace("session-123", conversation),
    }
    with anyio.fail_after(CALL_BOUND * 4):
        done = await anyio.run_process(["bash", "-c", SCRIPT], env=env, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert (tmp_path / "uploaded.csv").read_bytes() == b"name,age\nAlice,30\nBob,25"
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG")
    output = (tmp_path / "output.txt").read_text()
    assert "Chart saved!" in output
    assert "mean" in output


async def _call(base: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
    import httpx2

    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        reply = await web.post(f"{base}/mcp", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 200, reply.text
    result: dict[str, object] = reply.json()["result"]
    return result


async def test_a_failed_run_and_a_refused_upload_say_success_false_with_the_error(base: str) -> None:
    failed = await _call(base, "run_code", {"language": "python", "code": "print('so far')\nraise SystemExit(3)"})
    assert failed["isError"] is True
    text = json.loads(failed["content"][0]["text"])  # type: ignore[index]
    assert text["success"] is False
    assert text["error"]
    assert "so far" in text["output"]
    assert failed["structuredContent"]["exitCode"] == 3  # type: ignore[index]

    refused = await _call(base, "upload_file", {"conversationId": "c1", "filename": "../x", "content": "aGk="})
    assert refused["isError"] is True
    error = json.loads(refused["content"][0]["text"])  # type: ignore[index]
    assert error["success"] is False
    assert error["error"]


async def test_other_output_modes_stay_available_per_call(base: str) -> None:
    compact = await _call(base, "run_code", {"language": "python", "code": "print(6 * 7)", "outputMode": "compact"})
    assert compact["content"][0]["text"] == "42\n"  # type: ignore[index]
