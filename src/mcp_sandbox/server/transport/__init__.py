"""How MCP reaches the server: stdio (with its early ``initialize`` answer) and HTTP, with their bounds.

Kept free of imports: the CLI imports :mod:`.stdio_early` before the MCP SDK (see there).
"""
