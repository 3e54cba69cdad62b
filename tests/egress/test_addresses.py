"""IPv6 addresses that wrap private IPv4 ones, refused through the real proxy; and the address table itself.

The attacks name hosts (the proxy's resolver table) that resolve to each IPv6 form of a private
IPv4 address, and give such addresses as literals in CONNECT and in a request's URL: every one
is refused by ``egress_allow_private`` unless that setting names the IPv4 range it wraps.
"""

from __future__ import annotations

import ipaddress
import json

import pytest

from mcp_sandbox.egress import EgressRules
from mcp_sandbox.egress.addresses import SPECIAL_IPV4, SPECIAL_IPV6, embedded_ipv4, is_public

from .conftest import EgressEngine, HostNet, audit_lines, execute, granted
from .test_egress import RAW, fetching

# One name per prefix, each wrapping a private IPv4 address (169.254.169.254 is the cloud metadata service).
WRAPPING = {
    "nat64-metadata.test": "64:ff9b::a9fe:a9fe",  # NAT64 well-known prefix, RFC 6052
    "nat64-private.test": "64:ff9b::a00:5",  # NAT64 of 10.0.0.5
    "nat64-local.test": "64:ff9b:1::a9fe:a9fe",  # local-use NAT64, RFC 8215
    "sixtofour.test": "2002:a9fe:a9fe::1",  # 6to4, RFC 3056
    "site-local.test": "fec0::5",  # deprecated site-local, RFC 3879
    "siit.test": "::ffff:0:a9fe:a9fe",  # SIIT IPv4-translated, RFC 2765
    "mapped.test": "::ffff:169.254.169.254",  # IPv4-mapped, RFC 4291
    "compatible.test": "::a9fe:a9fe",  # IPv4-compatible, RFC 4291
    "teredo.test": "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo whose client is 192.0.2.45, RFC 4380
    "unique-local.test": "fd00::5",  # RFC 4193
}

pytestmark = [pytest.mark.anyio]


async def test_names_resolving_to_ipv6_forms_of_private_addresses_are_refused_through_the_proxy(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    code = f"print(json.dumps({{name: fetch(f'http://{{name}}/') for name in {sorted(WRAPPING)!r}}}))"
    hosts = {name: [address] for name, address in WRAPPING.items()}
    async with egress_engine(egress_allow="*.test", hosts=hosts) as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress))
    assert result.status == "success", result
    answers = json.loads(result.stdout)
    for name in WRAPPING:
        status, body = answers[name]
        assert status == 403 and body.endswith("(rule: egress_allow_private)\n"), (name, answers[name])
    verdicts = {line["host"]: (line["verdict"], line["rule"]) for line in audit_lines(engine)}
    assert verdicts == dict.fromkeys(WRAPPING, ("refused", "egress_allow_private"))


async def test_a_private_range_allows_the_ipv4_address_an_ipv6_name_or_literal_wraps(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    mapped = f"::ffff:{test_net.address}"
    metadata = "64:ff9b::a9fe:a9fe"
    code = (
        f"print(json.dumps([fetch('http://mapped-host.test/'), fetch('http://[{mapped}]/'),"
        f" fetch('http://[{metadata}]/')]))"
    )
    flags = {"egress_allow": "*.test", "egress_allow_private": f"{test_net.address}/32"}
    async with egress_engine(hosts={"mapped-host.test": [mapped]}, **flags) as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress))
    assert result.status == "success", result
    by_name, by_literal, other = json.loads(result.stdout)
    assert by_name == [200, "hello from mapped-host.test"]
    assert by_literal == [200, f"hello from [{mapped}]"]
    assert other[0] == 403 and other[1].endswith("(rule: ip_literal)\n")


