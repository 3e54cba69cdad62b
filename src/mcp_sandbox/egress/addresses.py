"""Which IP addresses are public: our own table, not the interpreter's ``is_global``.

An address is public when it is global unicast and in none of the IANA special-purpose ranges
below (each with the RFC that assigns it). ``is_global`` is not used: it changed between Python
versions, and it knows nothing of IPv6 addresses that wrap an IPv4 one. Those (IPv4-mapped,
-compatible, SIIT, NAT64, 6to4 and Teredo) are unwrapped by :func:`embedded_ipv4` and judged by
the IPv4 address they reach, so ``64:ff9b::a9fe:a9fe`` is the metadata address 169.254.169.254.
The local-use NAT64 prefix (64:ff9b:1::/48) may hold its IPv4 address at several places
(RFC 6052's formats), so it is not unwrapped: it is special-purpose, refused unless an IPv6
range of ``egress_allow_private`` holds it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["IPAddress", "IPNetwork", "embedded_ipv4", "in_ranges", "is_own", "is_public", "reachable"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# The IPv4 special-purpose address registry, and the ranges that are not unicast.
SPECIAL_IPV4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "this network, RFC 791 §3.2"),
    (_V4("10.0.0.0/8"), "private use, RFC 1918"),
    (_V4("100.64.0.0/10"), "shared address space (carrier-grade NAT), RFC 6598"),
    (_V4("127.0.0.0/8"), "loopback, RFC 1122 §3.2.1.3"),
    (_V4("169.254.0.0/16"), "link local (cloud metadata), RFC 3927"),
    (_V4("172.16.0.0/12"), "private use, RFC 1918"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments (DS-Lite, NAT64 discovery), RFC 6890"),
    (_V4("192.0.2.0/24"), "documentation TEST-NET-1, RFC 5737"),
    (_V4("192.31.196.0/24"), "AS112-v4, RFC 7535"),
    (_V4("192.52.193.0/24"), "AMT, RFC 7450"),
    (_V4("192.88.99.0/24"), "deprecated 6to4 relay anycast, RFC 7526"),
    (_V4("192.168.0.0/16"), "private use, RFC 1918"),
    (_V4("192.175.48.0/24"), "direct delegation AS112 service, RFC 7534"),
    (_V4("198.18.0.0/15"), "benchmarking, RFC 2544"),
    (_V4("198.51.100.0/24"), "documentation TEST-NET-2, RFC 5737"),
    (_V4("203.0.113.0/24"), "documentation TEST-NET-3, RFC 5737"),
    (_V4("224.0.0.0/4"), "multicast, RFC 5771"),
    (_V4("240.0.0.0/4"), "reserved, RFC 1112 §4 (and limited broadcast 255.255.255.255, RFC 919)"),
)

# IPv6 global unicast (RFC 4291 §2.4, RFC 3587); everything outside it is refused.
GLOBAL_UNICAST_IPV6 = _V6("2000::/3")

# The IPv6 special-purpose address registry, within and outside 2000::/3.
SPECIAL_IPV6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified, RFC 4291"),
    (_V6("::1/128"), "loopback, RFC 4291"),
    (_V6("64:ff9b:1::/48"), "local-use IPv4/IPv6 translation, RFC 8215"),
    (_V6("100::/64"), "discard-only, RFC 6666"),
    (_V6("100:0:0:1::/64"), "dummy IPv6 prefix, RFC 9780"),
    (_V6("2001::/23"), "IETF protocol assignments (PCP, benchmarking, AMT, AS112, ORCHID, DRIP), RFC 2928"),
    (_V6("2001:db8::/32"), "documentation, RFC 3849"),
    (_V6("2620:4f:8000::/48"), "direct delegation AS112 service, RFC 7534"),
    (_V6("3fff::/20"), "documentation, RFC 9637"),
    (_V6("5f00::/16"), "segment routing (SRv6) SIDs, RFC 9602"),
    (_V6("fc00::/7"), "unique local, RFC 4193"),
    (_V6("fe80::/10"), "link-local unicast, RFC 4291"),
    (_V6("fec0::/10"), "site-local unicast (deprecated), RFC 3879"),
    (_V6("ff00::/8"), "multicast, RFC 4291"),
)

# IPv6 prefixes whose addresses carry an IPv4 address, and how to read it.
_MAPPED = _V6("::ffff:0:0/96")  # IPv4-mapped, RFC 4291 §2.5.5.2
_COMPATIBLE = _V6("::/96")  # IPv4-compatible (deprecated), RFC 4291 §2.5.5.1
_SIIT = _V6("::ffff:0:0:0/96")  # IPv4-translated, RFC 2765 §2.1
_NAT64 = _V6("64:ff9b::/96")  # the well-known NAT64 prefix, RFC 6052 §2.1
_SIX_TO_FOUR = _V6("2002::/16")  # 6to4, RFC 3056 §2
_TEREDO = _V6("2001::/32")  # Teredo, RFC 4380 §4: the client's address is the last 32 bits inverted
_LAST_32 = (_MAPPED, _COMPATIBLE, _SIIT, _NAT64)


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses ``address`` wraps (Teredo: its server's and its client's); empty if none."""
    value = int(address)
    if address in _COMPATIBLE and value <= 1:
        return ()  # :: and ::1 are themselves, not 0.0.0.0 and 0.0.0.1
    if any(address in prefix for prefix in _LAST_32):
        return (ipaddress.IPv4Address(value & 0xFFFFFFFF),)
    if address in _SIX_TO_FOUR:
        return (ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF),)
    if address in _TEREDO:
        server = ipaddress.IPv4Address((value >> 64) & 0xFFFFFFFF)
        return server, ipaddress.IPv4Address(~value & 0xFFFFFFFF)
    return ()


