"""The proxy's protocols as plain functions and one small state object: bytes in,
a destination (or an error) out, no sockets (the I/O is ``proxy.py``'s).

* HTTP: ``CONNECT host:port HTTP/1.1`` (a tunnel) and absolute-URI requests
  (``GET http://host[:port]/path HTTP/1.1``: forwarded with an origin-form request line,
  hop-by-hop proxy headers dropped, ``Connection: close``).
* SOCKS5 (RFC 1928), no authentication, ``CONNECT`` only; a domain name (ATYP 3, remote
  DNS: the proxy resolves it) or an IPv4/IPv6 literal.

Which one a client speaks is told by its first byte (:func:`is_socks`): 0x05 is SOCKS5.
Every malformed input raises :class:`WireError` with what to answer.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from .limits import MAX_HEAD_BYTES

SOCKS_VERSION = 5
SOCKS_OK = 0x00
SOCKS_FAILURE = 0x01
SOCKS_NOT_ALLOWED = 0x02
SOCKS_NET_UNREACHABLE = 0x03
SOCKS_HOST_UNREACHABLE = 0x04
SOCKS_REFUSED = 0x05
SOCKS_TTL = 0x06
SOCKS_BAD_COMMAND = 0x07
SOCKS_BAD_ADDRESS = 0x08
_SOCKS_CONNECT = 1
_ATYP_V4, _ATYP_NAME, _ATYP_V6 = 1, 3, 4

_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})$")
_METHOD_START = re.compile(rb"^[A-Z]{1,16}(?: |$)")
_REQUEST_LINE = re.compile(rb"^([A-Z]{1,16}) (\S{1,8192}) HTTP/1\.[01]$")
_HOP_HEADERS = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")
_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    408: "Request Timeout",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    504: "Gateway Timeout",
}


class WireError(Exception):
    """Input the proxy refuses: ``status`` is the HTTP status to answer (or the SOCKS
    reply code, for SOCKS), ``why`` the reason sent in the body."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why
        self.before = b""  # SOCKS: the method reply owed before this error's reply


@dataclass(frozen=True)
class Destination:
    """Where a client asked to go.  ``kind``: ``connect`` (a tunnel: answer 200 first),
    ``forward`` (send ``head`` upstream, then relay) or ``socks`` (answer the SOCKS
    success reply first).  ``rest``: bytes the client sent after its request head."""

    kind: str
    host: str
    port: int
    head: bytes = b""
    rest: bytes = b""


def is_socks(first: bytes) -> bool:
    return first[:1] == bytes([SOCKS_VERSION])


