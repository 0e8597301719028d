"""``shoal kernel bridge``: the remote end of a ``--host`` link (run by ssh, never by hand).

It finds this user's kernel the way every client does (autostarting it unless
``SHOAL_NO_AUTOSTART`` says not to), opens its own connection to it after the usual trust
checks, and relays frames: stdin → kernel, kernel → stdout. Nothing is parsed beyond the
framing; the 16 MiB limit is enforced by the FrameReader on both sides (an oversize frame
from the link is answered with the -32600 error to its own id, as the MCP stdio does).
The kernel cannot tell a bridged client from a local one: attach, tokens and policy apply
unchanged. Either side ending ends the bridge; the kernel and its tasks keep running.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

import orjson

from ..client import KernelLost, connect, open_trusted_socket
from ..protocol.framing import FrameReader, FrameWriter, Oversize, encode_frame
from ..protocol.jsonrpc import oversize_reply

STATS_ENV = "SHOAL_BRIDGE_STATS"
"""A file the bridge writes its byte counts to when it ends (JSON; benches read it)."""
EXIT_NO_KERNEL = 3  # as EXIT_UNREACHABLE: no kernel could be reached


class Relay:
    """Two pumps between stdio and the kernel socket, with byte counts."""

    def __init__(self, sock: socket.socket, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
        self.sock = sock
        self.stdin_fd = stdin_fd
        self.out = FrameWriter(stdout_fd)
        self.kernel = FrameWriter(sock.fileno())
        self.up_bytes = 0  # link → kernel
        self.down_bytes = 0  # kernel → link
        self.done = threading.Event()
        self.reason = ""

    def up(self) -> None:
        reader = FrameReader(self.stdin_fd)
        try:
            while frames := reader.read_frames():
                for frame in frames:
                    if isinstance(frame, Oversize):
                        self.out.write_frame(
                            encode_frame(oversize_reply(frame.head, frame.discarded_bytes))
                        )
                        continue
                    self.kernel.write_frame(bytes(frame) + b"\n")
                    self.up_bytes += len(frame) + 1
        except OSError as exc:
            self.finish(f"the kernel connection failed: {exc}")
            return
        self.finish("")  # the link closed: the client is done

    def down(self) -> None:
        reader = FrameReader(self.sock.fileno())
        try:
            while frames := reader.read_frames():
                for frame in frames:
                    if isinstance(frame, Oversize):  # a kernel never sends one; drop it
                        continue
                    self.out.write_frame(bytes(frame) + b"\n")
                    self.down_bytes += len(frame) + 1
        except OSError as exc:
            self.finish(f"the link failed: {exc}")
            return
        self.finish("the shoal kernel closed the connection")

    def finish(self, reason: str) -> None:
        if not self.done.is_set():
            self.reason = reason
            self.done.set()

    def run(self) -> str:
        """Relay until either side ends; the reason ('' for a client that closed)."""
        for pump in (self.up, self.down):
            threading.Thread(target=pump, name=pump.__name__, daemon=True).start()
        self.done.wait()
        return self.reason


def run_bridge(sock_path: str | None, state_dir: str | None) -> int:
    """Attach to (or start) the kernel and relay until either side ends."""
    try:
        probe = connect(sock_path, state_dir)
        target = probe.path
        probe.close()
        sock, _ = open_trusted_socket(target)
    except KernelLost as exc:
        print(f"shoal bridge: {exc}", file=sys.stderr, flush=True)
        return EXIT_NO_KERNEL
    relay = Relay(sock)
    reason = relay.run()
    stats = os.environ.get(STATS_ENV)
    if stats:
        with open(stats, "wb") as fh:
            fh.write(orjson.dumps({"up_bytes": relay.up_bytes, "down_bytes": relay.down_bytes}))
    if reason:
        print(f"shoal bridge: {reason}", file=sys.stderr, flush=True)
        return EXIT_NO_KERNEL
    return 0
