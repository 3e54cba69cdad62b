"""``mcp-sandbox install CLIENT``: add this installation to an MCP client's config file.

- ``targets``: the clients, their config files and entry shapes;
- ``jsonedit``: setting one member of a JSON(C) file by a text edit that keeps everything else;
- ``command``: the subcommand, the command line that starts this server, backup and write.
"""

from mcp_sandbox.install.command import server_command
from mcp_sandbox.install.targets import CLIENTS, Client

__all__ = ["CLIENTS", "Client", "server_command"]
