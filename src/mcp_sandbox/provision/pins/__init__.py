"""The pins the sandbox's runtimes are built from, shipped in the wheel as package data.

``python-requirements.txt``: every package of the sandbox's Python runtime, transitive ones too.
``js/package.json`` and ``js/package-lock.json``: the JavaScript runtimes (bun, deno), by npm.
The checkout's ``runtime/`` links here, for ``make``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

__all__ = ["JS_BINARIES", "JS_FILES", "JS_PACKAGES", "PINS_DIR", "PYTHON_REQUIREMENTS", "digest"]

PINS_DIR = Path(__file__).resolve().parent
PYTHON_REQUIREMENTS = PINS_DIR / "python-requirements.txt"
JS_FILES = (PINS_DIR / "js" / "package.json", PINS_DIR / "js" / "package-lock.json")
# Each JavaScript runtime's npm package, relative to the runtime directory, and its binary inside.
JS_PACKAGES: Mapping[str, str] = {
    "bun": "node_modules/@oven/bun-linux-x64",
    "deno": "node_modules/@deno/linux-x64-glibc",
}
JS_BINARIES: Mapping[str, str] = {"bun": f"{JS_PACKAGES['bun']}/bin/bun", "deno": f"{JS_PACKAGES['deno']}/deno"}


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
