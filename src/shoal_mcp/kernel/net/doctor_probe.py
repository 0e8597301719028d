"""The child of ``doctor.check``: a network namespace bridged to an egress channel, and
three attempts from inside it (see ``doctor.py``); prints their outcomes as JSON.

    python -I -S doctor_probe.py CHANNEL HOST PORT
"""

import json
import os
import socket
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)

from shoal_mcp.kernel.access import namespaces  # noqa: E402
from shoal_mcp.kernel.net.limits import BRIDGE_HOST, BRIDGE_PORT  # noqa: E402

TIMEOUT_S = 5.0


def _through_proxy(host: str, port: int) -> bytes:
    with socket.create_connection((BRIDGE_HOST, BRIDGE_PORT), TIMEOUT_S) as s:
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
            if b"shoal-egress-doctor" in data:
                break
        return data


def main(channel: str, host: str, port: int) -> dict[str, str]:
    flags = namespaces.CLONE_NEWNET | (0 if os.geteuid() == 0 else namespaces.CLONE_NEWUSER)
    namespaces.enter(flags, None, init=False, egress=channel)
    out: dict[str, str] = {}
    try:
        reply = _through_proxy(host, port)
        ok = reply.startswith(b"HTTP/1.1 200") and b"shoal-egress-doctor" in reply
        out["allowed"] = "ok" if ok else reply[:120].decode(errors="replace")
    except OSError as e:
        out["allowed"] = f"error: {e}"
    try:
        reply = _through_proxy("refused." + host, port)
        out["refused"] = reply[9:12].decode(errors="replace")
    except OSError as e:
        out["refused"] = f"error: {e}"
    try:
        socket.create_connection((BRIDGE_HOST, port), TIMEOUT_S).close()
        out["direct"] = "connected: the namespace is open"
    except OSError as e:
        out["direct"] = f"no route ({e.strerror or e})"
    return out


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    os.write(1, json.dumps(result).encode())
    sys.exit(0)
