"""A kernel client for another uid, driven over pipes (JSON lines).

A kernel refuses connections from any uid but its own, root included, so tests that run
as root and talk to an unprivileged kernel start this under ``setpriv`` as the kernel's
uid (tests/support/unprivileged.py).  One request per line on stdin::

    {"conn": KEY, "session": S, "token": T|null, "method": M, "params": {...}, "timeout": F}
    {"close": KEY}

and one reply per line on stdout: ``{"result": ...}`` or ``{"error": {code, message,
data}}``.  Connections are kept by ``KEY`` and attached on first use.
"""

from __future__ import annotations

import json
import sys

from shoal_mcp.client import KernelClient
from shoal_mcp.protocol.errors import RpcError


def main(socket_path: str) -> int:
    conns: dict[str, KernelClient] = {}
    for line in sys.stdin:
        req = json.loads(line)
        reply: dict
        try:
            if "close" in req:
                c = conns.pop(req["close"], None)
                if c is not None:
                    c.close()
                reply = {"result": None}
            else:
                c = conns.get(req["conn"])
                if c is None:
                    c = KernelClient(socket_path)
                    attach = {"session": req["session"]}
                    if req.get("token"):
                        attach["token"] = req["token"]
                    c.call("session.attach", attach, timeout=30)
                    conns[req["conn"]] = c
                reply = {"result": c.call(req["method"], req["params"], timeout=req["timeout"])}
        except RpcError as e:
            reply = {"error": {"code": e.code, "message": e.message, "data": e.data}}
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            reply = {"error": {"code": 0, "message": f"{type(e).__name__}: {e}", "data": None}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    for c in conns.values():
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
