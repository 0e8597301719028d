"""The egress proxy's sans-I/O parts (issue 27): request parsing, SOCKS5, host rules,
special addresses, the resolver map.  Bytes in, decisions out; no sockets."""

from __future__ import annotations

import pytest

from shoal_mcp.kernel.net import wire
from shoal_mcp.kernel.net.limits import DEFAULT_PORTS, MAX_HEAD_BYTES
from shoal_mcp.kernel.net.resolve import parse_map
from shoal_mcp.kernel.net.rules import (
    NetRules,
    RuleError,
    effect_verdict,
    parse_rule,
    special_address,
    validate_table,
)


def test_connect_request() -> None:
    dest = wire.parse_http_head(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\nTLS")
    assert dest == wire.Destination("connect", "pypi.org", 443, rest=b"TLS")


def test_connect_ipv6_and_case() -> None:
    dest = wire.parse_http_head(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n")
    assert (dest.host, dest.port) == ("::1", 8443)
    dest = wire.parse_http_head(b"CONNECT PyPI.Org.:443 HTTP/1.0\r\n\r\n")
    assert dest.host == "pypi.org"


def test_incomplete_head_waits() -> None:
    assert wire.parse_http_head(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: x") is None
    assert wire.parse_http_head(b"CONN") is None


def test_binary_garbage_is_refused_before_a_head_ends() -> None:
    for garbage in (
        b"\x04\x01\x00\x50",
        b"\x16\x03\x01",
        b"connect ",
        b"GETTING_LONGER_THAN_A_METHOD",
    ):
        with pytest.raises(wire.WireError) as e:
            wire.parse_http_head(garbage)
        assert e.value.status == 400


def test_absolute_uri_is_rewritten_to_origin_form() -> None:
    head = (
        b"GET http://files.test:8080/a/b?q=1 HTTP/1.1\r\nHost: files.test:8080\r\n"
        b"Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nAccept: */*\r\n\r\n"
    )
    dest = wire.parse_http_head(head + b"body")
    assert (dest.kind, dest.host, dest.port, dest.rest) == ("forward", "files.test", 8080, b"body")
    lines = dest.head.split(b"\r\n")
    assert lines[0] == b"GET /a/b?q=1 HTTP/1.1"
    assert b"Accept: */*" in lines and b"Connection: close" in lines
    assert not any(line.lower().startswith(b"proxy-") for line in lines)


def test_absolute_uri_defaults_and_missing_host_header() -> None:
    dest = wire.parse_http_head(b"GET http://example.test HTTP/1.1\r\n\r\n")
    assert (dest.host, dest.port) == ("example.test", 80)
    assert dest.head.startswith(b"GET / HTTP/1.1\r\nHost: example.test\r\n")


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"CONNECT pypi.org HTTP/1.1\r\n\r\n", 400),  # no port
        (b"CONNECT pypi.org:0 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT pypi.org:99999 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT [::1:443 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT bad_host!:443 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT a..b:443 HTTP/1.1\r\n\r\n", 400),
        (b"connect pypi.org:443 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT pypi.org:443 HTTP/2\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\r\n\r\n", 400),  # TLS straight at the proxy
        (b"CONNECT pypi.org:443 HTTP/1.1\r\n folded\r\n\r\n", 400),
        (b"CONNECT pypi.org:443 HTTP/1.1\r\nno-colon\r\n\r\n", 400),
        (b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", 405),  # not a proxy request
        (b"GET https://pypi.org/ HTTP/1.1\r\n\r\n", 405),
        (b"GET http://user:pw@pypi.org/ HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_malformed_requests(head: bytes, status: int) -> None:
    with pytest.raises(wire.WireError) as e:
        wire.parse_http_head(head)
    assert e.value.status == status and e.value.why


def test_oversize_head_is_refused_before_it_ends() -> None:
    big = b"CONNECT pypi.org:443 HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEAD_BYTES
    with pytest.raises(wire.WireError) as e:
        wire.parse_http_head(big)  # no blank line yet: refused by size alone
    assert e.value.status == 431
    with pytest.raises(wire.WireError):
        wire.parse_http_head(big + b"\r\n\r\n")


def test_http_reply_says_why() -> None:
    reply = wire.http_reply(403, "evil.test:443 is not in net.allow")
    assert reply.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert reply.endswith(b"shoal egress proxy: evil.test:443 is not in net.allow\n")
    assert b"Content-Length: " in reply
    assert wire.http_reply(200) == b"HTTP/1.1 200 Connection established\r\n\r\n"


def test_socks5_domain_request_in_pieces() -> None:
    hs = wire.Socks5Handshake()
    assert hs.feed(b"\x05") == (b"", None)
    out, dest = hs.feed(b"\x01\x00")
    assert out == b"\x05\x00" and dest is None
    name = b"pypi.org"
    request = b"\x05\x01\x00\x03" + bytes([len(name)]) + name + (443).to_bytes(2, "big")
    out, dest = hs.feed(request[:6])
    assert (out, dest) == (b"", None)
    out, dest = hs.feed(request[6:] + b"hello")
    assert dest == wire.Destination("socks", "pypi.org", 443, rest=b"hello")


def test_socks5_ip_literals() -> None:
    hs = wire.Socks5Handshake()
    _, dest = hs.feed(b"\x05\x01\x00" + b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50")
    assert (dest.host, dest.port) == ("127.0.0.1", 80)
    hs = wire.Socks5Handshake()
    v6 = b"\x00" * 15 + b"\x01"
    _, dest = hs.feed(b"\x05\x01\x00" + b"\x05\x01\x00\x04" + v6 + b"\x01\xbb")
    assert (dest.host, dest.port) == ("::1", 443)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x04\x01\x00\x50", -1),  # SOCKS4
        (b"\x05\x00", -1),  # no method offered
        (b"\x05\x01\x02", -2),  # only user/password
        (b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50", wire.SOCKS_BAD_COMMAND),  # BIND
        (b"\x05\x01\x00\x05\x03\x00\x01\x7f\x00\x00\x01\x00\x50", wire.SOCKS_BAD_COMMAND),  # UDP
        (b"\x05\x01\x00\x05\x01\x00\x09\x00\x00", wire.SOCKS_BAD_ADDRESS),
        (b"\x05\x01\x00\x05\x01\x00\x03\x03a b\x00\x50", wire.SOCKS_BAD_ADDRESS),
        (b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x00", wire.SOCKS_BAD_ADDRESS),
        (b"\x05\x01\x00\x06\x01\x00\x01\x7f\x00\x00\x01\x00\x50", wire.SOCKS_FAILURE),
    ],
)
def test_socks5_garbage(data: bytes, code: int) -> None:
    with pytest.raises(wire.WireError) as e:
        wire.Socks5Handshake().feed(data)
    assert e.value.status == code
    # A request refused in the same read still owes the client its method reply first.
    assert e.value.before == (b"\x05\x00" if code > 0 else b"")


def test_socks5_handshake_is_bounded() -> None:
    hs = wire.Socks5Handshake()
    hs.feed(b"\x05\x01\x00")
    with pytest.raises(wire.WireError):
        hs.feed(b"\x05\x01\x00\x03" + b"\xff" * MAX_HEAD_BYTES)
    assert wire.socks_reply(wire.SOCKS_NOT_ALLOWED)[:2] == b"\x05\x02"


def test_rules_by_name_and_port() -> None:
    rules = NetRules(["pypi.org", "files.pythonhosted.org:443", "*.github.com", "h:*"])
    assert rules.verdict("pypi.org", 443)[0] and rules.verdict("pypi.org", 80)[0]
    assert rules.verdict("pypi.org", 22) == (False, "pypi.org is allowed on other ports, not 22")
    assert rules.verdict("files.pythonhosted.org", 443)[0]
    assert not rules.verdict("files.pythonhosted.org", 80)[0]
    assert rules.verdict("api.github.com", 443)[0] and not rules.verdict("github.com", 443)[0]
    assert rules.verdict("h", 6543)[0]
    ok, why = rules.verdict("evil.test", 443)
    assert not ok and why == "evil.test:443 is not in net.allow"


def test_deny_beats_allow() -> None:
    rules = NetRules(["*.github.com"], deny=["gist.github.com"])
    assert rules.verdict("api.github.com", 443)[0]
    ok, why = rules.verdict("gist.github.com", 443)
    assert not ok and "net.deny" in why
    assert not NetRules(["h:*"], deny=["h"]).verdict("h", 8080)[0]  # a deny: every port


def test_rule_forms() -> None:
    assert parse_rule("pypi.org").ports == DEFAULT_PORTS
    assert parse_rule("[::1]:8080").host == "::1" and parse_rule("[::1]:8080").ports == (8080,)
    assert parse_rule("::1").host == "::1"
    assert parse_rule("PyPI.org.:443").host == "pypi.org"
    for bad in ("", "h:0", "h:http", "h:70000", "a b", "[::1", "http://x/", ":443"):
        with pytest.raises(RuleError):
            parse_rule(bad)


def test_named_address_and_special_addresses() -> None:
    rules = NetRules(["10.1.2.3:8080", "pypi.org"])
    assert rules.names_address("10.1.2.3", 8080) and not rules.names_address("10.1.2.3", 80)
    assert not rules.names_address("127.0.0.1", 443)
    assert special_address("127.0.0.1") == "loopback"
    assert special_address("::ffff:127.0.0.1") == "loopback"
    assert special_address("169.254.169.254") == "link-local"
    assert special_address("10.0.0.1") == "private" and special_address("192.168.1.1") == "private"
    assert special_address("0.0.0.0") == "unspecified"
    assert special_address("151.101.0.223") is None
    assert special_address("151.101.0.223", own=["151.101.0.223"]) == (
        "one of this host's own addresses"
    )


def test_policy_table_and_effects() -> None:
    assert validate_table({"allow": ["pypi.org"], "deny": []}) == {
        "net_allow": ("pypi.org",),
        "net_deny": (),
    }
    for bad in ({"allow": "pypi.org"}, {"allow": ["h:0"]}, {"alow": []}, ["pypi.org"]):
        with pytest.raises(ValueError):
            validate_table(bad)
    rules = NetRules(["pypi.org"])
    assert effect_verdict(rules, "pypi.org:443")[0] and effect_verdict(rules, "pypi.org:*")[0]
    assert not effect_verdict(rules, "evil.test:443")[0]


def test_resolver_map() -> None:
    assert parse_map("a.test=127.0.0.1, B.test.=::1") == {"a.test": "127.0.0.1", "b.test": "::1"}
    assert parse_map("") == {}
    for bad in ("a.test", "a.test=nope", "=1.2.3.4"):
        with pytest.raises(ValueError):
            parse_map(bad)
