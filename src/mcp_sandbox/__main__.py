"""``python -m mcp_sandbox``: the same as the ``mcp-sandbox`` command."""

from mcp_sandbox.cli import main

raise SystemExit(main())