def check_host(host: str) -> str:
    """A host name or IP literal as the policy sees it: lower case, no trailing dot,
    brackets off an IPv6 literal.  Raises :class:`WireError` (400) for anything else."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host.rstrip(".").lower()
    if not _HOST_NAME.match(name) or ".." in name:
        raise WireError(400, f"not a host name: {host[:80]!r}")
    return name


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise WireError(400, f"bad port {text[:16]!r}")
    return int(text)


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) into its parts; ``default_port`` when there is none
    (None: a port is required, as in CONNECT)."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise WireError(400, "unclosed IPv6 literal")
        host, after = authority[: end + 1], authority[end + 1 :]
        if after and not after.startswith(":"):
            raise WireError(400, f"bad authority {authority[:80]!r}")
        port_text = after[1:]
    else:
        host, sep, port_text = authority.rpartition(":")
        if not sep:
            host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise WireError(400, "CONNECT needs host:port")
        return check_host(host), default_port
    return check_host(host), _port(port_text)


def parse_http_head(buf: bytes) -> Destination | None:
    """The destination of the HTTP request at the start of ``buf``; None while its head
    is incomplete.  Raises :class:`WireError`: 431 past :data:`MAX_HEAD_BYTES`, 400 for
    a malformed head, 405 for an origin-form request (this is a proxy)."""
    end = buf.find(b"\r\n\r\n")
    if not _METHOD_START.match(buf[:17]):
        raise WireError(400, "not an HTTP request")  # at once: binary garbage never ends
    if end < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise WireError(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
        return None
    if end + 4 > MAX_HEAD_BYTES:
        raise WireError(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
    lines = buf[:end].split(b"\r\n")
    match = _REQUEST_LINE.match(lines[0])
    if match is None:
        raise WireError(400, "malformed request line")
    method, target = match.group(1), match.group(2).decode("ascii", "replace")
    headers = lines[1:]
    for h in headers:
        if b":" not in h or h[:1] in (b" ", b"\t"):
            raise WireError(400, "malformed header line")
    rest = buf[end + 4 :]
    if method == b"CONNECT":
        host, port = split_authority(target, None)
        return Destination("connect", host, port, rest=rest)
    if not target.lower().startswith("http://"):
        why = "https:// URLs go through CONNECT" if target.lower().startswith("https://") else ""
        raise WireError(405, why or "not a proxy request (absolute http:// URI expected)")
    after = target[len("http://") :]
    slash = min((i for i in (after.find("/"), after.find("?")) if i >= 0), default=len(after))
    authority, path = after[:slash], after[slash:] or "/"
    if "@" in authority:
        raise WireError(400, "credentials in the URL are not forwarded")
    host, port = split_authority(authority, 80)
    if not path.startswith("/"):
        path = "/" + path
    kept = [h for h in headers if h.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
    if not any(h.split(b":", 1)[0].strip().lower() == b"host" for h in kept):
        kept.insert(0, b"Host: " + authority.encode())
    line = method + b" " + path.encode() + b" " + lines[0].rsplit(b" ", 1)[1]
    head = b"\r\n".join([line, *kept, b"Connection: close"]) + b"\r\n\r\n"
    return Destination("forward", host, port, head=head, rest=rest)


def http_reply(status: int, why: str = "") -> bytes:
    """A complete HTTP/1.1 response; the body (``why``) says what the proxy did."""
    body = (f"shoal egress proxy: {why}\n" if why else "").encode("utf-8", "replace")
    reason = "Connection established" if status == 200 else _REASONS.get(status, "Error")
    head = f"HTTP/1.1 {status} {reason}\r\n"
    if status != 200:
        head += "Content-Type: text/plain; charset=utf-8\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        head += f"X-Shoal-Egress: {why[:200]}\r\n" if why else ""
    return (head + "\r\n").encode("latin-1", "replace") + (body if status != 200 else b"")


def socks_reply(code: int) -> bytes:
    """A SOCKS5 reply with ``code`` and an all-zero bound address."""
    return bytes([SOCKS_VERSION, code, 0, _ATYP_V4, 0, 0, 0, 0, 0, 0])


class Socks5Handshake:
    """The SOCKS5 greeting and request, fed as bytes arrive.

    :meth:`feed` returns (bytes to send the client, the destination or None while
    incomplete).  Raises :class:`WireError` whose ``status`` is the SOCKS reply code
    to send (``-1``: the greeting itself was bad; close without a reply)."""

    def __init__(self) -> None:
        self._buf = b""
        self._greeted = False

    def feed(self, data: bytes) -> tuple[bytes, Destination | None]:
        self._buf += data
        if len(self._buf) > MAX_HEAD_BYTES:
            raise WireError(-1, "SOCKS handshake too large")
        out = b""
        if not self._greeted:
            if len(self._buf) < 2:
                return out, None
            if self._buf[0] != SOCKS_VERSION:
                raise WireError(-1, "not SOCKS5")
            n = self._buf[1]
            if n == 0 or len(self._buf) < 2 + n:
                if n == 0:
                    raise WireError(-1, "SOCKS5 greeting offers no method")
                return out, None
            methods, self._buf = self._buf[2 : 2 + n], self._buf[2 + n :]
            if 0 not in methods:
                raise WireError(-2, "SOCKS5: only the no-authentication method is offered")
            self._greeted = True
            out = bytes([SOCKS_VERSION, 0])
        try:
            dest = self._request()
        except WireError as e:
            e.before = out
            raise
        return out, dest

    def _request(self) -> Destination | None:
        b = self._buf
        if len(b) < 5:
            return None
        if b[0] != SOCKS_VERSION or b[2] != 0:
            raise WireError(SOCKS_FAILURE, "malformed SOCKS5 request")
        if b[1] != _SOCKS_CONNECT:
            raise WireError(SOCKS_BAD_COMMAND, "only CONNECT is supported (no BIND, no UDP)")
        atyp = b[3]
        if atyp == _ATYP_V4:
            end, host = 8, str(ipaddress.IPv4Address(b[4:8])) if len(b) >= 8 else ""
        elif atyp == _ATYP_V6:
            end, host = 20, str(ipaddress.IPv6Address(b[4:20])) if len(b) >= 20 else ""
        elif atyp == _ATYP_NAME:
            end = 5 + b[4]
            host = b[5:end].decode("ascii", "replace") if len(b) >= end else ""
        else:
            raise WireError(SOCKS_BAD_ADDRESS, f"unknown SOCKS5 address type {atyp}")
        if len(b) < end + 2:
            return None
        port = int.from_bytes(b[end : end + 2], "big")
        try:
            name = check_host(host)
        except WireError as e:
            raise WireError(SOCKS_BAD_ADDRESS, e.why) from None
        if port == 0:
            raise WireError(SOCKS_BAD_ADDRESS, "port 0")
        return Destination("socks", name, port, rest=b[end + 2 :])
