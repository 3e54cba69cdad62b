"""deploy/haproxy.cfg: the one docs/scaling.md shows, HAProxy accepts it, and the replicas' tests
run it with only its addresses changed (tests/balancer_helpers.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from balancer_helpers import HAPROXY_CONFIG, balancer_config, require_haproxy

REPO = Path(__file__).resolve().parents[2]
SCALING = REPO / "docs" / "scaling.md"


def test_the_scaling_page_shows_the_config_file_verbatim() -> None:
    blocks = re.findall(r"^```haproxy\n(.*?)^```$", SCALING.read_text(), re.M | re.S)
    assert blocks == [HAPROXY_CONFIG.read_text()]


def test_haproxy_accepts_the_config_file() -> None:
    checked = subprocess.run(
        [str(require_haproxy()), "-c", "-f", str(HAPROXY_CONFIG)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_tests_change_only_the_addresses() -> None:
    original = HAPROXY_CONFIG.read_text()
    changed = balancer_config(
        original, "127.0.0.1:4000", ["127.0.0.1:4001", "127.0.0.1:4002", "127.0.0.1:4003"], Path("/t/admin.sock")
    )
    different = [
        (before, after)
        for before, after in zip(original.splitlines(), changed.splitlines(), strict=True)
        if before != after
    ]
    assert different == [
        (
            "    stats socket /run/haproxy-admin.sock mode 600 level admin",
            "    stats socket /t/admin.sock mode 600 level admin",
        ),
        ("    bind 0.0.0.0:8080", "    bind 127.0.0.1:4000"),
        ("    server replica1 10.0.0.11:8765 check", "    server replica1 127.0.0.1:4001 check"),
        ("    server replica2 10.0.0.12:8765 check", "    server replica2 127.0.0.1:4002 check"),
        ("    server replica3 10.0.0.13:8765 check", "    server replica3 127.0.0.1:4003 check"),
    ]
