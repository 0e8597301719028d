"""The egress proxy: asyncio tasks on the kernel's owner loop (``owner/loop.py``), one
Unix socket per channel (a principal's session and its network policy).

A sandboxed tree reaches its channel through the bridge in its network namespace
(``bridge.py``): each TCP connection accepted on the namespace's loopback port is
passed here as a descriptor (``SCM_RIGHTS``), so its bytes cross one relay only.  A
client on the host may also speak to the channel socket directly (``shoal doctor``).

Each connection: read the request (``wire.py``: HTTP CONNECT, absolute-URI HTTP, or
SOCKS5), judge the host and port by the channel's rules (``rules.py``), resolve the
name here (``resolve.py``; special addresses refused unless named), connect, answer,
relay both ways, journal the attempt (``log.py``) with the exec it is attributed to.
Refusals answer at once: HTTP 403/429/502 with the reason in the body, or a SOCKS reply
code; never a hang.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ..owner.loop import OwnerLoop
from ..owner.tables import TABLES
from . import wire
from .limits import (
    CLOSE_WAIT_S,
    CONNECT_TIMEOUT_S,
    HEAD_TIMEOUT_S,
    MAX_CONNECTIONS_PER_PRINCIPAL,
    MAX_HEAD_BYTES,
    MAX_RELAYS,
    RELAY_CHUNK_BYTES,
)
from .log import Attempt, EgressLog
from .relay import relay
from .resolve import ResolveError, Resolver, own_addresses
from .rules import NetRules, special_address

log = logging.getLogger(__name__)

Attribution = Callable[[str, str], tuple[int | None, bool]]
"""(principal, session) -> (the exec's journal row id or None, ambiguous)."""
_SOCKS_CODE = {403: wire.SOCKS_NOT_ALLOWED, 429: wire.SOCKS_FAILURE, 502: wire.SOCKS_REFUSED}


@dataclass
class Channel:
    """One principal's session under one network policy: its socket and its rules."""

    principal: str
    session: str
    rules: NetRules
    path: str
    sock: socket.socket
    fixed: dict[str, str]


class Refused(Exception):
    def __init__(self, status: int, why: str, socks: int | None = None) -> None:
        super().__init__(why)
        self.status, self.why = status, why
        self.socks = socks if socks is not None else _SOCKS_CODE.get(status, wire.SOCKS_FAILURE)


class EgressProxy:
    """The kernel's proxy (see the module docstring).  ``root``: a private directory of
    the kernel's for the channel sockets; ``attribute``: which exec a connection of a
    principal's session belongs to."""

    def __init__(
        self,
        root: str,
        log_: EgressLog,
        attribute: Attribution,
        resolver: Resolver | None = None,
        loop: OwnerLoop | None = None,
    ) -> None:
        os.makedirs(root, mode=0o700, exist_ok=True)
        self.root = root
        self.log = log_
        self.attribute = attribute
        self.resolver = resolver or Resolver()
        self._own = own_addresses()
        self._channels: dict[tuple, Channel] = {}
        self._made = 0
        self._live: set[tuple[socket.socket, socket.socket]] = set()
        self._open: dict[str, int] = {}
        # The kernel's owner loop runs the proxy's tasks; without one (a test), its own.
        self._own_loop = loop is None
        self._owner = loop if loop is not None else OwnerLoop("egress-proxy")
        self._loop = self._owner.aio
        self._tasks: set[asyncio.Task] = set()  # its connections being served (the loop's)

    @property
    def owner(self) -> OwnerLoop:
        """The loop the proxy runs on (``doctor.py`` answers its probe there too)."""
        return self._owner

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """On the loop: serve a connection as a task of the proxy's own."""
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- channels ---------------------------------------------------------------------

    def channel(
        self,
        principal: str,
        session: str,
        allow: tuple[str, ...],
        deny: tuple[str, ...],
        fixed: tuple[tuple[str, str], ...] = (),
    ) -> str:
        """The socket path of this principal's session under these rules (made once).
        ``fixed``: names this channel alone resolves to given addresses (the doctor's)."""
        key = (principal, session, allow, deny, fixed)
        with TABLES:
            found = self._channels.get(key)
            if found is not None:
                return found.path
            self._made += 1
            path = os.path.join(self.root, f"c{self._made}.sock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(128)
            sock.setblocking(False)
            ch = Channel(principal, session, NetRules(allow, deny), path, sock, dict(fixed))
            self._channels[key] = ch
        self._loop.call_soon_threadsafe(self._loop.add_reader, sock, self._accept, ch)
        return path

    def close_channel(self, path: str) -> None:
        """Stop serving one channel (the doctor's, after its check)."""
        with TABLES:
            found = [(k, c) for k, c in self._channels.items() if c.path == path]
            for key, _ in found:
                del self._channels[key]
        for _, ch in found:
            with contextlib.suppress(OSError):
                os.unlink(ch.path)  # at once: no new connection finds it
            self._loop.call_soon_threadsafe(_stop_listening, self._loop, ch)

    def _accept(self, ch: Channel) -> None:
        try:
            conn, _ = ch.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            log.warning("egress channel %s: accept failed: %s", ch.path, e)
            return
        conn.setblocking(False)
        self._loop.add_reader(conn, self._receive, ch, conn)

    def _receive(self, ch: Channel, conn: socket.socket) -> None:
        """The first message on a channel connection: descriptors from a bridge, or the
        first bytes of a client speaking on the channel socket itself."""
        self._loop.remove_reader(conn)
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, MAX_HEAD_BYTES, 4)
        except (BlockingIOError, InterruptedError):
            self._loop.add_reader(conn, self._receive, ch, conn)
            return
        except OSError:
            conn.close()
            return
        if fds:
            conn.close()
            for fd in fds:
                client = socket.socket(fileno=fd)
                client.setblocking(False)
                self._spawn(self._serve(ch, client, b""))
        elif data:
            self._spawn(self._serve(ch, conn, data))
        else:
            conn.close()

    # -- one connection -----------------------------------------------------------------

    async def _serve(self, ch: Channel, sock: socket.socket, first: bytes) -> None:
        reader, writer = await asyncio.open_connection(sock=sock, limit=RELAY_CHUNK_BYTES)
        dest: wire.Destination | None = None
        try:
            dest = await asyncio.wait_for(self._request(reader, writer, first), HEAD_TIMEOUT_S)
        except (TimeoutError, wire.WireError, OSError) as e:
            await self._bad_request(writer, first, e)
        if dest is None:
            await _close(writer)
            return
        exec_id, ambiguous = self.attribute(ch.principal, ch.session)
        attempt = Attempt(
            ch.principal, ch.session, exec_id, ambiguous, dest.host, dest.port, dest.kind
        )
        counted = False
        try:
            counted = self._take_slot(ch.principal)
            upstream = await self._open_upstream(ch, dest, attempt)
        except Refused as e:
            attempt.why = e.why
            self.log.remember(attempt)
            self._journal(attempt)
            if counted:
                self._release(ch.principal)
            await self._refuse(writer, dest, e)
            return
        try:
            client, early = _detach(reader, writer)
            to_upstream = dest.head + dest.rest + early
            attempt.bytes_up = len(to_upstream)
            pair = (client, upstream)
            self._live.add(pair)
            try:
                up, down = await relay(client, upstream, to_upstream, _answer(dest))
            finally:
                self._live.discard(pair)
            attempt.bytes_up += up
            attempt.bytes_down = down
        except OSError:
            upstream.close()
        finally:
            self._release(ch.principal)
            self._journal(attempt)

    async def _request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes
    ) -> wire.Destination | None:
        buf = first or await reader.read(MAX_HEAD_BYTES)
        if not buf:
            return None
        if wire.is_socks(buf):
            handshake = wire.Socks5Handshake()
            data = buf
            while True:
                out, dest = handshake.feed(data)
                if out:
                    writer.write(out)
                    await writer.drain()
                if dest is not None:
                    return dest
                data = await reader.read(MAX_HEAD_BYTES)
                if not data:
                    return None
        while (dest := wire.parse_http_head(buf)) is None:
            more = await reader.read(MAX_HEAD_BYTES)
            if not more:
                return None
            buf += more
        return dest

    async def _bad_request(self, writer: asyncio.StreamWriter, first: bytes, e: Exception) -> None:
        if isinstance(e, TimeoutError):
            e = wire.WireError(408, f"no complete request within {HEAD_TIMEOUT_S:g} s")
        if not isinstance(e, wire.WireError):
            return
        with contextlib.suppress(OSError):
            if wire.is_socks(first):
                writer.write(e.before)
                if e.status == -2:
                    writer.write(bytes([wire.SOCKS_VERSION, 0xFF]))
                elif e.status >= 0:
                    writer.write(wire.socks_reply(e.status))
            else:
                writer.write(wire.http_reply(e.status, e.why))
            await writer.drain()

    def _journal(self, attempt: Attempt) -> None:
        """The attempt's row, written off the loop (a closed kernel drops it)."""
        self.log.write_later(attempt)

    def _take_slot(self, principal: str) -> bool:
        """On the loop (as ``_open`` is): a connection counted, or ``Refused``."""
        n = self._open.get(principal, 0)
        if n >= MAX_CONNECTIONS_PER_PRINCIPAL:
            raise Refused(
                429, f"{MAX_CONNECTIONS_PER_PRINCIPAL} connections already open for {principal}"
            )
        if sum(self._open.values()) >= MAX_RELAYS:
            raise Refused(429, f"{MAX_RELAYS} connections already open for all principals")
        self._open[principal] = n + 1
        return True

    def _release(self, principal: str) -> None:
        self._open[principal] = self._open.get(principal, 1) - 1

    async def _open_upstream(
        self, ch: Channel, dest: wire.Destination, attempt: Attempt
    ) -> socket.socket:
        ok, why = ch.rules.verdict(dest.host, dest.port)
        attempt.why = why
        if not ok:
            raise Refused(403, why)
        try:
            addresses = await asyncio.wait_for(_resolve(self.resolver, ch, dest), CONNECT_TIMEOUT_S)
        except (ResolveError, TimeoutError) as e:
            why = str(e) or f"cannot resolve {dest.host}"
            raise Refused(502, why, wire.SOCKS_HOST_UNREACHABLE) from None
        usable: list[tuple[str, str | None]] = []
        special: list[tuple[str, str | None]] = []
        for address in addresses:
            kind = special_address(address, self._own)
            named = self.resolver.mapped(dest.host) or dest.host in ch.fixed
            named = named or ch.rules.names_address(address, dest.port)
            (usable if kind is None or named else special).append((address, kind))
        if not usable:
            address, kind = special[0]
            raise Refused(
                403,
                f"{dest.host} resolves to a {kind} address ({address}); allowed only when "
                "net.allow names that address",
            )
        last: Exception | None = None
        loop = asyncio.get_running_loop()
        for address, _kind in usable:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(
                    loop.sock_connect(sock, (address, dest.port)), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError) as e:
                sock.close()
                last = e
                continue
            attempt.address, attempt.allowed = address, True
            return sock
        raise Refused(502, f"cannot connect to {dest.host}:{dest.port}: {last or 'no address'}")

    async def _refuse(
        self, writer: asyncio.StreamWriter, dest: wire.Destination, e: Refused
    ) -> None:
        with contextlib.suppress(OSError):
            if dest.kind == "socks":
                writer.write(wire.socks_reply(e.socks))
            else:
                writer.write(wire.http_reply(e.status, e.why))
            await writer.drain()
        await _close(writer)

    # -- the kernel's end ---------------------------------------------------------------

    async def _cancel_all(self) -> None:
        """The proxy's own tasks (the loop may be shared: nobody else's)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        """Kernel exit: channels closed, open relays ended (their sockets shut down, so
        their relays see their end), pending connections and relays cancelled."""
        with TABLES:
            channels, self._channels = list(self._channels.values()), {}
        for pair in list(self._live):
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(RuntimeError, TimeoutError, concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(CLOSE_WAIT_S)
        if self._own_loop:
            self._owner.close(CLOSE_WAIT_S)
        for ch in channels:
            ch.sock.close()
            with contextlib.suppress(OSError):
                os.unlink(ch.path)


def _stop_listening(loop: asyncio.AbstractEventLoop, ch: Channel) -> None:
    loop.remove_reader(ch.sock)
    ch.sock.close()


async def _resolve(resolver: Resolver, ch: Channel, dest: wire.Destination) -> list[str]:
    if dest.host in ch.fixed:
        return [ch.fixed[dest.host]]
    return await resolver.resolve(dest.host, dest.port)


async def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 1.0)


def _detach(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[socket.socket, bytes]:
    """The client's socket taken from its stream (a duplicate, for the relay) and the
    bytes it sent past its request head; the stream closed."""
    writer.transport.pause_reading()  # type: ignore[attr-defined]
    early = bytes(reader._buffer)  # type: ignore[attr-defined]  # past the head: no API
    raw = writer.get_extra_info("socket")
    client = socket.socket(fileno=os.dup(raw.fileno()))
    writer.transport.abort()  # closes its descriptor only: the duplicate keeps the socket
    return client, early


def _answer(dest: wire.Destination) -> bytes:
    """What the client waits for before its bytes are relayed (none for a plain request)."""
    if dest.kind == "connect":
        return wire.http_reply(200)
    if dest.kind == "socks":
        return wire.socks_reply(wire.SOCKS_OK)
    return b""
