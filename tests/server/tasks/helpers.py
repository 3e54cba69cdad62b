"""The runs the tasks' tests start: plain coroutines, answered as a tool result's wire dict."""

from __future__ import annotations

from typing import Any

import anyio

BOUND = 10.0


def answer(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


async def done() -> dict[str, Any]:
    return answer("x")


async def forever() -> dict[str, Any]:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")
