"""A run's secrets at the proxy: each with its fresh placeholder, the hosts it applies to, and the echo scrubber.

A run granted network gets every secret of its tenant (:mod:`mcp_sandbox.config.secrets`
declares them), each bound to a placeholder made for that run alone (so never shared by two
tenants, two runs, or a fork and its source). The code sees the placeholder (in
``placeholder_env``); the proxy puts the real value in the request's header on the way out
(:mod:`.intercept`) and puts the placeholder back wherever a response echoes the value
(:class:`Scrubber`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mcp_sandbox.config import SecretSpec
from mcp_sandbox.egress.patterns import pattern_matches

__all__ = ["PLACEHOLDER_PREFIX", "BoundSecret", "Scrubber", "bind", "foreign_placeholder", "secrets_for"]

PLACEHOLDER_PREFIX = "mcpsbx-secret-"


@dataclass(frozen=True, slots=True)
class BoundSecret:
    """A secret as one run has it: its declaration, normalised hosts, and the run's placeholder."""

    spec: SecretSpec
    hosts: tuple[str, ...]
    placeholder: str

    @property
    def name(self) -> str:
        """The secret's name (what ``list_runners`` and the audit log show)."""
        return self.spec.name

    def applies_to(self, host: str) -> bool:
        """Whether the normalised ``host`` is one this secret may go to."""
        return any(pattern_matches(pattern, host) for pattern in self.hosts)


def bind(declared: Iterable[tuple[SecretSpec, tuple[str, ...]]]) -> tuple[BoundSecret, ...]:
    """The ``declared`` secrets (with their normalised hosts) bound to fresh placeholders, for one run."""
    return tuple(
        BoundSecret(spec, hosts, f"{PLACEHOLDER_PREFIX}{spec.name}-{secrets.token_hex(16)}") for spec, hosts in declared
    )


def secrets_for(bound: Sequence[BoundSecret], host: str) -> tuple[BoundSecret, ...]:
    """The secrets of ``bound`` that apply to ``host`` (a connection the proxy then terminates)."""
    return tuple(secret for secret in bound if secret.applies_to(host))


def foreign_placeholder(bound: Sequence[BoundSecret], host: str | None, data: bytes) -> BoundSecret | None:
    """A secret whose placeholder ``data`` carries to ``host``, which it may not go to (None: to no host)."""
    for secret in bound:
        if (host is None or not secret.applies_to(host)) and secret.placeholder.encode() in data:
            return secret
    return None


class Scrubber:
    """Replaces each real value in a stream with its placeholder, across chunk boundaries.

    It keeps back the last ``len(longest value) - 1`` bytes of what it has seen (a value may
    continue in the next chunk) until :meth:`flush`.
    """

    def __init__(self, applied: Sequence[BoundSecret]) -> None:
        """Scrub the values of ``applied``."""
        self._pairs = [(secret.spec.value.reveal().encode(), secret.placeholder.encode()) for secret in applied]
        self._keep = max((len(value) for value, _ in self._pairs), default=1) - 1
        self._held = b""

    def scrub(self, data: bytes) -> bytes:
        """``data`` with the values replaced, as complete text (for a head)."""
        for value, placeholder in self._pairs:
            data = data.replace(value, placeholder)
        return data

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far can be passed on, scrubbed."""
        data = self.scrub(self._held + chunk)
        cut = max(len(data) - self._keep, 0)
        self._held = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        """The rest, at the stream's end."""
        data, self._held = self.scrub(self._held), b""
        return data
