"""The Python runtime: ``boot.py`` and the ``mcp_sandbox_runtime`` package (stdlib only)."""
