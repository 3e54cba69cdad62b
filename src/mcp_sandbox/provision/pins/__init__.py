"""The pins the sandbox's runtimes are built from, shipped in the wheel as package data.

``python-requirements.txt``: every package of the sandbox's Python runtime, transitive ones too.
``js/package.json`` and ``js/package-lock.json``: the JavaScript runtimes (bun, deno), by npm.
The checkout's ``runtime/`` links here, for ``make``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["JS_FILES", "PINS_DIR", "PYTHON_REQUIREMENTS", "digest"]

PINS_DIR = Path(__file__).resolve().parent
PYTHON_REQUIREMENTS = PINS_DIR / "python-requirements.txt"
JS_FILES = (PINS_DIR / "js" / "package.json", PINS_DIR / "js" / "package-lock.json")


def digest(*paths: Path, extra: tuple[str, ...] = ()) -> str:
    """SHA-256 of the files' contents and ``extra`` strings: what a built runtime was built from."""
    hasher = hashlib.sha256()
    for path in paths:
        hasher.update(path.read_bytes())
        hasher.update(b"\0")
    for item in extra:
        hasher.update(item.encode())
        hasher.update(b"\0")
    return hasher.hexdigest()
