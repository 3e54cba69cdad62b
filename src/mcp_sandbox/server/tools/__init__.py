"""The MCP tools: their arguments and declarations, their handlers, and the text a model reads back.

:mod:`.handlers` answers ``tools/list`` and ``tools/call``.
"""
