"""Why a forwarded upload was refused, carried in the tool result's ``_meta`` so the HTTP answer agrees.

An upload that lands on a replica not running its conversation is stored by the owner's
``upload_file``, whose refusal is a text result. Its ``_meta`` says which refusal it was (quota
with its figures, full disk, the lease lost, an outage, other), so the receiving replica raises the same error
and answers the same HTTP status (413, 507, 503, 409) as the owner would have answered the upload itself.
"""

from __future__ import annotations

from typing import Any

from mcp_sandbox.errors import DiskFullError, LeaseLostError, QuotaExceededError, UnavailableError, WorkspaceError

__all__ = ["REFUSAL_META", "http_status", "refusal_meta", "refusal_of"]

REFUSAL_META = "mcp-sandbox/refused"


def refusal_meta(exc: Exception) -> dict[str, Any] | None:
    """The ``_meta`` of the tool result refusing with ``exc`` (None: not a workspace refusal)."""
    if isinstance(exc, QuotaExceededError):
        return {REFUSAL_META: {"kind": "quota", "limit": exc.limit, "used": exc.used, "quota": exc.quota}}
    if isinstance(exc, DiskFullError):
        return {REFUSAL_META: {"kind": "disk"}}
    if isinstance(exc, LeaseLostError):
        return {REFUSAL_META: {"kind": "lease"}}
    if isinstance(exc, UnavailableError):
        return {REFUSAL_META: {"kind": "unavailable", "service": exc.service}}
    return None


def refusal_of(meta: dict[str, Any] | None, message: str) -> WorkspaceError:
    """The error the owner refused with, from its result's ``_meta`` and text."""
    found = (meta or {}).get(REFUSAL_META)
    kind = found.get("kind") if isinstance(found, dict) else None
    if kind == "quota" and isinstance(found, dict):
        return QuotaExceededError(
            str(found.get("limit")), int(found.get("used", 0)), int(found.get("quota", 0)), message
        )
    if kind == "disk":
        return DiskFullError(message)
    if kind == "lease":
        return LeaseLostError(message)
    if kind == "unavailable" and isinstance(found, dict):
        return UnavailableError(str(found.get("service", "a service the server needs")))
    return WorkspaceError(message)


def http_status(exc: WorkspaceError) -> int:
    """The HTTP status of an upload refused with ``exc``: 413 over the quota, 507 a full disk, 503 the
    lease lost (send it again: the balancer reaches the replica that runs the conversation now), else 409."""
    if isinstance(exc, QuotaExceededError):
        return 413
    if isinstance(exc, DiskFullError):
        return 507
    return 503 if isinstance(exc, LeaseLostError | UnavailableError) else 409
