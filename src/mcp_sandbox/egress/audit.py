"""The egress audit log's lines: one JSON line per connection a run opened (or tried).

A line holds when, whose run (tenant, conversation, run id), where to (host, port, the address
connected to), how many bytes each way, the verdict (``allowed``, ``refused``, ``cut``) and the
rule that decided. Never a header, a path, a query or a body: those may carry secrets. The file
is written, rotated and kept private by :class:`mcp_sandbox.audit.AuditLog`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["AuditRecord", "Verdict"]

Verdict = Literal["allowed", "refused", "cut"]


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

    def line(self) -> str:
        """The log's line for this connection: the time (to the second, UTC) then the fields."""
        return json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **asdict(self)})
