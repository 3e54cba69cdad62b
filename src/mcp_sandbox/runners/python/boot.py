"""Entry point inside the sandbox: ``python3 -I -B /opt/mcp-sandbox/python/boot.py FD``.

``-I`` keeps the script's directory off ``sys.path``, so it is added here, explicitly.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mcp_sandbox_runtime.runner import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
