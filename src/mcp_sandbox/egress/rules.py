"""The egress policy: which hosts, ports and addresses a run with network may reach, and why not.

Pure functions over settings (each tenant's egress settings are finished by the config loader).
A pattern is a host name (``example.com``: that name only), ``*.example.com`` (any name under
it, not the name itself), or ``*`` (any host name). ``egress_deny`` wins over ``egress_allow``.
Addresses that are not public (:mod:`.addresses`: loopback, private, link-local, multicast,
shared, reserved, the cloud metadata address, and IPv6 addresses wrapping any of them) are
refused unless ``egress_allow_private`` names a range holding them (or the IPv4 address they
wrap); a host given as an IP address is refused unless that address is in such a range too.

Every refusal is a :class:`Refusal` whose ``rule`` names the setting (or check) that refused,
so the proxy's 403 and the audit line tell the model and the operator which one it was.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mcp_sandbox.config import EgressSettings, SecretSpec
from mcp_sandbox.egress.addresses import IPAddress, IPNetwork, in_ranges, reachable
from mcp_sandbox.egress.patterns import Refusal, check_pattern, normal_host, pattern_matches
from mcp_sandbox.egress.secrets import BoundSecret, bind
from mcp_sandbox.errors import ConfigError, ValidationError

__all__ = [
    "EgressGrant",
    "EgressRules",
    "IPAddress",
    "IPNetwork",
    "Refusal",
    "TenantEgress",
    "check_pattern",
    "pattern_matches",
]


def _covers(wide: str, narrow: str) -> bool:
    """Whether every host ``narrow`` names is also named by ``wide``."""
    if wide == "*":
        return True
    if narrow == "*":
        return False
    if narrow.startswith("*."):
        return wide.startswith("*.") and narrow[1:].endswith(wide[1:])
    return pattern_matches(wide, narrow)


def _literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class EgressRules:
    """Allowed and denied patterns, ports, and private ranges allowed explicitly."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    ports: tuple[int, ...] = (80, 443)
    private: tuple[IPNetwork, ...] = ()

    @classmethod
    def build(
        cls, allow: Iterable[str], deny: Iterable[str], ports: Iterable[int], private: Iterable[str], where: str
    ) -> EgressRules:
        """Rules from setting values; ``where`` names their source in errors, before the setting's name
        (``""`` for the global settings, ``"config file F: [tenants.NAME] "`` for a tenant's).

        Raises:
            ConfigError: a pattern, port or range is malformed, named with its setting.
        """
        setting = "egress_allow"
        try:
            checked_allow = tuple(dict.fromkeys(check_pattern(item) for item in allow))
            setting = "egress_deny"
            checked_deny = tuple(dict.fromkeys(check_pattern(item) for item in deny))
            setting = "egress_allow_private"
            checked_private = tuple(ipaddress.ip_network(item, strict=False) for item in private)
        except ValueError as exc:
            raise ConfigError(f"{where}{setting}: {exc}") from exc
        return cls(allow=checked_allow, deny=checked_deny, ports=tuple(ports), private=checked_private)

    def reaches_loopback(self) -> bool:
        """Whether ``localhost`` may be reached: a pattern allows it, none denies it, a loopback range is allowed."""
        ranges = any(in_ranges(ipaddress.ip_address(address), self.private) for address in ("127.0.0.1", "::1"))
        named = any(pattern_matches(pattern, "localhost") for pattern in self.allow)
        return ranges and named and not any(pattern_matches(pattern, "localhost") for pattern in self.deny)

    def narrowed(self, requested: Sequence[str]) -> EgressRules:
        """These rules allowing only what ``requested`` (patterns) names as well.

        Raises:
            ValidationError: (argument ``network``) a pattern is malformed, or allowed nowhere here.
        """
        kept: list[str] = []
        for raw in requested:
            try:
                pattern = check_pattern(raw)
            except ValueError as exc:
                raise ValidationError("network", str(exc)) from exc
            within = [pattern for wide in self.allow if _covers(wide, pattern)]
            within += [narrow for narrow in self.allow if _covers(pattern, narrow)]
            if not within:
                allowed = ", ".join(self.allow) or "nothing"
                raise ValidationError("network", f"{raw!r} is not allowed here (egress_allow: {allowed})")
            kept += within
        return EgressRules(tuple(dict.fromkeys(kept)), self.deny, self.ports, self.private)

    def check_name(self, host: str, port: int) -> str | Refusal:
        """The normalised host if a connection to ``host:port`` may be attempted, before any resolving.

        Checked before a name is resolved, so a refused name never reaches a DNS server (no
        exfiltration through lookups of made-up names).
        """
        if port not in self.ports:
            shown = ", ".join(str(port) for port in self.ports)
            return Refusal("egress_ports", f"port {port} is not allowed (egress_ports: {shown})")
        literal = _literal_address(host)
        if literal is not None:
            if not in_ranges(literal, self.private):
                return Refusal("ip_literal", "a host given as an IP address is refused (egress_allow_private)")
            return str(literal)
        name = normal_host(host)
        if isinstance(name, Refusal):
            return name
        for pattern in self.deny:
            if pattern_matches(pattern, name):
                return Refusal("egress_deny", f"{name} matches egress_deny pattern {pattern!r}")
        if not any(pattern_matches(pattern, name) for pattern in self.allow):
            allowed = ", ".join(self.allow) or "nothing"
            return Refusal("egress_allow", f"{name} is not in egress_allow ({allowed})")
        return name

    def check_address(self, address: IPAddress) -> Refusal | None:
        """None if ``address`` may be connected to: public, or in an explicitly allowed range."""
        if reachable(address, self.private):
            return None
        return Refusal(
            "egress_allow_private",
            f"the name resolves to {address}, a non-public address (allow its range in egress_allow_private)",
        )


