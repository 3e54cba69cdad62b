"""Write deploy/seccomp-server.json, the seccomp profile of the server's container (x86_64).

    .venv/bin/python scripts/server_seccomp_profile.py [OUTPUT]

The profile is :func:`mcp_sandbox.sandbox.seccomp.server_oci_profile`; tests/deploy checks that
the committed file is what this writes, so the two cannot drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp_sandbox.sandbox.seccomp import server_oci_profile


def main(argv: list[str]) -> int:
    output = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "deploy" / "seccomp-server.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(server_oci_profile(), indent=1) + "\n", encoding="utf-8")
    print(f"server_seccomp_profile: wrote {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
