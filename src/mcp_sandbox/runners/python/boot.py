"""Entry point inside the sandbox: ``python3 -I -B /opt/mcp-sandbox/python/boot.py FD``.

``-I`` keeps the script's directory off ``sys.path``, so it is added here, explicitly.
"""

import importlib
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    runner = importlib.import_module("mcp_sandbox_runtime.runner")
    raise SystemExit(runner.main(sys.argv[1:]))
