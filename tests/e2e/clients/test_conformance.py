"""The official MCP conformance suite against a real `mcp-sandbox serve --transport http`.

`@modelcontextprotocol/conformance` (pinned in conformance/package-lock.json, installed by
`make conformance-tools`) drives our Streamable HTTP endpoint at /mcp once per spec version: the
handshake era (2025-11-25) and the stateless revision (2026-07-28). Its scenarios also call
fixture tools, resources and prompts by fixed names, which we do not serve; those checks, and
only those, are listed in conformance/expected-failures.yaml. The suite fails the run on any
other failure and on a baseline entry that has started to pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import CONFORMANCE_JS, conformance_node, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

BASELINE = Path(__file__).resolve().parents[3] / "conformance" / "expected-failures.yaml"
SPEC_VERSIONS = ("2025-11-25", "2026-07-28")
# One run takes seconds; each scenario has the suite's own 30 s timeout on top.
RUN_BOUND = 300.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def node() -> Path:
    return conformance_node()


@pytest.fixture(scope="module")
async def server_url(node: Path, module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    async with http_server(module_state_dir, runtime=sandbox_runtime) as url:
        yield url


def _failing_checks(output_dir: Path) -> str:
    """One line per failing or warning check the suite wrote (<output_dir>/*/checks.json)."""
    lines = [
        f"{checks.parent.name} | {check['id']} | {check['status']} | {check.get('errorMessage', '')}"
        for checks in sorted(output_dir.glob("*/checks.json"))
        for check in json.loads(checks.read_text(encoding="utf-8"))
        if check.get("status") in ("FAILURE", "WARNING")
    ]
    return "\n".join(lines)


@pytest.mark.parametrize("spec_version", SPEC_VERSIONS)
async def test_the_server_passes_the_conformance_suite_except_for_the_fixtures_it_does_not_serve(
    node: Path, server_url: str, spec_version: str, tmp_path: Path
) -> None:
    output_dir = tmp_path / "results"
    command = [
        str(node),
        str(CONFORMANCE_JS),
        "server",
        "--url",
        f"{server_url}/mcp",
        "--spec-version",
        spec_version,
        "--expected-failures",
        str(BASELINE),
        "--output-dir",
        str(output_dir),
    ]
    with anyio.fail_after(RUN_BOUND):
        run = await anyio.run_process(command, check=False, cwd=tmp_path)
    output = _ANSI.sub("", run.stdout.decode(errors="replace"))
    # The totals and the baseline's verdict (expected, unexpected, stale) close the output.
    verdict = output[output.rfind("Total:") :]
    returncode = run.returncode  # a local: asserting on run would print its whole repr, output and all
    assert returncode == 0, (
        f"{verdict}\n{run.stderr.decode(errors='replace')[-4000:]}\nfailing checks:\n{_failing_checks(output_dir)}"
    )
    # A run that matched no scenario would pass too: the core ones must have run.
    ran = {checks.parent.name for checks in output_dir.glob("*/checks.json")}
    assert any(name.startswith("server-tools-list-") for name in ran), output
