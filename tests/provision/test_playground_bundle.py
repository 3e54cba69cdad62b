"""The committed playground bundle is the one ``make web`` builds from web/ as it is now.

The bundle under ``src/mcp_sandbox/server/static`` is committed so that every wheel, sdist and
``pip install git+...`` serves ``/`` without node. ``make web`` records the sources it was built
from in ``SOURCES.sha256``; a change to web/ without a rebuild fails here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WEB = REPO / "web"
STATIC = REPO / "src" / "mcp_sandbox" / "server" / "static"


def test_the_committed_bundle_was_built_from_the_current_web_sources() -> None:
    sources = ["build.mjs", "package-lock.json", *sorted(f"src/{p.name}" for p in (WEB / "src").iterdir())]
    expected = "".join(f"{hashlib.sha256((WEB / name).read_bytes()).hexdigest()}  {name}\n" for name in sources)
    recorded = (STATIC / "SOURCES.sha256").read_text(encoding="utf-8")
    assert recorded == expected, "web/ changed since the bundle was built: run `make web` and commit static/"


def test_the_bundle_has_the_page_its_script_and_its_style() -> None:
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    for asset in ("playground.js", "playground.css"):
        assert (STATIC / asset).stat().st_size > 0 and asset in page
