"""Work done in a forked child of the test: a server process that moves between cgroups, or drops to a uid."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any


def in_child(work: Callable[[], object]) -> dict[str, Any]:
    """Run ``work`` in a forked child: ``{"result": ..., "pid": ...}``, or ``{"error": ..., "pid": ...}``
    naming what it raised."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(reader)
            result = {"result": work(), "pid": os.getpid()}
        except BaseException as exc:
            result = {"error": f"{type(exc).__name__}: {exc}", "pid": os.getpid()}
        finally:
            try:
                os.write(writer, json.dumps(result).encode())
            finally:
                os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as out:
        data = out.read()
    os.waitpid(pid, 0)
    answer: dict[str, Any] = json.loads(data)
    return answer
