"""The runtime inside a Python sandbox: the frame protocol and the runner. Stdlib only."""

# Where the stubs of a run's servers are, one directory per alias: the host's
# mcp_sandbox.sandbox.policy.TOOLS_MOUNT (this side cannot import the host; a unit test keeps them equal).
TOOLS_MOUNT = "/tools"
