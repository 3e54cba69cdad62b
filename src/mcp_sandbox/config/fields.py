"""How a setting is declared: its default, what it does, how it is written and the check of its value.

Each field of :class:`~mcp_sandbox.config.settings.Settings` is one :func:`setting` (or
:func:`computed`, for a default that depends on the host): the description the settings table
shows, the unit its value is written in (:data:`BYTES`, :data:`DURATION`), the earlier systems'
environment variable for it, and its check. :func:`check_fields` runs every check in one loop.
"""

from __future__ import annotations

import ipaddress
import math
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import Field, field, fields
from typing import Any, Literal, TypeVar

from mcp_sandbox.errors import ConfigError

__all__ = [
    "BYTES",
    "DATABASE_SCHEMES",
    "DURATION",
    "Check",
    "Unit",
    "address_ranges",
    "check_fields",
    "computed",
    "database_url",
    "duration",
    "duration_or_zero",
    "host_id",
    "host_id_range",
    "http_url",
    "internal",
    "language_images",
    "module_names",
    "non_negative",
    "object_store_url",
    "one_of",
    "piece",
    "port",
    "ports",
    "positive",
    "positive_number",
    "requirements",
    "seconds",
    "secret",
    "setting",
    "setting_fields",
]

T = TypeVar("T")

Check = Callable[[str, Any], None]
Unit = Literal["bytes", "duration"]
BYTES: Unit = "bytes"
DURATION: Unit = "duration"


def setting(
    default: T,
    doc: str,
    *,
    check: Check | None = None,
    unit: Unit | None = None,
    alias: str | None = None,
    secret: bool = False,
) -> T:
    """A setting with a fixed default; ``doc`` is its line of the settings table."""
    meta = {"doc": doc, "check": check, "unit": unit, "alias": alias}
    return field(default=default, repr=not secret, metadata=meta)


def computed(
    factory: Callable[[], T], doc: str, shown: str, *, check: Check | None = None, alias: str | None = None
) -> T:
    """A setting whose default depends on the host; ``shown`` says that default in the table."""
    meta = {"doc": doc, "check": check, "unit": None, "alias": alias, "shown": shown}
    return field(default_factory=factory, metadata=meta)


def piece(cls: Callable[[], T]) -> T:
    """A piece of the settings (:mod:`.pieces`, :mod:`.server_pieces`): its defaults unless given."""
    return field(default_factory=cls, metadata={"piece": True})


def internal(default: T) -> T:
    """A field that is not a setting anyone gives (where the settings came from, and what they hold)."""
    return field(default=default, metadata={"internal": True})


def setting_fields(cls: type) -> dict[str, Field[Any]]:
    """The settings of ``cls`` by name, in declaration order (its internal fields and pieces left out)."""
    return {f.name: f for f in fields(cls) if "doc" in f.metadata}


def check_fields(settings: object) -> None:
    """Run the check of every setting declared by ``settings``' class, in declaration order.

    Raises:
        ConfigError: a value is out of range, naming its setting.
    """
    for name, declaration in setting_fields(type(settings)).items():
        check: Check | None = declaration.metadata.get("check")
        if check is not None:
            check(name, getattr(settings, name))


# --- the checks: each raises ConfigError naming the setting ------------------------------------


def positive(name: str, value: int | None) -> None:
    """A count or size above zero (None, where allowed, means: decided elsewhere)."""
    if value is not None and value <= 0:
        raise ConfigError(f"{name}: must be positive")


def non_negative(name: str, value: int | None) -> None:
    """A count of zero or more (None, where allowed, means: decided elsewhere)."""
    if value is not None and value < 0:
        raise ConfigError(f"{name}: must not be negative")


def duration(name: str, value: float) -> None:
    """A finite number of seconds above zero."""
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a positive duration")


def duration_or_zero(name: str, value: float) -> None:
    """A finite number of seconds, zero allowed."""
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}: must be a duration >= 0")


def seconds(name: str, value: float) -> None:
    """A finite number of seconds above zero (a timeout)."""
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a positive number of seconds")


def positive_number(name: str, value: float) -> None:
    """A finite number above zero."""
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a positive number")


def port(name: str, value: int | None) -> None:
    """A TCP port (None, where allowed: none)."""
    if value is not None and not 0 < value < 65536:
        raise ConfigError(f"{name}: {value} is not a TCP port")


def ports(name: str, values: Iterable[int]) -> None:
    """TCP ports."""
    for value in values:
        port(name, value)


def address_ranges(name: str, values: Iterable[str]) -> None:
    """Address ranges (CIDRs; a single address is a range of one)."""
    for cidr in values:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise ConfigError(f"{name}: {cidr!r} is not an address range ({exc})") from exc


def module_names(name: str, values: Iterable[str]) -> None:
    """Python module names (dotted)."""
    for module in values:
        if not all(part.isidentifier() for part in module.split(".")):
            raise ConfigError(f"{name}: {module!r} is not a module name")


