"""The metrics answer an operator's questions: causes, paths, egress; the shipped dashboard and alert rules.

The end-to-end check (scraping a real server after known runs, and comparing the dashboard's
queries with what it exports) is in test_service.py; the egress counters after real connections
are in tests/egress/test_egress.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mcp_sandbox.events import EgressConnection, FilesUnsaved
from mcp_sandbox.events import RunFinished as Run
from mcp_sandbox.server.metrics import Metrics, failure_cause

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
ALERTS = DEPLOY / "prometheus-alerts.yml"


def run(status: str, *, limits: tuple[str, ...] = (), exit_code: int | None = 1, truncated: bool = False) -> Run:
    return Run("alice", None, "python", "bwrap", status, 0.001, limits=limits, exit_code=exit_code, truncated=truncated)


@pytest.mark.parametrize(
    ("event", "cause"),
    [
        (run("success", exit_code=0), None),
        (run("success", exit_code=0, truncated=True), "output_cap"),
        (run("timeout", limits=("timeout",), exit_code=None), "timeout"),
        (run("error", limits=("memory",), exit_code=137), "memory_limit"),
        (run("error", limits=("pids",)), "pids_limit"),
        (run("error", limits=("cpu",), exit_code=152), "cpu_limit"),
        (run("error", limits=("file_size",), exit_code=153), "file_size_limit"),
        (run("error", limits=("disk",), exit_code=None), "disk_limit"),
        (run("error", exit_code=-9), "killed"),
        (run("error", exit_code=1), "error"),
        (run("busy", exit_code=None), "busy"),
    ],
)
def test_each_failure_is_counted_under_its_cause(event: Run, cause: str | None) -> None:
    assert failure_cause(event) == cause


def test_warm_runs_resolve_below_a_millisecond_and_there_are_no_created_series() -> None:
    metrics = Metrics(dict, dict)
    metrics.observe(Run("alice", None, "python", "bwrap", "success", 0.0008, warm=True, path="warm"))
    metrics.observe(EgressConnection("alice", "refused", "egress_allow", 120, 0))
    text = metrics.render().decode()
    bucket = 'mcp_sandbox_run_duration_seconds_bucket{backend="bwrap",language="python",le="%s",path="warm"}'
    assert f"{bucket % '0.0005'} 0.0" in text
    assert f"{bucket % '0.001'} 1.0" in text
    assert 'mcp_sandbox_egress_connections_total{rule="egress_allow",tenant="alice",verdict="refused"} 1.0' in text
    assert 'mcp_sandbox_egress_bytes_total{direction="out"} 120.0' in text
    assert "_created" not in text


def test_each_run_is_counted_in_the_series_of_its_own_labels_however_often_they_recur() -> None:
    metrics = Metrics(dict, dict)
    runs = [
        ("alice", "success", "warm"),
        ("bob", "success", "warm"),
        ("alice", "error", "warm"),
        ("alice", "success", "fresh"),
    ]
    for _ in range(3):  # each series found again after its first run
        for tenant, status, path in runs:
            metrics.observe(Run(tenant, None, "python", "bwrap", status, 0.003, exit_code=0, path=path))
    text = metrics.render().decode()
    counted = 'mcp_sandbox_runs_total{backend="bwrap",language="python",status="%s",tenant="%s"} %s'
    assert counted % ("success", "alice", "6.0") in text  # warm and fresh: one series of the counter
    assert counted % ("success", "bob", "3.0") in text
    assert counted % ("error", "alice", "3.0") in text
    timed = 'mcp_sandbox_run_duration_seconds_count{backend="bwrap",language="python",path="%s"} %s'
    assert timed % ("warm", "9.0") in text and timed % ("fresh", "3.0") in text


def test_files_not_saved_are_counted_by_stage() -> None:
    metrics = Metrics(dict, dict)
    metrics.observe(FilesUnsaved("a" * 64, "write_back", 2))
    metrics.observe(FilesUnsaved("a" * 64, "restore", 1))
    text = metrics.render().decode()
    assert 'mcp_sandbox_unsaved_files_total{stage="write_back"} 2.0' in text
    assert 'mcp_sandbox_unsaved_files_total{stage="restore"} 1.0' in text
    assert "McpSandboxFilesNotSaved" in ALERTS.read_text()


def test_the_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        reason = "promtool is missing: `make promtool` installs Debian's prometheus package, which ships it"
        if "promtool" in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
            pytest.fail(reason)
        pytest.skip(reason)
    checked = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout


def dashboard_metrics() -> set[str]:
    """The metric names the dashboard's queries read."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = [target["expr"] for panel in panels for target in panel["targets"]]
    return {name for query in queries for name in re.findall(r"\bmcp_sandbox_[a-z_]+", query)}


def test_the_dashboard_has_a_panel_per_question() -> None:
    titles = [panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"]]
    for question in ("Runs per tenant", "latency by path", "Failures by cause", "pool", "Queue", "Egress decisions",
                     "Egress bytes", "Downstream calls"):  # fmt: skip
        assert any(question in title for title in titles), question
    assert "mcp_sandbox_run_duration_seconds_bucket" in dashboard_metrics()
