"""The disk a copy reserves (``ChangeGate.reserving``): checked against the budgets when made and as it grows."""

from __future__ import annotations

import pytest

from mcp_sandbox.errors import QuotaExceededError
from mcp_sandbox.workspace.changes import ChangeGate

BUDGETS = (100, 1000)  # the tenant's, the server's


def test_a_reservation_grows_within_the_budgets_and_is_refused_past_them_with_the_others_counted() -> None:
    gate = ChangeGate()
    with gate.reserving("alice", 30, (20, 20), BUDGETS) as first, gate.reserving("alice", 10, (20, 20), BUDGETS):
        first.grow(40)  # 20 held + 30 + 10 + 40 = 100: at the budget
        with pytest.raises(QuotaExceededError, match="tenant_workspaces_bytes"):
            first.grow(1)
        assert first.size == 70  # the refused byte was not reserved
        with pytest.raises(QuotaExceededError):
            gate.reserving("alice", 1, (20, 20), BUDGETS).__enter__()
    with gate.reserving("alice", 80, (20, 20), BUDGETS) as again:  # everything given back, growth too
        assert again.size == 80


def test_growth_is_checked_against_the_servers_budget_across_tenants() -> None:
    gate = ChangeGate()
    with gate.reserving("alice", 0, (0, 900), (None, 1000)) as alice, gate.reserving("bob", 50, (0, 900), (None, 1000)):
        alice.grow(50)
        with pytest.raises(QuotaExceededError, match="max_workspaces_bytes"):
            alice.grow(1)
