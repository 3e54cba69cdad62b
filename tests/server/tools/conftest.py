"""The whole service in memory on the backend test double: the client the tool-level tests share."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from doubles.sandbox import PlainProcessBackend
from mcp_test_helpers import memory_client


@pytest.fixture(scope="module")
async def client(module_state_dir: Path) -> AsyncIterator[Client]:
    """One server per module (the tests that use it change nothing the others read); nothing
    pre-started, since a pre-started Python sandbox is a zygote, which the double refuses. The
    double runs this interpreter, so its environment is the Python runtime list_runners describes
    (`make check` builds no sandbox runtime)."""
    runtime = Path(sys.prefix)
    async with memory_client(module_state_dir, runtime, backend=PlainProcessBackend(), prestart_size=0) as client:
        yield client
