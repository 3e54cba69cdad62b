"""Domain patterns and host names: checked, normalised and matched (for the rules and the secrets).

A pattern is a host name (``example.com``: that name only), ``*.example.com`` (any name under
it, not the name itself), or ``*`` (any host name). Every refusal is a :class:`Refusal` whose
``rule`` names the setting (or check) that refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Refusal", "check_pattern", "normal_host", "pattern_matches"]

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_MAX_HOST = 253


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a connection was refused: ``rule`` names the setting or check, ``message`` says it for a person."""

    rule: str
    message: str


def normal_host(host: str) -> str | Refusal:
    """``host`` lower-cased without a trailing dot, or why it is no host name at all."""
    if any(ord(char) < 0x21 or ord(char) == 0x7F for char in host):
        return Refusal("host_syntax", "the host name holds a control character, a space or NUL")
    name = host.lower().removesuffix(".")
    if not name or len(name) > _MAX_HOST or not all(_LABEL.match(label) for label in name.split(".")):
        return Refusal("host_syntax", "the host is not a valid host name (ASCII letters, digits, '-', '.')")
    return name


def check_pattern(pattern: str) -> str:
    """``pattern`` normalised (lower case, no trailing dot).

    Raises:
        ValueError: it is not ``*``, a host name, or ``*.`` and a host name.
    """
    if pattern == "*":
        return pattern
    rest = pattern.removeprefix("*.")
    name = normal_host(rest)
    if isinstance(name, Refusal):
        raise ValueError(f"{pattern!r} is not a domain pattern (example.com, *.example.com or *)")
    return f"*.{name}" if pattern.startswith("*.") else name


def pattern_matches(pattern: str, host: str) -> bool:
    """Whether the normalised ``host`` is one ``pattern`` names."""
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern
