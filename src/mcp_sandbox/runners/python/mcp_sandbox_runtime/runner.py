"""A long-lived interpreter inside the sandbox that serves EXEC frames, one at a time.

The runner announces itself (READY), then serves every EXEC frame the host sends until the
host closes the channel: a fresh run is a sandbox that serves one EXEC and is closed; a session
keeps serving. All runs share one ``__main__`` namespace and one asyncio event loop (top-level
``await`` works; objects bound to the loop survive between runs).

What a run is (its stdio, environment, servers, DONE) is ``exec_server.py``'s; after any run the runner
goes on serving. The process's own stdout/stderr are for the runtime's own failures. The process
exits with the last run's exit code.
"""

from __future__ import annotations

import os
import sys

from . import host, relay
from .exec_server import Server, prepare_process, serve_until_last
from .frames import Ready

__all__ = ["EXIT_USAGE", "main"]

EXIT_USAGE = 64


def main(argv: list[str]) -> int:
    """``boot.py [--zygote=MODULES] CHANNEL_FD``: announce readiness, then serve EXEC frames until the host hangs up.

    An EXEC frame with ``"last": true`` is the last one: the runner exits after it. With
    ``--zygote`` the process is a warm sandbox's zygote (see :mod:`.zygote`), which preloads the
    comma-separated MODULES and forks a fresh interpreter per run.
    """
    zygote: list[str] | None = None
    if argv and argv[0].startswith("--zygote="):
        zygote = [name for name in argv[0].removeprefix("--zygote=").split(",") if name]
        argv = argv[1:]
    if len(argv) != 1 or not argv[0].isdigit():
        sys.stderr.write("usage: boot.py [--zygote=MODULES] CHANNEL_FD\n")
        return EXIT_USAGE
    channel = int(argv[0])
    if zygote is not None:
        from . import zygote as warm

        return warm.main(channel, zygote)
    connection = host.connect(channel)
    os.close(channel)  # the connection holds its own, non-inheritable duplicate
    prepare_process()
    if (problem := relay.start()) is not None:
        sys.stderr.write(f"mcp-sandbox runner: {problem}\n")
    connection.send(Ready("python", sys.version.split()[0]))
    return serve_until_last(Server(connection))
