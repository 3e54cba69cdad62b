"""The argv a policy gives in other interpreters, each with a hash seed of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2]


def argv_in_other_processes(script: str, seeds: tuple[str, ...] = ("1", "2")) -> list[list[str]]:
    """What ``script`` (which prints the argv as JSON; ``json`` is imported) prints under each hash seed.

    A set or a dict keyed by hashes would come out in another order under another seed.
    """
    path = os.pathsep.join([str(_TESTS), *sys.path])
    found: list[list[str]] = []
    for seed in seeds:
        done = subprocess.run(
            [sys.executable, "-c", f"import json\n{script}"],
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        argv: list[str] = json.loads(done.stdout)
        found.append(argv)
    return found
