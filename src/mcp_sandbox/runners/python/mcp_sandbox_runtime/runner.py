"""A long-lived interpreter inside the sandbox that serves EXEC frames, one at a time.

The runner announces itself (READY), then serves every EXEC frame the host sends until the
host closes the channel: a fresh run is a sandbox that serves one EXEC and is closed; a session
keeps serving. All runs share one ``__main__`` namespace and one asyncio event loop (top-level
``await`` works; objects bound to the loop survive between runs).

What a run is (its stdio, environment, servers, DONE) is ``exec_server.py``'s; after any run the runner
goes on serving. The process's own stdout/stderr are for the runtime's own failures. The process
exits with the last run's exit code. With ``--ready=MODULES`` (a session-ready sandbox's, started
ahead of its session) it imports MODULES first, then serves as any runner.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from . import host, kernel, preload, relay
from .exec_server import Server, prepare_process, prepare_single, serve_until_last
from .frames import Ready
from .namespace import MainNamespace

__all__ = ["EXIT_USAGE", "main"]

EXIT_USAGE = 64


def main(argv: list[str]) -> int:
    """``boot.py [--zygote=MODULES | --ready=MODULES] CHANNEL_FD``: announce readiness, then serve EXEC frames
    until the host hangs up.

    An EXEC frame with ``"last": true`` is the last one: the runner exits after it. With
    ``--zygote`` the process is a warm sandbox's zygote (see :mod:`.zygote`), which preloads the
    comma-separated MODULES and forks a fresh interpreter per run; with ``--ready`` it preloads
    them and serves its session's runs itself (see the module docstring).
    """
    zygote: list[str] | None = None
    ready: list[str] | None = None
    if argv and argv[0].startswith(("--zygote=", "--ready=")):
        option, _, names = argv[0].partition("=")
        modules = [name for name in names.split(",") if name]
        zygote, ready = (modules, None) if option == "--zygote" else (None, modules)
        argv = argv[1:]
    if len(argv) != 1 or not argv[0].isdigit():
        sys.stderr.write("usage: boot.py [--zygote=MODULES | --ready=MODULES] CHANNEL_FD\n")
        return EXIT_USAGE
    channel = int(argv[0])
    if zygote is not None:
        from . import zygote as warm

        return warm.main(channel, zygote)
    connection = host.connect(channel)
    os.close(channel)  # the connection holds its own, non-inheritable duplicate
    prepare_process()
    namespace = None if ready is None else _preload(ready)
    if (problem := relay.start()) is not None:
        sys.stderr.write(f"mcp-sandbox runner: {problem}\n")
    connection.send(Ready("python", sys.version.split()[0]))
    return serve_until_last(Server(connection, namespace=namespace))


def _preload(modules: list[str]) -> MainNamespace:
    """A session-ready runner's start: import ``modules`` and what a run's first steps need, before its session.

    What every run's first steps import or fill (the library's names, the compiler's pages) is
    done now, off the session's first run, as a warm zygote's child does it; asyncio is not (a
    session imports it on its first top-level ``await``). A preloading one also imports the loader
    of a fork's or a resumed session's state (``fork.py``), as only preloading ones are claimed for
    those. The heap the imports freed goes back to the kernel. A module that fails to import is
    left to the run, which sees the same error itself.
    """
    loaded, _ = preload.preload(modules)
    preload.exercise(loaded)
    if loaded:
        from . import fork  # noqa: F401 - imported for its state's first load
    namespace = prepare_single()
    gc.collect()
    with contextlib.suppress(AttributeError):  # glibc's; another libc keeps the heap as it is
        kernel.libc().malloc_trim(0)
    return namespace