async def test_ipv6_literals_wrapping_private_addresses_are_refused_in_connect_and_host(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    literals = sorted(set(WRAPPING.values()))
    code = RAW + (
        "print(json.dumps({a: [proxy(f'CONNECT [{a}]:443 HTTP/1.1\\r\\n\\r\\n'.encode()).split(chr(13))[0],"
        " proxy(f'GET http://[{a}]/ HTTP/1.1\\r\\n\\r\\n'.encode()).split(chr(13))[0]]"
        f" for a in {literals!r}}}))"
    )
    async with egress_engine(egress_allow="*", egress_allow_private=f"{test_net.address}/32") as (engine, egress):
        result = await execute(engine, code, granted(egress))
    assert result.status == "success", result
    answers = json.loads(result.stdout)
    assert answers == {literal: ["HTTP/1.1 403 Forbidden"] * 2 for literal in literals}
    assert {line["rule"] for line in audit_lines(engine)} == {"ip_literal"}


async def test_the_servers_own_port_is_refused_at_an_ipv4_mapped_loopback_address(
    egress_engine: EgressEngine,
) -> None:
    flags = {"egress_allow": "*", "egress_allow_private": "127.0.0.0/8", "egress_ports": "80,443,8765", "port": 8765}
    code = RAW + (
        'print(json.dumps([proxy(b"CONNECT self.test:8765 HTTP/1.1\\r\\n\\r\\n"),'
        ' proxy(b"CONNECT [::ffff:127.0.0.1]:8765 HTTP/1.1\\r\\n\\r\\n")]))'
    )
    async with egress_engine(hosts={"self.test": ["::ffff:127.0.0.1"]}, **flags) as (engine, egress):
        result = await execute(engine, code, granted(egress))
    assert result.status == "success", result
    for answer in json.loads(result.stdout):
        assert answer.startswith("HTTP/1.1 403") and "(rule: proxy_itself)" in answer, answer


@pytest.mark.parametrize(
    "address",
    [*WRAPPING.values(), "::", "::1", "fe80::1", "ff02::1", "100::1", "2001:db8::1", "2001:2::1", "3fff::1",
     "5f00::1", "::ffff:10.0.0.1", "::ffff:0:127.0.0.1", "64:ff9b::7f00:1", "2002:c0a8:101::1", "0.1.2.3",
     "192.0.0.170", "198.18.0.1", "240.0.0.1", "255.255.255.255"],
)  # fmt: skip
def test_every_special_purpose_or_wrapped_private_address_is_not_public(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert not is_public(ip)
    refusal = EgressRules().check_address(ip)
    assert refusal is not None and refusal.rule == "egress_allow_private"


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "2606:4700::1111", "::ffff:93.184.216.34", "64:ff9b::5db8:d822", "2002:5db8:d822::1",
     "2001:0:4136:e378:8000:63bf:a247:27dd"],
)  # fmt: skip
def test_public_addresses_and_ipv6_forms_of_public_ipv4_addresses_are_public(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))
    assert EgressRules().check_address(ipaddress.ip_address(address)) is None


def test_a_private_range_allows_the_ipv6_forms_of_its_addresses_and_no_other() -> None:
    rules = EgressRules(private=(ipaddress.ip_network("169.254.0.0/16"),))
    assert rules.check_address(ipaddress.ip_address("64:ff9b::a9fe:a9fe")) is None
    assert rules.check_address(ipaddress.ip_address("2002:a9fe:a9fe::1")) is None
    assert rules.check_address(ipaddress.ip_address("64:ff9b::a00:5")) is not None
    # The local-use NAT64 prefix is not unwrapped: only an IPv6 range allows it.
    assert rules.check_address(ipaddress.ip_address("64:ff9b:1::a9fe:a9fe")) is not None


def test_teredo_unwraps_the_inverted_client_address() -> None:
    assert embedded_ipv4(ipaddress.IPv6Address("2001:0:4136:e378:8000:63bf:3fff:fdd2")) == (
        ipaddress.IPv4Address("65.54.227.120"),
        ipaddress.IPv4Address("192.0.2.45"),
    )


def test_every_table_entry_names_its_rfc() -> None:
    for network, source in (*SPECIAL_IPV4, *SPECIAL_IPV6):
        assert "RFC " in source, network
