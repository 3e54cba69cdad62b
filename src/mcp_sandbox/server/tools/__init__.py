"""The MCP tools: their arguments and declarations, their handlers, and the text a model reads back.

:mod:`.handlers` answers ``tools/list`` and ``tools/call``; :mod:`.run` is the one tool that runs
code (``run_python``, ``run_code``), from the call's arguments to its result.
"""
