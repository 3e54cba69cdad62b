"""How the tests reach the container backends on these machines (test set-up, not product).

Podman runs here only through ``tests/containers/podman``, a wrapper holding the host's
workarounds (see that file). The docker backend has no engine here: ``docker-via-podman`` is
the docker backend (its dialect, its socket channel) driving that podman wrapper, a
docker-compatible CLI, and is labelled so wherever it runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["PODMAN_WRAPPER", "backend_flags", "podman_usable"]

PODMAN_WRAPPER = Path(__file__).resolve().parent / "containers" / "podman-wrapper"


def podman_usable() -> bool:
    """Whether podman is installed (the wrapper then makes it run here)."""
    return shutil.which("podman") is not None and os.geteuid() == 0


def backend_flags(name: str) -> dict[str, object]:
    """Settings flags that point backend ``name`` at what runs on this machine."""
    if name in ("podman", "docker-via-podman") and podman_usable():
        return {"container_runtime": str(PODMAN_WRAPPER)}
    return {}


def remove_containers(names: list[str]) -> None:
    """Remove containers by name through the wrapper (a test's own clean-up)."""
    if names and podman_usable():
        subprocess.run(
            [str(PODMAN_WRAPPER), "rm", "--force", "--time", "0", *names], capture_output=True, check=False, timeout=60
        )
