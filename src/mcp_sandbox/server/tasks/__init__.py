"""Long runs as MCP Tasks: the ``tasks`` table (table.py), the runs and their owners (runtime.py),
the lookups of any task (lookups.py), the 2025-11-25 wire (wire.py), and ``mcp-sandbox tasks`` (command.py)."""
