"""The one way out of a sandboxed tree's network namespace: a loopback port whose
connections are handed to the kernel's egress proxy.

:func:`listen` runs in the namespace's relay (``namespaces.enter``), right after the
network namespace is made and its loopback brought up, before the tree's first
process exists: it binds :data:`~.limits.BRIDGE_PORT` on loopback.  The relay then
serves it (:func:`serve_until`) while it waits for the tree's init; it stays outside the
tree's pid namespace (the tree cannot see, signal or trace it).  Each accepted TCP connection is passed as a
descriptor (``SCM_RIGHTS``) over a fresh connection to the channel's Unix socket (a
pathname socket: reachable across network namespaces), and the relay's copy closed: the
proxy talks to the program's socket directly.  If the proxy is gone, the program's
connection is closed: fail closed, never open.

Standard library only (the relay is a ``python -I -S`` supervisor).
"""

from __future__ import annotations

import os
import socket

from .limits import BRIDGE_HOST, BRIDGE_PORT

_BACKLOG = 128


def listen() -> socket.socket:
    """The bridge's listening socket on the namespace's loopback."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((BRIDGE_HOST, BRIDGE_PORT))
    sock.listen(_BACKLOG)
    return sock


def serve_until(listener: socket.socket, channel: str, child: int) -> None:
    """Hand each connection accepted on ``listener`` to the proxy at ``channel`` until
    process ``child`` exits (its pidfd turns readable).  One thread: a process that
    unshared a pid namespace cannot start threads."""
    import select

    try:
        done = os.pidfd_open(child)
    except OSError:
        return  # the child is gone already
    listener.setblocking(False)
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    poller.register(done, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poller.poll()}
        except InterruptedError:
            continue
        if done in ready:
            os.close(done)
            listener.close()
            return
        _hand_over(listener, channel)


def _hand_over(listener: socket.socket, channel: str) -> None:
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as proxy:
            proxy.connect(channel)
            socket.send_fds(proxy, [b"\0"], [conn.fileno()])
    except OSError:
        pass  # no proxy: the program sees its connection closed
    finally:
        conn.close()


def proxy_environ(port: int = BRIDGE_PORT) -> dict[str, str]:
    """The environment that points programs at the bridge (upper and lower case)."""
    http = f"http://{BRIDGE_HOST}:{port}"
    env = {"HTTP_PROXY": http, "HTTPS_PROXY": http, "ALL_PROXY": f"socks5h://{BRIDGE_HOST}:{port}"}
    env.update({k.lower(): v for k, v in env.items()})
    env.update({"NO_PROXY": "", "no_proxy": ""})
    return env


PROXY_ENV_NAMES = tuple(proxy_environ())
