"""How the tests reach the container backends on these machines (test set-up, not product).

Podman runs here only through ``tests/containers/podman-wrapper``, a wrapper holding the host's
workarounds (see that file). Debian's docker engine does start here: the tests run it
themselves (:func:`docker_daemon`) on a private socket that ``tests/containers/docker-wrapper``
points the docker CLI at. ``docker-via-podman`` is the docker backend (its dialect, its socket
channel) driving the podman wrapper as a docker-compatible CLI, labelled so where it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2

__all__ = [
    "DOCKER_WRAPPER",
    "PODMAN_WRAPPER",
    "backend_flags",
    "docker_daemon",
    "podman_usable",
    "remove_containers",
    "server_image_in",
    "server_image_in_docker",
    "server_ready",
]

PODMAN_WRAPPER = Path(__file__).resolve().parent / "containers" / "podman-wrapper"
DOCKER_WRAPPER = Path(__file__).resolve().parent / "containers" / "docker-wrapper"


def podman_usable() -> bool:
    """Whether podman is installed (the wrapper then makes it run here)."""
    return shutil.which("podman") is not None and os.geteuid() == 0


def backend_flags(name: str) -> dict[str, object]:
    """Settings flags that point backend ``name`` at what runs on this machine."""
    if name in ("podman", "docker-via-podman") and podman_usable():
        return {"container_runtime": str(PODMAN_WRAPPER)}
    if name == "docker" and DOCKER_WRAPPER.exists():
        return {"container_runtime": str(DOCKER_WRAPPER)}
    return {}


def remove_containers(names: list[str]) -> None:
    """Remove containers by name through the wrapper (a test's own clean-up)."""
    if names and podman_usable():
        subprocess.run(
            [str(PODMAN_WRAPPER), "rm", "--force", "--time", "0", "--ignore", *names],
            capture_output=True,
            check=False,
            timeout=60,
        )


DOCKER_STATE = Path("/var/lib/mcp-sandbox-tests/docker")  # kept between runs: the image stays loaded
DOCKER_RUN = Path("/run/mcp-sandbox-tests")
_DOCKERD = "/usr/sbin/dockerd"
_IMAGE = "localhost/mcp-sandbox-python:latest"
_REPO = Path(__file__).resolve().parents[1]


def _docker_answers() -> bool:
    done = subprocess.run([str(DOCKER_WRAPPER), "info"], capture_output=True, check=False, timeout=60)
    return done.returncode == 0


@contextlib.contextmanager
def docker_daemon() -> Iterator[str | None]:
    """Run Debian's docker engine for the tests (root only), on a private socket; yield why not, or None.

    Started only when not already answering, and stopped again by pid when this block ends.
    No bridge and no iptables: the sandboxes have no network anyway. The image is imported
    into it (scripts/build-container-image.sh) when missing.
    """
    if os.geteuid() != 0 or not os.path.exists(_DOCKERD):
        yield "no docker engine (dockerd) installed here, or not root"
        return
    DOCKER_RUN.mkdir(parents=True, exist_ok=True)
    # Parallel workers (pytest-xdist) share one engine: each holds a shared lock on `users` while
    # it may use it, and the worker that started it stops it once it can take that lock alone.
    with open(DOCKER_RUN / "users", "w") as users:
        with open(DOCKER_RUN / "start.lock", "w") as starting:
            fcntl.flock(starting, fcntl.LOCK_EX)
            fcntl.flock(users, fcntl.LOCK_SH)
            if _docker_answers():
                fcntl.flock(starting, fcntl.LOCK_UN)
                yield None
                return
            with _started_engine() as reason:
                fcntl.flock(starting, fcntl.LOCK_UN)
                try:
                    yield reason
                finally:
                    fcntl.flock(users, fcntl.LOCK_EX)  # waits for the other workers to be done with it


@contextlib.contextmanager
def _started_engine() -> Iterator[str | None]:
    DOCKER_STATE.mkdir(parents=True, exist_ok=True)
    log = open(DOCKER_RUN / "dockerd.log", "ab")
    daemon = subprocess.Popen(
        [
            _DOCKERD,
            *("--host", f"unix://{DOCKER_RUN / 'docker.sock'}", "--data-root", str(DOCKER_STATE)),
            *("--exec-root", str(DOCKER_RUN / "exec"), "--pidfile", str(DOCKER_RUN / "dockerd.pid")),
            *("--iptables=false", "--ip6tables=false", "--bridge=none"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _docker_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                yield f"dockerd did not start (see {DOCKER_RUN / 'dockerd.log'})"
                return
            time.sleep(0.2)
        image = subprocess.run([str(DOCKER_WRAPPER), "image", "inspect", _IMAGE], capture_output=True, check=False)
        if image.returncode != 0:
            subprocess.run(
                ["bash", str(_REPO / "scripts" / "build-container-image.sh"), _IMAGE],
                env={**os.environ, "CONTAINER_CLI": str(DOCKER_WRAPPER)},
                capture_output=True,
                check=True,
                timeout=600,
            )
        yield None
    finally:
        daemon.terminate()  # dockerd stops its containerd with it
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=30)
        log.close()
        # dockerd leaves its default network namespace bind-mounted in the exec root when it stops.
        netns = DOCKER_RUN / "exec" / "netns" / "default"
        if os.path.ismount(netns):
            subprocess.run(["umount", "--lazy", str(netns)], capture_output=True, check=False)


async def server_ready(web: httpx2.AsyncClient, base: str, bound: float = 120) -> None:
    """Poll ``base``/readyz until it answers 200: the server is another process in a container."""
    with anyio.fail_after(bound):
        while True:
            try:
                if (await web.get(f"{base}/readyz")).status_code == 200:
                    return
            except httpx2.TransportError:
                pass  # not listening yet
            await anyio.sleep(0.1)


def server_image_in_docker(image: str) -> None:
    """The server's image in the tests' docker engine (see :func:`server_image_in`). Within
    :func:`docker_daemon`."""
    server_image_in(DOCKER_WRAPPER, image)


def server_image_in(cli: Path, image: str) -> None:
    """The server's image (scripts/build-server-image.sh) in the engine ``cli`` drives, built there
    when missing or made from other sources (its label carries the digest of what went in); kept in
    the engine's state between runs. Its base layer (all but src/) is kept in the engine too, so a
    change to the source rebuilds only the thin top layer. The base's root filesystem tarball is
    built once per base digest and shared, under a lock, by every engine and worker that needs it:
    podman's and docker's tests would otherwise each build the same 760 MB layer, often at the
    same time."""
    build = _REPO / "scripts" / "build-server-image.sh"

    def digest_of(option: str) -> str:
        return subprocess.run(["bash", str(build), option], capture_output=True, text=True, check=True).stdout.strip()

    inspect = [str(cli), "image", "inspect", "--format", '{{index .Config.Labels "io.mcp-sandbox.digest"}}', image]
    if subprocess.run(inspect, capture_output=True, text=True, check=False).stdout.strip() == digest_of("--digest"):
        return
    cache = Path(os.environ.get("MCP_SANDBOX_TEST_IMAGE_CACHE", "/var/tmp"))
    tarball = cache / f"mcp-sandbox-server-image-{digest_of('--base-digest')}.tar"
    with open(cache / "mcp-sandbox-server-image.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in cache.glob("mcp-sandbox-server-image-*.tar"):
            if stale != tarball:
                stale.unlink(missing_ok=True)
        env = {**os.environ, "CONTAINER_CLI": str(cli), "SERVER_IMAGE_TAR": str(tarball)}
        subprocess.run(["bash", str(build), image], env=env, check=True, timeout=1200)