# ``s3://bucket`` or ``s3://bucket/prefix``: S3's bucket-name rules (3-63 of a-z 0-9 . -), a prefix of
# printable characters with no empty segment.
_OBJECT_STORE_RE = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[A-Za-z0-9!_.*'()-]+)*/?$")


def object_store_url(name: str, value: str | None) -> None:
    """``s3://bucket/prefix``, or None (the workspaces on local disk only)."""
    if value is not None and not _OBJECT_STORE_RE.match(value):
        raise ConfigError(
            f"{name}: {value!r} is not s3://bucket or s3://bucket/prefix (a bucket of 3-63 characters a-z 0-9 . -; "
            "the endpoint and credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        )


def http_url(name: str, value: str | None) -> None:
    """An http(s) URL, or None; an IPv6 address in brackets (``http://[fd00::1]:8765``)."""
    if value is None:
        return
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
        raise ConfigError(f"{name}: {value!r} is not an http(s) URL")
    host = urllib.parse.urlsplit(value).netloc.rpartition("@")[2]
    if not host.startswith("[") and host.count(":") > 1:  # fd00::1:8765: an address, or one and a port?
        raise ConfigError(f"{name}: {value!r} has an IPv6 address without brackets: write http://[ADDRESS]:PORT")
    try:
        urllib.parse.urlsplit(value).port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ConfigError(f"{name}: {value!r} has no valid port: {exc}") from None


# What ``database_url`` accepts (libpq's two spellings); unset means the SQLite file in ``state_dir``.
DATABASE_SCHEMES = ("postgresql", "postgres")


def otlp_endpoint(name: str, value: str | None) -> None:
    """An ``http://`` or ``https://`` URL with a host, or None. The message never repeats the value (a collector's
    URL may carry credentials)."""
    if value is None:
        return
    parts = urllib.parse.urlsplit(value)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name}: not an http:// or https:// URL of an OTLP collector (e.g. http://127.0.0.1:4317)")


def database_url(name: str, value: str | None) -> None:
    """A ``postgresql://`` URL, or None. The message never repeats the value: it may hold a password."""
    if value is None:
        return
    accepted = ", ".join(f"{scheme}://" for scheme in DATABASE_SCHEMES)
    scheme, found, _ = value.partition("://")
    if not found:
        raise ConfigError(f"{name}: not a URL; accepted: {accepted} (unset: the SQLite file in state_dir)")
    if scheme.lower() not in DATABASE_SCHEMES:
        # Named only when it looks like a scheme: text before "://" may be part of a password.
        named = f"the scheme {scheme!r}" if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,19}", scheme) else "its scheme"
        raise ConfigError(
            f"{name}: {named} is not supported; accepted: {accepted} (unset: the SQLite file in state_dir)"
        )
    try:
        urllib.parse.urlsplit(value).port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise ConfigError(f"{name}: the URL's port is not a number from 1 to 65535") from None


def one_of(choices: Iterable[str]) -> Check:
    """One of ``choices``."""
    allowed = tuple(choices)

    def check(name: str, value: str) -> None:
        if value not in allowed:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(allowed)}")

    return check


def language_images(name: str, values: Iterable[str]) -> None:
    """``LANGUAGE=IMAGE`` entries."""
    for entry in values:
        language, _, image = entry.partition("=")
        if not language.strip() or not image.strip():
            raise ConfigError(f"{name}: {entry!r} is not LANGUAGE=IMAGE")


def requirements(name: str, values: Iterable[str]) -> None:
    """pip requirement strings (``scipy==1.14.1``), not options."""
    values = tuple(values)
    if not values:
        return  # the usual case: packaging compiles its parser's regexes at import
    from packaging.requirements import InvalidRequirement, Requirement

    for text in values:
        # An option (`--index-url ...`, `-e ...`) would be one to pip, not a package.
        if text.startswith("-"):
            raise ConfigError(f"{name}: {text!r} is an option, not a requirement (e.g. scipy==1.14.1)")
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            raise ConfigError(f"{name}: {text!r} is not a requirement: {exc}") from exc


def secret(name: str, value: str | None) -> None:
    """A bearer token of at least 16 characters, or None."""
    if value is not None and len(value.strip()) < 16:
        raise ConfigError(f"{name}: must be at least 16 characters (a random one: secrets.token_urlsafe(32))")


def host_id(name: str, value: int) -> None:
    """A uid or gid."""
    if not 0 <= value < 2**32 - 1:
        raise ConfigError(f"{name}: must be a valid id")


def host_id_range(name: str, value: str) -> None:
    """``off``, or ``FIRST-LAST``: unprivileged host uids (never root's 0, never the invalid -1)."""
    if value == "off":
        return
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
    if match is None:
        raise ConfigError(f"{name}: {value!r} is not FIRST-LAST (two uids, e.g. 1879048192-1879113727) or off")
    first, last = int(match.group(1)), int(match.group(2))
    if first > last:
        raise ConfigError(f"{name}: {value!r} ends before it starts")
    if first == 0:
        raise ConfigError(f"{name}: {value!r} includes uid 0 (root's); start it above 0")
    if last >= 2**32 - 1:
        raise ConfigError(f"{name}: {value!r} goes past the largest uid ({2**32 - 2})")


def sandbox_id(name: str, value: int) -> None:
    """A uid or gid a root server drops the sandbox to: never root's (0), which is the server's own."""
    host_id(name, value)
    if value == 0:
        raise ConfigError(
            f"{name}: must not be 0: a root server runs sandboxes as this id, and root's would give the "
            "sandbox the server's own files; name an unprivileged id (default: the mcp-sandbox user's, else 65534)"
        )
