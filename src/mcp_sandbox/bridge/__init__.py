"""Code mode: downstream MCP servers that sandboxed code calls through the host.

- ``discovery``: which servers exist (explicit file, our ``[servers]``, the user's MCP client configs);
- ``pool``: one warm client per downstream server, each owned by one task;
- ``stubs``: Python modules generated from each tool's schemas, readable under ``/tools`` in the sandbox;
- ``search``: ranked search over every downstream tool;
- ``mediator``: the host side of a run's tool calls, enforcing which servers and tools it may reach.
"""
