"""Tenants' host uids: the range's checks, at configuration and at start, and assignments that are
distinct, stable across restarts and shared by servers of one state directory."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings, with_tenant_caps
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import TenantUids, check_tenant_uids

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="tenants get uids of their own only from a root server")


def _settings(state_dir: Path, **flags: object) -> Settings:
    return load_settings(env={}, flags={"state_dir": str(state_dir), **flags})


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0-100", "uid 0"),
        ("500-400", "ends before"),
        ("1000", "FIRST-LAST"),
        ("a-b", "FIRST-LAST"),
        ("1-4294967295", "largest uid"),
    ],
)
def test_a_malformed_or_root_including_range_is_refused(tmp_path: Path, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match="tenant_uid_range") as caught:
        _settings(tmp_path, tenant_uid_range=value)
    assert says in str(caught.value)


def test_a_range_including_the_default_tenants_uid_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sandbox_uid"):
        _settings(tmp_path, sandbox_uid=5000, tenant_uid_range="4000-6000")


@root_only
def test_a_range_including_a_login_user_is_refused_at_start(tmp_path: Path) -> None:
    user = next(entry for entry in pwd.getpwall() if entry.pw_uid > 0)
    settings = _settings(tmp_path, tenant_uid_range=f"{user.pw_uid}-{user.pw_uid}", sandbox_uid=4_000_000)
    with pytest.raises(ConfigError, match=f"user {user.pw_name}'s"):
        check_tenant_uids(settings.sandbox, settings.tenant_count)


@root_only
def test_a_range_overlapping_subordinate_uids_is_refused_at_start(tmp_path: Path) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("someone:1879100000:65536\n")
    with pytest.raises(ConfigError, match="someone's subordinate uids"):
        check_tenant_uids(_settings(tmp_path).sandbox, 1, subuid=subuid)
    check_tenant_uids(_settings(tmp_path, tenant_uid_range="1879000000-1879099999").sandbox, 1, subuid=subuid)


@root_only
def test_a_range_smaller_than_the_tenants_is_refused_at_start(tmp_path: Path) -> None:
    settings = with_tenant_caps(_settings(tmp_path, tenant_uid_range="1879048192-1879048193"), 3)
    with pytest.raises(ConfigError, match="fewer than the 3 tenants"):
        check_tenant_uids(settings.sandbox, settings.tenant_count, subuid=tmp_path / "none")


@root_only
def test_the_default_range_collides_with_no_user_or_subordinate_range_here(tmp_path: Path) -> None:
    check_tenant_uids(_settings(tmp_path).sandbox, 1)


@root_only
def test_tenants_get_distinct_uids_that_survive_a_restart(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "state", tenant_uid_range="1879048192-1879048195")
    first = TenantUids(settings.sandbox, StateLayout.of(settings.paths, settings.sandbox, settings.workspaces))
    assert first.known("alice") is None  # not given yet: the engine asks uid() (in a worker thread)
    uids = {tenant: first.uid(tenant) for tenant in ("alice", "bob", "carol", "dave")}
    assert {tenant: first.known(tenant) for tenant in uids} == uids  # then given on the event loop, no thread
    assert len(set(uids.values())) == 4  # a collision of the name's place takes the next free uid
    assert set(uids.values()) == set(range(1879048192, 1879048196))
    assert first.uid("default") == settings.sandbox.sandbox_uid
    assert first.ids("alice") == (uids["alice"], settings.sandbox.sandbox_gid)
    # Another server on the state directory (or this one restarted) reads the same table.
    again = TenantUids(settings.sandbox, StateLayout.of(settings.paths, settings.sandbox, settings.workspaces))
    assert {tenant: again.uid(tenant) for tenant in reversed(list(uids))} == uids
    table = tmp_path / "state" / "tenant-uids.json"
    assert json.loads(table.read_text()) == uids
    assert table.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match="all 4 uids"):
        again.uid("erin")


@root_only
def test_with_the_range_off_every_tenant_runs_as_the_sandbox_uid(tmp_path: Path) -> None:
    settings = _settings(tmp_path, tenant_uid_range="off")
    uids = TenantUids(settings.sandbox, StateLayout.of(settings.paths, settings.sandbox, settings.workspaces))
    assert uids.uid("alice") == settings.sandbox.sandbox_uid
    assert uids.is_default("alice")
    assert not (tmp_path / "tenant-uids.json").exists()
