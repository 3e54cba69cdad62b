"""``mcp.servers.<alias>``: the generated stubs of each server this run may call.

They are the read-only files under ``/tools/<alias>/``: read them to learn a tool's parameters
and result type, import them to call it.
"""

TOOLS_ROOT = "/tools"

# A package whose submodules are the directories under /tools.
__path__ = [TOOLS_ROOT]
