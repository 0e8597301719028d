"""Policy by host name: ``net.allow`` / ``net.deny`` entries and the verdict on one
destination (docs/security.md, "Network").

An entry is ``HOST`` or ``HOST:PORT``: a host name, a glob (``*.github.com``: fnmatch,
case-insensitive; it does not match ``github.com`` itself) or an IP literal
(``10.0.0.5``, ``[::1]``); the port a number or ``*`` (any); without one, an allow
entry covers ports :data:`~.limits.DEFAULT_PORTS` and a deny entry every port.  Deny
beats allow.  The old ``net_connect`` entries
(``HOST:PORT``, port may be ``*``) are allow entries of the same form.

A name that resolves to a loopback, link-local, private or the host's own address is
refused unless an allow entry names that address itself (:meth:`NetRules.names_address`).
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from .limits import DEFAULT_PORTS


class RuleError(ValueError):
    """A ``net.allow`` / ``net.deny`` entry that is not ``HOST[:PORT]``."""


@dataclass(frozen=True)
class Rule:
    host: str  # lower case glob, or a normalised IP literal
    ports: tuple[int, ...] | None  # None: any port
    text: str

    def covers(self, host: str, port: int) -> bool:
        if self.ports is not None and port not in self.ports:
            return False
        return fnmatch.fnmatchcase(host, self.host)


def parse_rule(entry: str, default_ports: tuple[int, ...] | None = DEFAULT_PORTS) -> Rule:
    """One entry (see the module docstring); :class:`RuleError` says what is wrong.
    ``default_ports``: what an entry without a port covers (None: every port)."""
    text = entry.strip()
    if not text:
        raise RuleError("empty entry")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise RuleError(f"{entry!r}: unclosed IPv6 literal")
        host, port_text = text[1:end], text[end + 1 :].removeprefix(":")
        if text[end + 1 :] and not text[end + 1 :].startswith(":"):
            raise RuleError(f"{entry!r}: expected [V6]:PORT")
    elif text.count(":") > 1:
        host, port_text = text, ""  # a bare IPv6 literal
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise RuleError(f"{entry!r}: no host")
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        host = host.rstrip(".").lower()
        if any(c.isspace() or c in "/@" for c in host):
            raise RuleError(f"{entry!r}: not a host name or glob") from None
    if port_text == "*":
        return Rule(host, None, entry)
    if not port_text:
        return Rule(host, default_ports, entry)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RuleError(f"{entry!r}: bad port {port_text!r}")
    return Rule(host, (int(port_text),), entry)


def check_entries(entries: Iterable[str]) -> str | None:
    """The first problem among ``entries``, or None (for the policy file's checks)."""
    for entry in entries:
        try:
            parse_rule(entry)
        except RuleError as e:
            return str(e)
    return None


class NetRules:
    """One principal's network policy: allow and deny rules, compiled."""

    def __init__(self, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> None:
        self.allow = tuple(parse_rule(e) for e in allow)
        self.deny = tuple(parse_rule(e, None) for e in deny)

    def __bool__(self) -> bool:
        return bool(self.allow)

    def verdict(self, host: str, port: int) -> tuple[bool, str]:
        """(allowed, why) for a destination as the client named it."""
        for rule in self.deny:
            if rule.covers(host, port):
                return False, f"{host}:{port} matches net.deny {rule.text!r}"
        for rule in self.allow:
            if rule.covers(host, port):
                return True, f"net.allow {rule.text!r}"
        if any(fnmatch.fnmatchcase(host, r.host) for r in self.allow):
            return False, f"{host} is allowed on other ports, not {port}"
        return False, f"{host}:{port} is not in net.allow"

    def names_address(self, address: str, port: int) -> bool:
        """An allow entry names this IP address itself (so it may be a private one)."""
        return any(r.host == address and r.covers(address, port) for r in self.allow)


def special_address(address: str, own: Iterable[str] = ()) -> str | None:
    """Why ``address`` is not a public destination (loopback, link-local, private,
    unspecified, multicast, reserved, or one of the host's own ``own``), or None."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for what in ("loopback", "link_local", "unspecified", "multicast", "reserved", "private"):
        if getattr(ip, f"is_{what}"):
            return what.replace("_", "-")
    if str(ip) in set(own):
        return "one of this host's own addresses"
    return None


def validate_table(value: object) -> dict[str, tuple[str, ...]]:
    """A principal's ``net`` table (``allow``, ``deny``) checked: ``{"net_allow": …,
    "net_deny": …}``; ValueError ``(key, why)`` names the bad key."""
    if not isinstance(value, dict):
        raise ValueError("", "expected a table")
    out: dict[str, tuple[str, ...]] = {}
    for key, entries in value.items():
        if key not in ("allow", "deny"):
            raise ValueError(key, "unknown key (expected allow or deny)")
        if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
            raise ValueError(key, "expected a list of non-empty strings")
        why = check_entries(entries)
        if why:
            raise ValueError(key, why)
        out[f"net_{key}"] = tuple(entries)
    return out


def check_connect_entry(entry: str) -> str | None:
    """What is wrong with an old ``net_connect`` entry (``HOST:PORT``, port may be ``*``)."""
    host, sep, port = entry.rpartition(":")
    if not sep or not host:
        return "expected HOST:PORT (port may be *)"
    if port != "*" and not (port.isdigit() and 0 < int(port) < 65536):
        return f"bad port {port!r}"
    return None


def effect_verdict(rules: NetRules, target: str) -> tuple[bool, str]:
    """A predicted ``net_connect`` effect (``host:port``, port maybe ``*``) by the rules."""
    host, _, port = target.rpartition(":")
    host = host.strip("[]").lower()
    if port.isdigit():
        return rules.verdict(host, int(port))
    ok = all(rules.verdict(host, p)[0] for p in DEFAULT_PORTS)
    return ok, "" if ok else f"{host} is not in net.allow"
