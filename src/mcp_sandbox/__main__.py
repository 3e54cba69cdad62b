"""``python -m mcp_sandbox``: the same as the ``mcp-sandbox`` command."""

from mcp_sandbox.cli import console_main

raise SystemExit(console_main())
