"""``shoal doctor``'s end-to-end check of the egress path (``egress.check``).

The kernel starts a one-request HTTP stand-in on its loopback and a channel that allows
only :data:`DOCTOR_HOST` (resolved to that stand-in by this channel alone), then runs
``doctor_probe.py`` in a child: it enters a network namespace of its own bridged to the
channel, as a sandboxed tree does, and tries (1) the stand-in through the proxy
(CONNECT), which must answer; (2) a host the channel does not allow, which must be
refused with 403; (3) the stand-in's port directly, which must find no route.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys

from ..owner.loop import LoopClosed
from .proxy import EgressProxy

DOCTOR_HOST = "doctor.shoal.invalid"
MARKER = b"shoal-egress-doctor"
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doctor_probe.py")
PROBE_TIMEOUT_S = 20.0


def check(proxy: EgressProxy) -> dict[str, object]:
    """Run the probe; ``{"ok": bool, "steps": {...}, "detail": str}``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    loop = proxy.owner  # the stand-in answers on the proxy's loop: no thread of its own
    fd = listener.fileno()
    loop.run(lambda: loop.add_reader(fd, _answer, listener), PROBE_TIMEOUT_S)
    try:
        channel = proxy.channel(
            "doctor", "", (f"{DOCTOR_HOST}:{port}",), (), ((DOCTOR_HOST, "127.0.0.1"),)
        )
        done = subprocess.run(
            [sys.executable, "-I", "-S", PROBE, channel, DOCTOR_HOST, str(port)],
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        try:
            steps = json.loads(done.stdout)
        except ValueError:
            err = done.stderr.decode(errors="replace").strip()[-300:]
            return {"ok": False, "steps": {}, "detail": f"the probe failed: {err or 'no output'}"}
    except (OSError, subprocess.SubprocessError) as e:
        return {"ok": False, "steps": {}, "detail": f"the probe could not run: {e}"}
    finally:
        with contextlib.suppress(TimeoutError, LoopClosed):
            loop.run(lambda: loop.remove_reader(fd), PROBE_TIMEOUT_S)
        listener.close()
        if "channel" in locals():
            proxy.close_channel(channel)
    ok = steps.get("allowed") == "ok" and steps.get("refused") == "403"
    ok = ok and steps.get("direct", "").startswith("no route")
    return {"ok": ok, "steps": steps, "detail": "" if ok else json.dumps(steps)}


def _answer(listener: socket.socket) -> None:
    """On the loop, the listener readable: answer the connection with the marker (a few
    bytes: the send never waits) and close it."""
    try:
        conn, _ = listener.accept()
    except OSError:  # BlockingIOError: the peer left before it was accepted
        return
    with conn, contextlib.suppress(OSError):
        conn.sendall(MARKER)
