"""``mcp.servers.<alias>``: the generated stubs of each server this run may call.

They are the read-only files under ``/tools/<alias>/``: read them to learn a tool's parameters
and result type, import them to call it.
"""

# Top-level modules inside the sandbox only (see mcp/runtime.py on the type checker's view).
from mcp_sandbox_runtime import TOOLS_MOUNT  # type: ignore[import-not-found,unused-ignore]

# A package whose submodules are the directories under /tools.
__path__ = [TOOLS_MOUNT]
