"""The interpreters of the downstream clients' own venvs (``make downstream``: .downstream/NAME),
which the tests drive as subprocesses; never the project's venv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def downstream_python(venv: str, variable: str, what: str) -> Path:
    """The interpreter of .downstream/``venv`` (the environment variable ``variable`` overrides).

    Raises:
        pytest.skip.Exception: outside make and CI, when it is not installed.
        pytest.fail.Exception: the same under make (MAKELEVEL) or CI, which install it first.
    """
    python = Path(os.environ.get(variable, ROOT / ".downstream" / venv / "bin" / "python"))
    if python.exists():
        return python
    reason = f"{what} is not installed ({python} is missing): run `make downstream`"
    if os.environ.get("MAKELEVEL") or os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
