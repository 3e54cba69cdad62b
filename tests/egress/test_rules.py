"""The egress rules, the tenants' tables and the ClientHello reader, without a sandbox."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest

from doubles.sandbox import PlainProcessBackend
from mcp_sandbox.config import load_settings
from mcp_sandbox.egress import EgressRules, Refusal
from mcp_sandbox.egress.tls import client_hello_length, server_name
from mcp_sandbox.engine.startup import engine_for, tenant_egress
from mcp_sandbox.errors import ConfigError, ValidationError
from mcp_sandbox.server.service import open_service


def rules(allow: str = "example.com,*.example.org", deny: str = "", private: str = "") -> EgressRules:
    return EgressRules.build(
        [item for item in allow.split(",") if item],
        [item for item in deny.split(",") if item],
        [80, 443],
        [item for item in private.split(",") if item],
        "test",
    )


def rule_of(checked: str | Refusal) -> str:
    return checked.rule if isinstance(checked, Refusal) else "allowed"


@pytest.mark.parametrize(
    ("host", "port", "rule"),
    [
        ("example.com", 443, "allowed"),
        ("EXAMPLE.com.", 80, "allowed"),
        ("api.example.com", 443, "egress_allow"),
        ("example.org", 443, "egress_allow"),  # *.example.org names what is under it, not itself
        ("a.b.example.org", 443, "allowed"),
        ("example.com", 22, "egress_ports"),
        ("example.com\x00.evil.test", 443, "host_syntax"),
        ("example.com\r\nX: y", 443, "host_syntax"),
        ("exa mple.com", 443, "host_syntax"),
        ("example.com%00", 443, "host_syntax"),
        ("93.184.216.34", 443, "ip_literal"),
        ("[::1]", 443, "ip_literal"),
        ("", 443, "host_syntax"),
    ],
)
def test_names_and_ports_are_checked_before_anything_is_resolved(host: str, port: int, rule: str) -> None:
    assert rule_of(rules().check_name(host, port)) == rule


def test_deny_wins_over_allow() -> None:
    checked = rules(allow="*", deny="*.evil.test").check_name("x.evil.test", 443)
    assert rule_of(checked) == "egress_deny"


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "192.168.1.1", "169.254.169.254", "100.64.0.1", "224.0.0.1", "::1", "fe80::1",
     "fd00::1", "::ffff:127.0.0.1", "0.0.0.0", "203.0.113.9"],
)  # fmt: skip
def test_non_public_addresses_are_refused_unless_their_range_is_allowed(address: str) -> None:
    ip = ipaddress.ip_address(address)
    refusal = rules().check_address(ip)
    assert refusal is not None and refusal.rule == "egress_allow_private"
    assert rules(private="0.0.0.0/0,::/0").check_address(ip) is None


def test_a_public_address_is_allowed() -> None:
    assert rules().check_address(ipaddress.ip_address("93.184.216.34")) is None


def test_a_list_of_patterns_narrows_to_what_is_allowed() -> None:
    wide = rules(allow="*.example.org,example.com")
    assert wide.narrowed(["api.example.org", "*.x.example.org"]).allow == ("api.example.org", "*.x.example.org")
    assert rules(allow="api.example.org").narrowed(["*.example.org"]).allow == ("api.example.org",)
    with pytest.raises(ValidationError) as refused:
        wide.narrowed(["other.test"])
    assert refused.value.argument == "network"
    assert "egress_allow" in str(refused.value)


def test_network_true_with_nothing_allowed_is_refused_naming_the_setting(tmp_path: Path) -> None:
    egress = tenant_egress(load_settings(env={}, flags={"state_dir": str(tmp_path)}))
    assert egress.grant("default", False, None) is None
    with pytest.raises(ValidationError) as refused:
        egress.grant("default", True, None)
    assert refused.value.argument == "network"
    assert "egress_allow" in str(refused.value)


def test_a_tenants_table_replaces_allow_and_adds_to_deny(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        'egress_allow = ["*.example.com"]\negress_deny = ["bad.example.com"]\n'
        '[tenants.alice]\negress_allow = ["*.alice.test"]\negress_deny = ["x.alice.test"]\negress_ports = [443]\n'
        "[tenants.bob]\negress_allow = []\n"
    )
    settings = load_settings(env={}, flags={"state_dir": str(tmp_path)}, config_file=config)
    egress = tenant_egress(settings)
    alice = egress.rules("alice")
    assert alice.allow == ("*.alice.test",)
    assert alice.deny == ("bad.example.com", "x.alice.test")
    assert alice.ports == (443,)
    assert egress.rules("carol").allow == ("*.example.com",)  # no table: the global rules
    with pytest.raises(ValidationError) as refused:
        egress.grant("bob", True, None)
    assert "[tenants.bob]" in str(refused.value)
    grant = egress.grant("alice", ["a.alice.test"], "c1")
    assert grant is not None and grant.rules.allow == ("a.alice.test",) and grant.conversation == "c1"
    assert "alice.test" in egress.summary("alice") and "none" in egress.summary("bob")


@pytest.mark.parametrize(
    ("table", "setting"),
    [
        ('egress_allow = ["exa mple.com"]', "egress_allow"),
        ("egress_ports = [70000]", "egress_ports"),
        ('egress_allow_private = ["10.0.0.0/33"]', "egress_allow_private"),
        ('egress_deny = ["bad host"]', "egress_deny"),
    ],
)
def test_a_malformed_tenant_table_is_a_config_error_naming_the_file_and_setting(
    tmp_path: Path, table: str, setting: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"[tenants.alice]\n{table}\n")
    with pytest.raises(ConfigError) as refused:
        tenant_egress(load_settings(env={}, flags={"state_dir": str(tmp_path)}, config_file=config))
    assert f"config file {config}: [tenants.alice] {setting}:" in str(refused.value)


@pytest.mark.anyio
async def test_a_malformed_tenant_table_stops_the_service_and_the_engine_at_start(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[tenants.alice]\negress_allow = ["exa mple.com"]\n')
    settings = load_settings(env={}, flags={"state_dir": str(tmp_path / "state")}, config_file=config)
    said = f"config file {config}: [tenants.alice] egress_allow:"
    with pytest.raises(ConfigError) as refused:
        async with open_service(settings, http=False, backend=PlainProcessBackend()):
            pytest.fail("the service opened")
    assert said in str(refused.value)
    with pytest.raises(ConfigError) as refused:  # an engine built alone refuses too, never guessing "no network"
        engine_for(settings, PlainProcessBackend())
    assert said in str(refused.value)


@pytest.mark.parametrize(
    ("flags", "setting"),
    [
        ({"egress_ports": "80,http"}, "egress_ports"),
        ({"egress_ports": "0"}, "egress_ports"),
        ({"egress_allow_private": "10.0.0.0/99"}, "egress_allow_private"),
        ({"egress_max_bytes": "0"}, "egress_max_bytes"),
    ],
)
def test_malformed_egress_settings_are_refused_naming_the_setting(
    tmp_path: Path, flags: dict[str, str], setting: str
) -> None:
    with pytest.raises(ConfigError, match=setting):
        load_settings(env={}, flags={"state_dir": str(tmp_path), **flags})


def _client_hello(name: str | None) -> bytes:
    """The first flight of a real TLS client (Python's ssl), as sent on the wire."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    if name is None:
        context.check_hostname = False
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_the_server_name_of_a_real_client_hello_is_read() -> None:
    hello = _client_hello("API.Example.com")
    length = client_hello_length(hello[:5])
    assert length == len(hello)
    assert server_name(hello) == "api.example.com"
    assert server_name(_client_hello(None)) is None


def test_what_is_not_a_client_hello_is_refused() -> None:
    assert client_hello_length(b"GET / HTTP/1.1\r\n") is None
    with pytest.raises(ValueError):
        server_name(_client_hello("example.com")[:40])
