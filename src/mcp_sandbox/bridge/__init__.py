"""Code mode: downstream MCP servers that sandboxed code calls through the host.

- ``discovery``: which servers exist (explicit file, our ``[servers]``, the user's MCP client configs),
  reading files in ``config_files``, checking entries in ``server_entries``, into ``server_spec`` types;
- ``listing``: what ``mcp-sandbox servers`` prints;
- ``clients``: one warm client per downstream server, each owned by one task;
- ``stubs``: Python modules generated from each tool's schemas (types via ``schema_types``), readable
  under ``/tools`` in the sandbox;
- ``search``: ranked search over every downstream tool;
- ``mediator``: the downstream servers, clients, stubs and search, for the server's life;
- ``run_access``: the host side of a run's tool calls, enforcing which servers and tools it may reach.
"""
