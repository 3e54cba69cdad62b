"""The stdio transport to a downstream server: how leaving it stops the server."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.bridge.stdio import EXIT_GRACE, stdio_transport

from .test_clients import exists

pytestmark = pytest.mark.anyio

# Ignores the end of its stdin and SIGTERM: only the SIGKILL after the grace ends it.
_STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"


@pytest.mark.slow
async def test_a_server_killed_on_leaving_is_reaped_before_the_transport_returns(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os; open({str(pid_file)!r}, 'w').write(str(os.getpid())); " + _STUBBORN
    with anyio.fail_after(EXIT_GRACE * 3 + 10):
        async with stdio_transport(sys.executable, ["-c", code], {}, None, max_message_bytes=1 << 20, on_break=print):
            while not pid_file.exists() or not pid_file.read_text():  # noqa: ASYNC110 - no event to wait on
                await anyio.sleep(0.02)
        pid = int(pid_file.read_text())
        # Reaped, not a zombie nor a process object collected while "running" (asyncio warns then).
        assert not exists(pid)
