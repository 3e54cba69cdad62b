"""Rewrite the users of Settings from flat keys to its pieces (issue 33, item 2, stage B).

``settings.timeout`` becomes ``settings.limits.timeout`` (the piece of every key is read from
``mcp_sandbox.config.settings.PLACES``), ``dataclasses.replace(settings, k=v)`` becomes
``settings.replace(k=v)`` and ``Settings(k=v)`` becomes ``Settings.of(k=v)``. A value is
recognised as settings by its name (``settings``, ``self._settings``, ``service.settings``...)
or by the call that made it (``load_settings(...)``, ``Settings.of(...)``, ``with_tenant_caps(...)``).
Running it twice changes nothing. It then runs ruff on the files it changed (unused imports,
formatting); after it, mypy names whatever it could not recognise.

    PYTHONPATH=src .venv/bin/python scripts/dev/settings_pieces.py [--check] [PATH ...]  # default: src tests bench
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from mcp_sandbox.config.settings import PLACES

# The config package itself declares the pieces: it is written by hand.
SKIP = ("src/mcp_sandbox/config/",)
# Properties of a piece, reached like keys.
DERIVED = {"base_url": "http", "python_interpreter": "paths"}
ROUTE = {key: place for key, place in PLACES.items() if place is not None} | DERIVED
PIECE_NAMES = set(ROUTE.values())
# Calls whose result is settings (bench's own helper is called ``settings`` too).
_MAKER = r"(?:\bload_settings|\bSettings\.of|\bSettings|\bwith_tenant_caps|\.serving|\w*settings\.replace|\bsettings)"
MAKERS = re.compile(_MAKER + r"\s*$")
# Other names a file gives settings: annotated ``: Settings``, or assigned from a maker.
_OTHER_NAMES = re.compile(rf"\b([A-Za-z_]\w*)\s*(?::\s*Settings\b|=\s*{_MAKER}\()")

_KEYS = "|".join(sorted(ROUTE, key=len, reverse=True))
# A name of settings followed by a key; a key that is also a piece's name must not start a longer access.
_NAMED = r"(?<![\w.])((?:[A-Za-z_]\w*\.)*(?:\w*settings|{names}))\.({keys})\b(?![ \t]*\()"
_REPLACE = r"\bdataclasses\.replace\(\s*((?:[A-Za-z_]\w*\.)*(?:\w*settings|{names})|Settings\(\))\s*,\s*"
_CONSTRUCT = re.compile(r"(?<![\w.])Settings\((?=\s*[\w*])")


def _piece_access(match: re.Match[str], text: str) -> str:
    owner, key = match.group(1), match.group(2)
    if key in PIECE_NAMES and re.match(r"\s*\.\s*[A-Za-z_]", text[match.end() :]):
        return match.group(0)  # already settings.<piece>.<key>
    return f"{owner}.{ROUTE[key]}.{key}"


def _after_calls(text: str) -> str:
    """``load_settings(...).timeout`` and the like: the key after a call that makes settings."""
    out: list[str] = []
    index = 0
    key_after = re.compile(rf"\.({_KEYS})\b(?![ \t]*\()")
    while True:
        close = text.find(")", index)
        if close < 0:
            out.append(text[index:])
            return "".join(out)
        out.append(text[index : close + 1])
        index = close + 1
        match = key_after.match(text, index)
        if match is None:
            continue
        depth, opening = 0, close
        while opening >= 0:
            depth += {")": 1, "(": -1}.get(text[opening], 0)
            if depth == 0:
                break
            opening -= 1
        if opening < 0 or not MAKERS.search(text[:opening]):
            continue
        key = match.group(1)
        if key in PIECE_NAMES and re.match(r"\s*\.\s*[A-Za-z_]", text[match.end() :]):
            continue
        out.append(f".{ROUTE[key]}")


def rewrite(text: str) -> str:
    """``text`` with every recognised use of a flat key of Settings rewritten."""
    others = {name for name in _OTHER_NAMES.findall(text) if name not in ROUTE and name != "self"}
    names = "|".join(sorted(others, key=len, reverse=True)) or "(?!)"
    text = re.sub(_REPLACE.format(names=names), lambda match: f"{match.group(1)}.replace(", text)
    text = _CONSTRUCT.sub("Settings.of(", text)
    named = re.compile(_NAMED.format(names=names, keys=_KEYS))
    text = named.sub(lambda match: _piece_access(match, text), text)
    return _after_calls(text)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    roots = [Path(arg) for arg in argv if arg != "--check"] or [Path("src"), Path("tests"), Path("bench")]
    changed = []
    for root in roots:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            if any(str(path).startswith(skip) for skip in SKIP) or path.resolve() == Path(__file__).resolve():
                continue
            text = path.read_text(encoding="utf-8")
            new = rewrite(text)
            if new != text:
                changed.append(path)
                if not check:
                    path.write_text(new, encoding="utf-8")
    for path in changed:
        print(path)
    if changed and not check:
        # What the rewrite leaves to tidy: dataclasses imports no longer used, lines grown too long.
        ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
        files = [str(path) for path in changed]
        subprocess.run([ruff, "check", "--fix", "--select", "F401,I001", "--quiet", *files], check=False)
        subprocess.run([ruff, "format", "--quiet", *files], check=True)
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
