"""The runtime inside a Python sandbox: the frame protocol and the runner. Stdlib only."""

# Where the stubs of a run's servers are, one directory per alias (the host takes it from here,
# through mcp_sandbox.protocol).
TOOLS_MOUNT = "/tools"
