"""`make setup`'s scripts/check-sandbox-access.sh: what the sandbox binds from a checkout, made usable by it."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path("src/mcp_sandbox/runners/python")

# Every runner module whose bytecode for the running interpreter is missing.
_UNCOMPILED = (
    "import importlib.util, pathlib, sys;"
    "print([str(f) for f in pathlib.Path(sys.argv[1]).rglob('*.py')"
    " if not pathlib.Path(importlib.util.cache_from_source(str(f))).exists()])"
)


def test_the_runner_is_compiled_for_the_sandboxs_interpreter_and_readable_by_all(
    packaged_runtime: Path, tmp_path: Path
) -> None:
    # A checkout's layout: the runner without any bytecode, the runtime's interpreter at .runtime/python.
    repo = tmp_path / "repo"
    shutil.copytree(REPO / RUNNER, repo / RUNNER, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".runtime" / "python" / "bin").mkdir(parents=True)
    interpreter = packaged_runtime / "bin" / "python3"
    (repo / ".runtime" / "python" / "bin" / "python3").symlink_to(interpreter)

    done = subprocess.run(["bash", str(REPO / "scripts" / "check-sandbox-access.sh"), str(repo)], capture_output=True)
    assert done.returncode == 0, done.stderr

    # The sandbox cannot write __pycache__: the bytecode its interpreter looks for is there ...
    left = subprocess.run([str(interpreter), "-c", _UNCOMPILED, str(repo / RUNNER)], capture_output=True, text=True)
    assert (left.returncode, left.stdout.strip()) == (0, "[]"), left.stderr
    # ... and, like the sources, readable by the sandbox's uid.
    for path in (repo / RUNNER).rglob("*.pyc"):
        assert path.stat().st_mode & stat.S_IROTH, path
