"""cli.py: the command's start-up, as the installed ``mcp-sandbox`` command runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# The command as installed (console_main), up to the moment it would serve: anyio.run, which would
# serve, reports the cyclic collector's state instead (on stderr: stdout is the MCP stream's).
_UP_TO_SERVING = """
import gc, sys
import anyio
from mcp_sandbox import cli

anyio.run = lambda *args: print(gc.isenabled(), gc.get_freeze_count(), file=sys.stderr)
sys.argv = ["mcp-sandbox", "serve", "--state-dir", sys.argv[1]]
raise SystemExit(cli.console_main())
"""


def test_a_server_collects_again_before_it_serves_with_its_start_ups_objects_frozen_out(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _UP_TO_SERVING, str(tmp_path / "state")],
        stdin=subprocess.PIPE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    enabled, frozen = done.stderr.split()[-2:]
    # Left off, a server would never collect a cycle; frozen before the MCP SDK's import, it would
    # have collected all along it.
    assert enabled == "True"
    assert int(frozen) > 50_000, "the start-up's imports were not in when the collector came back"
