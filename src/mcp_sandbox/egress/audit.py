"""The egress audit log's lines: one JSON line per connection a run opened (or tried), up to a cap.

A line holds when, whose run (tenant, conversation, run id), where to (host, port, the address
connected to), how many bytes each way, the verdict (``allowed``, ``refused``, ``cut``) and the
rule that decided, and the names of the secrets applied (never a value). Never a header, a
path, a query or a body: those may carry secrets. The file is written, rotated and kept
private by :class:`mcp_sandbox.audit.AuditLog`. Past
:data:`LINES_PER_RUN` lines a run's connections are counted by verdict, and the run's last line
sums them (:func:`summary_line`): cheap runs cannot rotate everyone's records out of the files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["LINES_PER_RUN", "AuditRecord", "Connection", "Verdict", "summary_line"]

Verdict = Literal["allowed", "refused", "cut"]
LINES_PER_RUN = 32


@dataclass(slots=True)
class Connection:
    """What the proxy learns of one connection while serving it: its audit line in the making."""

    host: str
    port: int
    method: str
    address: str | None = None
    sent: int = 0
    received: int = 0
    verdict: Verdict = "refused"
    rule: str = "request"
    secrets: tuple[str, ...] = ()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def summary_line(tenant: str, conversation: str | None, run: str, unlogged: Mapping[str, int]) -> str:
    """The line that ends a run's lines past the cap: how many connections of each verdict had none."""
    fields = {"tenant": tenant, "conversation": conversation, "run": run, "unlogged": dict(sorted(unlogged.items()))}
    return json.dumps({"time": _now(), **fields})


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One connection as the audit log keeps it."""

    tenant: str
    conversation: str | None
    run: str
    host: str
    port: int
    verdict: Verdict
    rule: str
    address: str | None = None
    sent: int = 0  # bytes from the sandbox
    received: int = 0  # bytes to the sandbox
    method: str = "CONNECT"
    secrets: tuple[str, ...] = ()  # the names of the secrets applied (a host with a secret's rule)
    trace_id: str | None = None  # the run's trace, where it is traced

    def span_attributes(self) -> dict[str, str | int]:
        """The connection as its span says it: where to (the host and method the code asked for, cut to a host
        name's and a method's longest), the verdict and its rule, bytes each way, the secrets' names."""
        attributes: dict[str, str | int] = {
            "server.address": self.host[:253],
            "server.port": self.port,
            "http.request.method": self.method[:16],
            "mcp_sandbox.egress.verdict": self.verdict,
            "mcp_sandbox.egress.rule": self.rule,
            "mcp_sandbox.egress.sent_bytes": self.sent,
            "mcp_sandbox.egress.received_bytes": self.received,
        }
        if self.address is not None:
            attributes["network.peer.address"] = self.address
        if self.secrets:
            attributes["mcp_sandbox.egress.secrets"] = ",".join(self.secrets)
        return attributes

    def line(self) -> str:
        """The log's line for this connection: the time (to the second, UTC) then the fields (``secrets`` and
        ``trace_id`` if any)."""
        fields = asdict(self)
        if not self.secrets:
            del fields["secrets"]
        if self.trace_id is None:
            del fields["trace_id"]
        return json.dumps({"time": _now(), **fields})
