"""A recorder of what one call costs a shoal process: which shoal code it runs, in which
threads, its JSON passes (with their sizes and callers) and its SQLite commits.

Used by tests/test_exec_passes.py (the per-exec bounds) and bench/test_bench_walk.py
(the walk before/after a change). Python imports ``sitecustomize`` at start-up from the
path, so a process started with this directory on ``PYTHONPATH`` and ``SHOAL_WALK_DIR``
set records itself; the code under test is not changed (the same recorder measures an
old commit's kernel for an A/B). ``SIGUSR1`` starts a recording (``walk-PID.ready``
appears when it has); ``SIGUSR2`` ends it and writes ``walk-PID.json``.

JSON passes are seen by wrapping ``orjson``'s and ``json``'s ``dumps``/``loads`` (the
package calls them as module attributes), which is how their sizes are known. While not
recording, the hooks return at once: the process runs slower than usual (a Python call
per call), which is why this measures counts, never time.
"""

from __future__ import annotations

import os

WALK_DIR = os.environ.get("SHOAL_WALK_DIR", "")
PACKAGE = "shoal_mcp"


def _install() -> None:
    import itertools
    import json
    import signal
    import sqlite3
    import sys
    import threading

    import orjson

    state: dict = {"on": False}
    calls: list[tuple[int, str, str]] = []
    counts: dict[str, int] = {}
    sites: dict[str, int] = {}  # "what shoal_module:function" -> times, to find the callers
    passes: list[tuple[str, str, int]] = []  # (json.dumps|json.loads, site, bytes of JSON)

    def site_of(frame) -> str:  # noqa: ANN001 - a frame or None
        while frame is not None and not frame.f_globals.get("__name__", "").startswith(PACKAGE):
            frame = frame.f_back
        return "" if frame is None else f"{frame.f_globals['__name__']}:{frame.f_code.co_qualname}"

    def bump(key: str, frame=None) -> str:  # noqa: ANN001 - a frame or None
        counts[key] = counts.get(key, 0) + 1
        site = site_of(frame)
        if site:
            sites[f"{key} {site}"] = sites.get(f"{key} {site}", 0) + 1
        return site

    def profile(frame, event, arg):  # noqa: ANN001 - the sys.setprofile signature
        if state["on"] and event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith(PACKAGE):
                calls.append((threading.get_ident(), module, frame.f_code.co_qualname))

    def watched(kind: str, real):  # noqa: ANN001, ANN202 - wraps a dumps or a loads
        key = f"json.{kind}"

        def call(obj, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            out = real(obj, *args, **kwargs)
            if state["on"]:
                text = out if kind == "dumps" else obj
                size = len(text) if isinstance(text, (str, bytes, bytearray, memoryview)) else 0
                passes.append((key, bump(key, sys._getframe(1)), size))
            return out

        return call

    for module in (orjson, json):
        module.dumps = watched("dumps", module.dumps)
        module.loads = watched("loads", module.loads)

    real_connect = sqlite3.connect

    def connect(*args, **kwargs):  # noqa: ANN002, ANN003 - sqlite3.connect's own
        conn = real_connect(*args, **kwargs)

        def trace(sql: str) -> None:
            if not state["on"]:
                return
            head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
            if head in ("COMMIT", "END"):
                bump("sqlite.commit", sys._getframe(1))
            elif head in ("INSERT", "UPDATE", "DELETE", "REPLACE") and not conn.in_transaction:
                # a write outside a transaction commits by itself
                bump("sqlite.commit", sys._getframe(1))

        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = connect

    def start(signum, frame):  # noqa: ANN001
        calls.clear()
        counts.clear()
        sites.clear()
        passes.clear()
        state["on"] = True
        with open(os.path.join(WALK_DIR, f"walk-{os.getpid()}.ready"), "w"):
            pass

    def stop(signum, frame):  # noqa: ANN001
        state["on"] = False
        hops = sum(1 for a, b in itertools.pairwise(calls) if a[0] != b[0])
        report = {
            "pid": os.getpid(),
            "argv": sys.argv,
            "calls": len(calls),
            "modules": sorted({m for _, m, _ in calls}),
            "threads": len({t for t, _, _ in calls}),
            "thread_hops": hops,
            "counts": counts,
            "sites": sites,
            "json_passes": passes,
            "sequence": [f"{m}:{q}" for _, m, q in calls],
        }
        path = os.path.join(WALK_DIR, f"walk-{os.getpid()}.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(report, fh)
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.setprofile(profile)
    threading.setprofile(profile)


if WALK_DIR and os.path.isdir(WALK_DIR):
    _install()
