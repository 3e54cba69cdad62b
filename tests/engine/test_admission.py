"""Admission control: caps per tenant, a bounded queue, and turns taken round robin between tenants."""

from __future__ import annotations

import anyio
import pytest

from mcp_sandbox.engine.admission import Admission
from mcp_sandbox.errors import BusyError

pytestmark = pytest.mark.anyio


async def test_a_tenant_at_its_cap_waits_while_another_tenant_takes_a_free_slot() -> None:
    admission = Admission(2, 8, 5.0, tenant_limit=1, tenant_queue=4)
    order: list[str] = []
    release = anyio.Event()

    async def hold(tenant: str, label: str) -> None:
        async with admission.slot(tenant):
            order.append(label)
            await release.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(hold, "alice", "a1")
        group.start_soon(hold, "alice", "a2")
        await anyio.wait_all_tasks_blocked()
        group.start_soon(hold, "bob", "b1")
        await anyio.wait_all_tasks_blocked()
        assert order == ["a1", "b1"]  # alice's second waits for her own first, not bob
        assert (admission.running_of("alice"), admission.waiting_of("alice")) == (1, 1)
        release.set()
    assert order == ["a1", "b1", "a2"]


async def test_the_queue_is_served_round_robin_between_tenants() -> None:
    admission = Admission(1, 16, 5.0, tenant_limit=1, tenant_queue=8)
    order: list[str] = []
    gate = anyio.Event()

    async def run(tenant: str, label: str) -> None:
        async with admission.slot(tenant):
            order.append(label)
            if label == "first":
                await gate.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(run, "carol", "first")
        await anyio.wait_all_tasks_blocked()
        for index in range(3):  # alice queues three before bob queues any
            group.start_soon(run, "alice", f"a{index}")
            await anyio.wait_all_tasks_blocked()
        for index in range(2):
            group.start_soon(run, "bob", f"b{index}")
            await anyio.wait_all_tasks_blocked()
        gate.set()
    assert order == ["first", "a0", "b0", "a1", "b1", "a2"]


async def test_a_tenants_full_queue_is_refused_at_once_while_another_tenant_still_queues() -> None:
    admission = Admission(1, 16, 5.0, tenant_limit=1, tenant_queue=1)
    release = anyio.Event()

    async def hold(tenant: str) -> None:
        async with admission.slot(tenant):
            await release.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(hold, "alice")
        group.start_soon(hold, "alice")
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(BusyError, match="tenant"):
            async with admission.slot("alice"):
                pass
        group.start_soon(hold, "bob")
        await anyio.wait_all_tasks_blocked()
        assert admission.waiting_of("bob") == 1
        release.set()
    assert admission.running == admission.waiting == 0


async def test_a_waiter_cancelled_or_timed_out_leaves_the_queue_and_frees_its_turn() -> None:
    admission = Admission(1, 4, 0.05, tenant_limit=1, tenant_queue=4)
    release = anyio.Event()

    async def hold() -> None:
        async with admission.slot("alice"):
            await release.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(hold)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(BusyError, match="no run slot came free"):
            async with admission.slot("bob"):
                pass
        with anyio.move_on_after(0.01):
            async with admission.slot("carol"):
                pass
        assert admission.waiting == 0
        release.set()
    async with admission.slot("bob"):
        assert admission.running == 1


async def test_a_tenant_with_nothing_queued_takes_the_place_of_the_newest_run_of_the_busiest_tenant() -> None:
    admission = Admission(2, 4, 5.0, tenant_limit=2, tenant_queue=16)
    release = anyio.Event()
    outcomes: dict[str, str] = {}

    async def run(tenant: str, label: str) -> None:
        try:
            async with admission.slot(tenant):
                outcomes[label] = "ran"
                await release.wait()
        except BusyError as exc:
            outcomes[label] = f"busy: {exc}"

    async with anyio.create_task_group() as group:
        for index in range(6):  # alice fills both slots and the whole queue
            group.start_soon(run, "alice", f"a{index}")
            await anyio.wait_all_tasks_blocked()
        assert (admission.running, admission.waiting) == (2, 4)
        with pytest.raises(BusyError, match="the most this server accepts"):  # alice's own is still refused
            async with admission.slot("alice"):
                pass
        group.start_soon(run, "bob", "b0")
        await anyio.wait_all_tasks_blocked()
        assert outcomes["a5"].startswith("busy: ") and "the most this server accepts" in outcomes["a5"]
        assert (admission.waiting_of("alice"), admission.waiting_of("bob")) == (3, 1)
        group.start_soon(run, "carol", "c0")  # alice still has the most queued
        await anyio.wait_all_tasks_blocked()
        assert "busy" in outcomes["a4"]
        assert (admission.waiting_of("alice"), admission.waiting_of("bob"), admission.waiting_of("carol")) == (2, 1, 1)
        release.set()
    assert outcomes["b0"] == outcomes["c0"] == "ran"
    assert [outcomes[f"a{index}"] for index in range(4)] == ["ran"] * 4


async def test_tenants_with_one_queued_run_each_do_not_push_each_other_out() -> None:
    admission = Admission(1, 2, 5.0, tenant_limit=1, tenant_queue=4)
    release = anyio.Event()

    async def hold(tenant: str) -> None:
        async with admission.slot(tenant):
            await release.wait()

    async with anyio.create_task_group() as group:
        for tenant in ("alice", "bob", "carol"):
            group.start_soon(hold, tenant)
            await anyio.wait_all_tasks_blocked()
        with pytest.raises(BusyError, match="the most this server accepts"):
            async with admission.slot("dave"):
                pass
        assert (admission.waiting_of("bob"), admission.waiting_of("carol")) == (1, 1)
        release.set()
