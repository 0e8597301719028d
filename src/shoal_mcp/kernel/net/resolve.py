"""Names to addresses for the proxy: DNS (``getaddrinfo`` on the kernel's side: the
sandbox has none), or a fixed map for tests and development (:data:`~.limits.RESOLVE_ENV`).

A name in the map resolves to its address only, and counts as named by the policy: a
local stand-in server on loopback is reachable under that name (and only under it).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping

from .limits import RESOLVE_ENV


class ResolveError(OSError):
    """The name did not resolve (or the map's entry is malformed)."""


def parse_map(text: str) -> dict[str, str]:
    """``host=addr,host2=addr2`` (whitespace ignored) into a dict; ValueError if bad."""
    import ipaddress

    out: dict[str, str] = {}
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        host, sep, addr = item.partition("=")
        if not sep or not host:
            raise ValueError(f"{RESOLVE_ENV}: expected host=address, got {item!r}")
        out[host.rstrip(".").lower()] = str(ipaddress.ip_address(addr))
    return out


def map_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    return parse_map(environ.get(RESOLVE_ENV, ""))


class Resolver:
    """Resolves on the proxy's event loop; ``fixed``: the test/development map."""

    def __init__(self, fixed: Mapping[str, str] | None = None) -> None:
        self.fixed = dict(fixed or {})

    def mapped(self, host: str) -> bool:
        return host in self.fixed

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses to try, in order (an IP literal is itself)."""
        if host in self.fixed:
            return [self.fixed[host]]
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
            return [host]
        except OSError:
            pass
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise ResolveError(e.errno or 0, f"cannot resolve {host}: {e.strerror or e}") from e
        seen: list[str] = []
        for *_, addr in infos:
            if addr[0] not in seen:
                seen.append(str(addr[0]))
        return seen


def own_addresses() -> frozenset[str]:
    """This host's own addresses (its interfaces'), besides loopback: a name resolving
    to one of them reaches the host's services, which is what the rule keeps out."""
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie") as fh:
            lines = fh.read().splitlines()
        for prev, line in zip(lines, lines[1:], strict=False):
            if "/32 host LOCAL" in line:
                found.add(prev.strip().split()[-1])
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as fh:
            for line in fh:
                hexaddr = line.split()[0]
                found.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexaddr)))
    except (OSError, ValueError):
        pass
    return frozenset(found)
