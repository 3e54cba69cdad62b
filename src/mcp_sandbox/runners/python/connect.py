"""Inside a container without fd passing (docker): connect the channel socket, then exec the runner.

``python3 -I -S connect.py SOCKET -- COMMAND...`` connects to the host's unix socket at
``SOCKET`` (a directory bound into the container) and execs ``COMMAND`` with the connected
socket's fd number appended, as the host would have passed it (see
``mcp_sandbox.sandbox.containers``). Stdlib only; no user data is involved.
"""

import os
import socket
import sys

EXIT_USAGE = 64


def main(argv: list[str]) -> int:  # returns only on a usage error: execv replaces the process
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: connect.py SOCKET -- COMMAND...\n")
        return EXIT_USAGE
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    channel.connect(argv[0])
    fd = channel.detach()
    os.set_inheritable(fd, True)
    command = argv[2:]
    os.execv(command[0], [*command, str(fd)])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