def _public_ipv4(address: ipaddress.IPv4Address) -> bool:
    return not any(address in network for network, _ in SPECIAL_IPV4)


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is global unicast outside every special-purpose range (unwrapped IPv4 included)."""
    if isinstance(address, ipaddress.IPv4Address):
        return _public_ipv4(address)
    if address.scope_id:
        return False
    wrapped = embedded_ipv4(address)
    if wrapped:
        return all(_public_ipv4(inner) for inner in wrapped)
    if address not in GLOBAL_UNICAST_IPV6:
        return False
    return not any(address in network for network, _ in SPECIAL_IPV6)


def in_ranges(address: IPAddress, ranges: Iterable[IPNetwork]) -> bool:
    """Whether a range of ``ranges`` holds ``address``, or every IPv4 address it wraps."""
    ranges = tuple(ranges)
    if any(address in network for network in ranges):
        return True
    wrapped = embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else ()
    return bool(wrapped) and all(any(inner in network for network in ranges) for inner in wrapped)


def reachable(address: IPAddress, ranges: Iterable[IPNetwork]) -> bool:
    """Whether ``address`` may be connected to: public, or allowed by ``ranges`` (each IPv4 it wraps too)."""
    ranges = tuple(ranges)
    if any(address in network for network in ranges):
        return True
    wrapped = embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else ()
    if not wrapped:
        return is_public(address)
    return all(_public_ipv4(inner) or any(inner in network for network in ranges) for inner in wrapped)


def is_own(address: IPAddress, port: int, host: str, own_port: int) -> bool:
    """Whether ``address:port`` may be the server itself: loopback or its own address, unwrapped too."""
    if port != own_port:
        return False
    try:
        own: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        own = None
    forms: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        forms += embedded_ipv4(address)  # ::ffff:127.0.0.1 is 127.0.0.1
    if own is None:
        return any(form.is_loopback for form in forms)
    owns: list[IPAddress] = [own, *(embedded_ipv4(own) if isinstance(own, ipaddress.IPv6Address) else ())]
    if any(candidate.is_unspecified for candidate in owns):
        return True
    return any(form.is_loopback or form in owns for form in forms)
