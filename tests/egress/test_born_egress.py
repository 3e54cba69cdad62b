"""Sessions born of session-ready sandboxes where network may be granted: the ready sandbox holds the
relay and the empty socket directory a session's does, so only the per-run grant differs.

Each run says whether its interpreter is a session-ready sandbox's runner (``boot.py --ready=...``),
so these tests cannot pass on a session started from nothing. A born session without a grant has
no route out; one granted network reaches only its allowed names, and only during granted runs.
"""

from __future__ import annotations

import json
import os
import textwrap
import uuid
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.engine import Engine

from .conftest import EgressEngine, HostNet, audit_lines, execute, granted
from .test_egress import ALLOW, fetching, private

pytestmark = [pytest.mark.anyio]

_PROBE = """
import errno, os, socket
def direct():
    try:
        socket.create_connection(("{address}", 80), timeout=3)
        return "ok"
    except OSError as error:
        return errno.errorcode.get(error.errno or 0, type(error).__name__)
born = b'--ready=' in open('/proc/self/cmdline', 'rb').read()
print(json.dumps([born, fetch("http://web.test/")[0], fetch("http://other.test/")[0], direct(),
                  "HTTPS_PROXY" in os.environ]))
"""


def _probe(test_net: HostNet) -> str:
    return fetching(test_net, textwrap.dedent(_PROBE).format(address=test_net.address))


def _conversation(engine: Engine, root: Path) -> Path:
    """A conversation's directory as the workspace store makes one (0700, the sandbox uid's)."""
    directory = root / f"conversation-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(directory, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
    return directory


async def _ready(engine: Engine) -> None:
    engine.ready.wake()
    with anyio.fail_after(60):
        while engine.ready.idle < 1:  # noqa: ASYNC110 - the pool has no event to wait on
            await anyio.sleep(0.05)


async def test_a_born_session_without_a_grant_has_no_route_out_and_a_granted_one_reaches_only_its_names(
    egress_engine: EgressEngine, test_net: HostNet, state_dir: Path
) -> None:
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net), "pool_size": 0, "pool_min": 0}
    async with egress_engine(**flags) as (engine, egress):
        await _ready(engine)
        closed = await execute(
            engine, _probe(test_net), None, session="closed", workspace=_conversation(engine, state_dir)
        )
        assert closed.status == "success", closed.stderr
        assert json.loads(closed.stdout) == [True, "failed", "failed", "ENETUNREACH", False]
        assert audit_lines(engine) == []  # nothing reached the proxy

        await _ready(engine)
        workspace = _conversation(engine, state_dir)
        opened = await execute(engine, _probe(test_net), granted(egress), session="open", workspace=workspace)
        assert opened.status == "success", opened.stderr
        # web.test allowed, other.test refused by the proxy (403), no route but through it.
        assert json.loads(opened.stdout) == [True, 200, 403, "ENETUNREACH", True]
        later = await execute(engine, _probe(test_net), None, session="open", workspace=workspace)
        assert later.session == "kept"
        assert json.loads(later.stdout)[1:] == ["failed", "failed", "ENETUNREACH", False]  # the grant was that run's
    verdicts = sorted((line["host"], line["verdict"]) for line in audit_lines(engine))
    assert verdicts == [("other.test", "refused"), ("web.test", "allowed")]


_TENANT_PROBE = """
born = b'--ready=' in open('/proc/self/cmdline', 'rb').read()
open('/workspace/mine', 'w').write('x')
print(json.dumps([born, fetch("http://web.test/")[0], fetch("http://other.test/")[0]]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="tenants get host uids of their own only from a root server")
async def test_a_token_tenants_network_run_is_born_of_its_own_uids_sandbox_with_only_its_own_allowlist(
    egress_engine: EgressEngine, test_net: HostNet, state_dir: Path
) -> None:
    # Attack: bob's names through a sandbox born for alice, alice's through bob's. Each tenant's born
    # network run is of its own uid's ready sandbox and its proxy lets through only its own tenant's names.
    tables = "".join(
        f'[tenants.{tenant}]\negress_allow = ["{name}"]\negress_allow_private = ["{private(test_net)}"]\n'
        for tenant, name in (("alice", "web.test"), ("bob", "other.test"))
    )
    flags = {"pool_size": 0, "pool_min": 0, "session_ready": 1, "tenant_concurrent_runs": 1}
    async with egress_engine(config=tables, **flags) as (engine, egress):
        uids = engine.tenant_uids

        def conversation(tenant: str) -> Path:
            directory = state_dir / f"{tenant}-{uuid.uuid4().hex[:8]}"
            directory.mkdir(mode=0o700)
            os.chown(directory, uids.uid(tenant), engine.settings.sandbox.sandbox_gid)
            return directory

        for tenant in ("alice", "bob"):  # each tenant's first conversation run makes its uid's pool
            workspace = conversation(tenant)
            made = await execute(engine, "print(1)", None, session=workspace.name, workspace=workspace, tenant=tenant)
            assert made.status == "success", made.stderr
        for tenant in ("alice", "bob"):
            with anyio.fail_after(90):
                while (pool := engine.ready_pools.of(uids.uid(tenant))) is None or pool.idle < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.05)

        seen = {}
        for tenant in ("alice", "bob"):
            workspace = conversation(tenant)
            grant = egress.grant(tenant, True, workspace.name)
            code = fetching(test_net, textwrap.dedent(_TENANT_PROBE))
            run = await execute(engine, code, grant, session=workspace.name, workspace=workspace, tenant=tenant)
            assert (run.status, run.path) == ("success", "born"), run.stderr
            seen[tenant] = (json.loads(run.stdout), os.stat(workspace / "mine").st_uid)

    assert seen == {
        "alice": ([True, 200, 403], uids.uid("alice")),
        "bob": ([True, 403, 200], uids.uid("bob")),
    }
    assert uids.uid("alice") != uids.uid("bob") != engine.settings.sandbox.sandbox_uid
