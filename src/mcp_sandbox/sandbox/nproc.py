"""The process limit where no pids cgroup is writable: RLIMIT_NPROC, above what the uid runs already.

RLIMIT_NPROC is not a sandbox's own count: the kernel compares it, at every fork and clone, with
the number of tasks (threads included) its real uid runs in all, everywhere. Set to ``pids``
alone, one unrelated program of that uid with more threads (a browser, an IDE, this server under
load) made every sandbox fail to start ("bwrap: Creating new namespace failed: Resource
temporarily unavailable"). So where it stands in, a sandbox's limit is the uid's tasks now plus
``pids``: the sandbox may start ``pids`` more than the uid runs when it starts, which is weaker
than a cgroup (the sandboxes of one uid still share the room, and the room grows with what else
the uid runs), and the probe and ``doctor`` say so.

The count is read from ``/proc/<pid>/status`` (its real uid, its ``Threads``), kept for a moment:
a scan costs milliseconds, and sandboxes start many times a second.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["nproc_limit", "tasks_of"]

_FRESH_SECONDS = 0.5  # how long one count of a uid's tasks serves
_counts: dict[int, tuple[float, int]] = {}
_lock = threading.Lock()


def tasks_of(uid: int) -> int:
    """How many tasks (threads) processes whose real uid is ``uid`` run now, as RLIMIT_NPROC counts them."""
    count = 0
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as status:
                text = status.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        real = threads = None
        for line in text.splitlines():
            if line.startswith(b"Uid:"):
                real = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                threads = int(line.split()[1])
        if real == uid and threads is not None:
            count += threads
    return count


def nproc_limit(uid: int, pids: int) -> int:
    """RLIMIT_NPROC for a sandbox of host uid ``uid`` allowed ``pids`` processes: ``pids`` above what it runs."""
    now = time.monotonic()
    with _lock:
        cached = _counts.get(uid)
    if cached is not None and now - cached[0] < _FRESH_SECONDS:
        return cached[1] + pids
    running = tasks_of(uid)
    with _lock:
        _counts[uid] = (now, running)
    return running + pids
