"""How the egress proxy turns a host name into addresses: the host's resolver, or a fixed table for tests.

The proxy resolves a name only after its rules allowed the name, and connects to an address it
checked (:mod:`.proxy`); which resolver it asks is given to it (:data:`Resolver`).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence

import anyio

from mcp_sandbox.egress.addresses import IPAddress

__all__ = ["Resolver", "hosts_resolver", "is_address", "system_resolver"]

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The host's own resolver (getaddrinfo)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


def hosts_resolver(hosts: Mapping[str, Sequence[str]]) -> Resolver:
    """A resolver that knows only ``hosts`` (name to addresses) and never asks DNS: for tests."""
    table = {
        name.lower(): [ipaddress.ip_address(address) for address in addresses] for name, addresses in hosts.items()
    }

    async def resolve(host: str, port: int) -> list[IPAddress]:
        if host in table:
            return list(table[host])
        raise OSError(f"{host} is not in the test resolver's table")

    return resolve


def is_address(host: str) -> bool:
    """Whether ``host`` is an IP address literal (no name to resolve)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
