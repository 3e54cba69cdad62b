"""The fault-injection suite's cluster and its nemesis: one fault at a time, each waited out with a bound.

:func:`faulty_cluster` starts, for a module, a SeaweedFS of its own (so killing it touches no
other test's store), three replicas behind HAProxy (tests/balancer_helpers.py) with a short lease,
the third one's state directory on a small tmpfs (as root) so its disk can be filled, and a
*fresh* server started beside them (``replica_set(fresh=True)``): a new state directory, the same
database, store and server secret, no ``replica_url`` (it takes no lease), so each conversation
it is asked about is restored from the object store alone. :class:`Nemesis` injects the faults
and waits for the cluster to recover by polling, never by sleeping.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest

from balancer_helpers import Replica, ReplicaSet, replica_set
from mcp_sandbox.config import load_settings
from mcp_test_helpers import fill_disk, new_conversation, upload
from postgres_helpers import Cluster
from replica_helpers import lease_rows
from s3_helpers import Weed, weed_server
from settings_helpers import store_of

from .model import Model, Phase, check, check_links, workload

__all__ = ["LEASE", "RECOVERY", "Nemesis", "faulty_cluster", "require_root", "soak_rounds", "until"]

LEASE = 3.0  # seconds: a dead or frozen owner is replaced within this
RECOVERY = 90.0  # the bound on any wait for the cluster to come back
TENANT = "default"  # the tenant of MCP_SANDBOX_TOKEN
DISK = "48m"  # the third replica's state directory: room for its pool, little more


def soak_rounds() -> int:
    """``MCP_SANDBOX_TEST_SOAK``: how many times each scenario runs, with more conversations (default 1)."""
    return int(os.environ.get("MCP_SANDBOX_TEST_SOAK", "1") or "1")


async def until(check: Callable[[], bool], bound: float = RECOVERY) -> None:
    """Poll ``check()`` (blocking: it reads another process's state) until true, within ``bound``."""
    with anyio.fail_after(bound):
        while not await anyio.to_thread.run_sync(check):  # noqa: ASYNC110 - another process's state: no event
            await anyio.sleep(0.1)


@dataclass
class Nemesis:
    """The running cluster (its replicas, balancer, database, store) and the fresh server reading the store."""

    cluster: ReplicaSet
    postgres: Cluster
    weed: Weed
    fresh_url: str
    small_disk: Path | None  # the third replica's state directory, a tmpfs; None unless root
    clients: int
    per_client: int

    def model(self, name: str) -> Model:
        return Model.new(name, self.clients, self.per_client)

    async def phase(
        self, model: Model, *, faulty: bool = False, bound: float = 60.0, ops: int = 2, via: Replica | None = None
    ) -> None:
        """A workload phase through the balancer (or ``via`` one replica), each call within ``bound``."""
        url = self.cluster.url if via is None else via.url
        await workload(model, url, self.cluster.token, Phase(faulty, bound, ops), self.clients)

    async def verify(self, model: Model) -> str:
        """Read everything back through the balancer and through the fresh server; the model's report."""
        await self.healthy()
        await check(model, self.cluster.url, self.cluster.token, "live")
        await check_links(model)
        await check(model, self.fresh_url, self.cluster.token, "fresh")
        report = model.report()
        if model.lost or model.unrestorable:  # what the balancer saw of the calls that failed
            report += "\nthe balancer's unfinished requests:\n" + "\n".join(self.cluster.balancer_failures())
        print(report)
        return report

    async def healthy(self) -> None:
        """Wait until every replica stores a file again (an upload to it directly: the database, the
        store and its disk all answer), polling within :data:`RECOVERY`.

        Raises:
            AssertionError: one did not recover in time; with its last answer.
        """
        probe = new_conversation()
        last = ""
        try:
            with anyio.fail_after(RECOVERY):
                for replica in self.cluster.replicas:
                    while True:
                        try:
                            reply = await upload(replica.url, self.cluster.token, probe, "probe.txt", b"probe")
                        except httpx2.HTTPError as exc:
                            last = f"{replica.name}: {exc!r}"
                        else:
                            if reply.status_code == 201:
                                break
                            last = f"{replica.name}: {reply.status_code} {reply.text}\n{replica.log_tail(3000)}"
                        await anyio.sleep(0.2)  # recovery has no event to wait on from outside
        except TimeoutError:
            raise AssertionError(f"not recovered within {RECOVERY:g} s: {last}") from None

    async def busiest_owner(self, bound: float = 30.0) -> Replica:
        """The replica holding the most leases now (polled until one holds any, within ``bound``)."""
        with anyio.fail_after(bound):
            while True:
                now = time.time()
                rows = await anyio.to_thread.run_sync(lease_rows, self.cluster.database_url)
                held = collections.Counter(owner for _, owner, expires, _ in rows if expires > now)
                if held:
                    url = held.most_common(1)[0][0]
                    return next(r for r in self.cluster.replicas if r.url == url)
                await anyio.sleep(0.05)  # leases are another process's state

    def key(self, conversation: str) -> str:
        """The workspace key (and lease key) of the tenant's ``conversation`` on this cluster."""
        settings = load_settings(env={}, flags={"state_dir": str(self.cluster.replicas[0].state_dir)})
        secret = (self.cluster.replicas[0].state_dir / "secret").read_bytes()
        return store_of(settings, secret).key(TENANT, conversation)

    async def owner(self, conversation: str, bound: float = 30.0) -> Replica:
        """The replica holding ``conversation``'s lease, polled until one does (within ``bound``)."""
        key = self.key(conversation)
        with anyio.fail_after(bound):
            while True:
                rows = await anyio.to_thread.run_sync(lease_rows, self.cluster.database_url)
                now = time.time()
                for row_key, owner, expires, _ in rows:
                    if row_key == key and expires > now:
                        return next(r for r in self.cluster.replicas if r.url == owner)
                await anyio.sleep(0.05)  # leases are another process's state

    def leases_expired(self, replica: Replica) -> Callable[[], bool]:
        return lambda: all(
            expires < time.time()
            for _, owner, expires, _ in lease_rows(self.cluster.database_url)
            if owner == replica.url
        )

    @contextlib.contextmanager
    def frozen(self, replica: Replica) -> Iterator[None]:
        """The replica's server process stopped (SIGSTOP) for the block, continued whatever happens."""
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def store_paused(self) -> Iterator[None]:
        self.weed.pause()
        try:
            yield
        finally:
            self.weed.resume()

    @contextlib.contextmanager
    def disk_full(self) -> Iterator[None]:
        """The small disk filled to the last byte for the block; freed at its end."""
        assert self.small_disk is not None
        filler = fill_disk(self.small_disk)
        try:
            yield
        finally:
            filler.unlink()


@contextlib.asynccontextmanager
async def faulty_cluster(postgres: Cluster, runtime: Path | None) -> AsyncIterator[Nemesis]:
    """The module's cluster and nemesis (see the module's docstring)."""
    rounds = soak_rounds()
    env = {"MCP_SANDBOX_REPLICA_LEASE": f"{LEASE:g}"}
    small = DISK if os.geteuid() == 0 else None  # mounting a tmpfs needs root
    with weed_server() as weed:
        database = postgres.create_database()
        async with replica_set(
            database, weed.endpoint, runtime=runtime, env=env, small_disk=small, fresh=True
        ) as cluster:
            assert cluster.fresh is not None
            disk = cluster.replicas[-1].state_dir if small else None
            yield Nemesis(
                cluster, postgres, weed, cluster.fresh.url, disk, clients=4, per_client=1 if rounds == 1 else 2
            )


def require_root(nemesis: Nemesis) -> Path:
    if nemesis.small_disk is None:
        pytest.skip("a small disk for a replica is a tmpfs mounted as root")
    return nemesis.small_disk
