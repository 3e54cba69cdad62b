"""Where a resume of a parked conversation (50 MB DataFrame, or ``--small``) goes (issue 48), part by part.

The service in this process, as ``park.py`` runs it (real bwrap, the SDK's in-memory client,
``session_park_after`` short): a conversation imports pandas and builds the DataFrame, is parked,
then a ``run_python`` call resumes it. That call is timed end to end and in parts:

- **seal**: the host's check of the state's seal (every byte) in a worker thread: ``ParkedStates.open``
  before the EXEC (a tree before the overlap), or its verdict (``ParkedStates._verdict``) while the
  sandbox maps the state (after it: then **open** is the state opened, unchecked, before the EXEC,
  and **verdict** from the EXEC to the VERDICT sent, the part of the seal the sandbox waited on
  only if it took longer than "to the code" less the load);
- **claim**: a session-ready sandbox claimed and given the conversation's directory (and whether it
  had preloaded pandas);
- **to the EXEC**: from the call to the host's EXEC carrying the state (the tool's own path, the
  seal, the claim and the session's start: what overlapping them shortens);
- **to the code**: from the host's EXEC to the first line of the call's code, read by the sandbox's
  clock (the same clock: no time namespace): the frame, the state read (or mapped) and loaded;
- **code**: the call's code itself (``df.x.sum()``; with ``--small``, small variables' use);
- **after**: from the code's last line to the call's result in this process;
- **mapped**: how many mappings of a parked file the resumed session holds (0: the state was read).

The rest of the call (the host's path before the seal, after the run) is the total less these.
Instrumentation wraps the host's methods in this process only, so the same script times the
tree before a change (``PYTHONPATH`` of that tree) and after it, in the same minutes.
Run as root, with the sandbox's runtime built: ``sudo PYTHONPATH=src .venv/bin/python bench/park_parts.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from park import PANDAS, RUNTIME, SMALL, call, parked_files, wait_parked

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import interpreter, parking, ready_by_uid
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service

# The timed call's code around each case's use of its variables (as ``park.py``'s).
USE = (
    "import time as _clock\n_began = _clock.time()\n{use}\n"
    "print('T', _began, _clock.time())\n"
    "print('M', sum('/parked/' in line for line in open('/proc/self/maps')))\n"
)
CASES = {  # name: (set-up, use)
    "pandas + a 50 MB DataFrame": (PANDAS + "print(1)", "print(int(df.x.sum()))"),
    "small variables": (SMALL + "print(1)", "print(count + len(items))"),
}


class Timings:
    """The wrapped methods' times, in ms, for the resume being timed."""

    def __init__(self) -> None:
        self.parts: dict[str, list[float]] = {}
        self.preloaded: list[bool] = []
        self.sent = 0.0  # when the resumed run's EXEC went out (time.time())
        self.timing = False

    def add(self, part: str, value: float) -> None:
        if self.timing:
            self.parts.setdefault(part, []).append(value)

    def wrap(self, owner: Any, name: str, part: str) -> None:
        original: Callable[..., Awaitable[Any]] = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            found = await original(*args, **kwargs)
            self.add(part, (time.perf_counter() - started) * 1000)
            if part == "claim" and self.timing:
                self.preloaded.append(bool(getattr(found, "preloaded", False)))
            return found

        setattr(owner, name, timed)

    def wrap_verdict(self) -> None:
        original = interpreter.Interpreter._send_verdict

        async def send(self_: interpreter.Interpreter, *args: Any) -> None:
            await original(self_, *args)
            self.add("verdict", (time.time() - self.sent) * 1000)

        setattr(interpreter.Interpreter, "_send_verdict", send)  # noqa: B010 - patched in this process only

    def wrap_run(self) -> None:
        original = interpreter.Interpreter.run

        async def run(self_: interpreter.Interpreter, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("state") is not None:
                self.sent = time.time()
            return await original(self_, *args, **kwargs)

        setattr(interpreter.Interpreter, "run", run)  # noqa: B010 - patched in this process only


async def _inline_verdict(self: parking.ParkedStates, key: str, tenant: str, state: Any) -> bool:
    """``ParkedStates._verdict`` with the check on the event loop, not in a worker thread (``--inline``)."""
    if self._sealer.check(state.fd, key, tenant) == state.size:
        return True
    self.discard(key)
    return False


async def resumes(state_dir: Path, samples: int, pause: float, case: str, inline: bool = False) -> Timings:
    setup, use = CASES[case]
    timings = Timings()
    if inline:
        setattr(parking.ParkedStates, "_verdict", _inline_verdict)  # noqa: B010 - patched in this process only
    timings.wrap(parking.ParkedStates, "open", "seal")
    if hasattr(parking.ParkedStates, "resume"):  # the seal checked while the sandbox maps the state
        timings.wrap(parking.ParkedStates, "resume", "open")
        timings.wrap(parking.ParkedStates, "_verdict", "seal")
        timings.wrap_verdict()
    timings.wrap(ready_by_uid.ReadyByUid, "claim", "claim")
    timings.wrap_run()
    flags = {
        "state_dir": str(state_dir),
        "discover_servers": False,
        "python_runtime": str(RUNTIME),
        "session_park_after": 2.0,
    }
    settings = load_settings(env={}, flags=flags)
    async with open_service(settings, http=False) as service, Client(build_server(service)) as client:
        for _ in range(samples):
            conversation = f"bench-{uuid.uuid4().hex}"
            await anyio.sleep(pause)
            await call(client, setup, conversation)
            await wait_parked(state_dir, 1)
            await anyio.sleep(pause)  # the ready pool refilled
            timings.timing = True
            called = time.time()
            elapsed, data = await call(client, USE.format(use=use), conversation)
            returned = time.time()
            timings.timing = False
            assert data["session"] == "resumed", data
            lines = dict(line.split(" ", 1) for line in data["stdout"].splitlines() if line[:2] in ("T ", "M "))
            began, ended = (float(value) for value in lines["T"].split())
            timings.parts.setdefault("total", []).append(elapsed)
            timings.parts.setdefault("to the EXEC", []).append((timings.sent - called) * 1000)
            timings.parts.setdefault("to the code", []).append((began - timings.sent) * 1000)
            timings.parts.setdefault("code", []).append((ended - began) * 1000)
            timings.parts.setdefault("after", []).append((returned - ended) * 1000)
            timings.parts.setdefault("mapped", []).append(float(lines["M"]))
            await call(client, "pass", conversation)
            await wait_parked(state_dir, 1)
            for path in parked_files(state_dir):
                path.unlink()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--pause", type=float, default=1.5)
    parser.add_argument("--small", action="store_true", help="small variables instead of pandas")
    parser.add_argument("--inline", action="store_true", help="the overlapped check on the event loop, not a thread")
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-park-parts-") as root:
        os.chmod(root, 0o711)  # the sandbox uid reaches its workspaces under it
        case = "small variables" if args.small else "pandas + a 50 MB DataFrame"
        timings = anyio.run(resumes, Path(root) / "resume", args.samples, args.pause, case, args.inline)
    print(f"resume of {case}, ms (median, min, max)")
    for part in ("total", "to the EXEC", "open", "seal", "claim", "verdict", "to the code", "code", "after", "mapped"):
        values = timings.parts.get(part, [0.0])
        print(f"  {part:<12} {statistics.median(values):8.1f} {min(values):8.1f} {max(values):8.1f}")
    print(f"  claimed a preloading sandbox: {sum(timings.preloaded)} of {len(timings.preloaded)}")
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