@dataclass(frozen=True, slots=True)
class EgressGrant:
    """One run's network: its rules, whose run it is (for the audit log), and its caps."""

    rules: EgressRules
    tenant: str
    conversation: str | None = None
    max_bytes: int = 256 << 20
    max_connections: int = 256
    connection_timeout: float = 300.0
    # The server's own listening address, refused even where its range is allowed.
    own: tuple[tuple[str, int], ...] = field(default=())
    # The tenant's secrets, each with this run's placeholder (see .secrets).
    secrets: tuple[BoundSecret, ...] = field(default=())


class TenantEgress:
    """The egress rules of each tenant: the global settings, with what ``[tenants.<name>]`` sets instead.

    A tenant's ``egress_allow``, ``egress_ports`` and ``egress_allow_private`` replace the global
    ones; its ``egress_deny`` adds to the global one (a tenant never un-denies). The hosts of a
    tenant's secrets join its ``egress_allow``.
    """

    def __init__(self, egress: EgressSettings, own: tuple[str, int], config_file: Path | None = None) -> None:
        """Check the rules of ``egress`` and of each tenant (``egress.tenants``).

        ``own``: the server's own address (``host``, ``port``), never reached by a run;
        ``config_file``: the TOML file the tenants' rules came from, named in their errors.

        Raises:
            ConfigError: a pattern or range of the global rules or of a tenant's is malformed.
        """
        self._egress, self._own = egress, own
        self.default = EgressRules.build(
            egress.egress_allow,
            egress.egress_deny,
            egress.egress_ports,
            egress.egress_allow_private,
            "",
        )
        file = f"config file {config_file}: " if config_file is not None else ""
        self._tenants = {
            tenant.name: EgressRules.build(
                tenant.egress_allow,
                tenant.egress_deny,
                tenant.egress_ports,
                tenant.egress_allow_private,
                f"{file}[tenants.{tenant.name}] ",
            )
            for tenant in egress.tenants
        }
        self._secrets: dict[str, list[tuple[SecretSpec, tuple[str, ...]]]] = {}
        for spec in egress.secrets:
            try:
                hosts = tuple(check_pattern(host) for host in spec.hosts)
            except ValueError as exc:
                raise ConfigError(f"secret {spec.name!r} hosts: {exc}") from exc
            self._secrets.setdefault(spec.tenant, []).append((spec, hosts))
        for tenant, declared in self._secrets.items():
            base = self._tenants.get(tenant, self.default)
            joined = [host for _, patterns in declared for host in patterns]
            self._tenants[tenant] = dataclasses.replace(base, allow=tuple(dict.fromkeys((*base.allow, *joined))))

    def anywhere(self) -> bool:
        """Whether any tenant (or the default) may be granted network at all."""
        return bool(self.default.allow) or any(rules.allow for rules in self._tenants.values())

    def rules(self, tenant: str) -> EgressRules:
        """The rules of ``tenant``."""
        return self._tenants.get(tenant, self.default)

    def grant(self, tenant: str, network: bool | Sequence[str], conversation: str | None) -> EgressGrant | None:
        """The network a run asking for ``network`` gets, or None for ``False``.

        Raises:
            ValidationError: (argument ``network``) nothing is allowed to this tenant, or a
                requested pattern is malformed or not allowed.
        """
        if network is False:
            return None
        rules = self.rules(tenant)
        if not rules.allow:
            where = "egress_allow" if tenant not in self._tenants else f"egress_allow of [tenants.{tenant}]"
            raise ValidationError("network", f"no network is allowed here: {where} names no domain")
        if network is not True:
            rules = rules.narrowed(list(network))
        egress = self._egress
        return EgressGrant(
            rules=rules,
            tenant=tenant,
            conversation=conversation,
            max_bytes=egress.egress_max_bytes,
            max_connections=egress.egress_max_connections,
            connection_timeout=egress.egress_connection_timeout,
            own=(self._own,),
            secrets=bind(self._secrets.get(tenant, ())),
        )

    def secret_names(self, tenant: str) -> list[str]:
        """The names of ``tenant``'s secrets (for ``list_runners``: names only)."""
        return [spec.name for spec, _ in self._secrets.get(tenant, ())]

    def available(self, tenant: str) -> bool:
        """Whether ``network: true`` can be granted to ``tenant`` at all."""
        return bool(self.rules(tenant).allow)

    def summary(self, tenant: str) -> str:
        """What ``network: true`` reaches for ``tenant``, said briefly (for ``list_runners``)."""
        rules = self.rules(tenant)
        if not rules.allow:
            return "none (egress_allow is empty)"
        return f"{', '.join(rules.allow)} on ports {', '.join(str(port) for port in rules.ports)}"
