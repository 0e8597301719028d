"""The recorder of bench/test_bench_walk.py: which shoal code one call runs, in which
threads, with how many JSON passes and SQLite commits.

Python imports ``sitecustomize`` at start-up from the path, so a process started with
this directory on ``PYTHONPATH`` and ``SHOAL_WALK_DIR`` set records itself; the code
under test is not changed in any way (the same recorder measures an old commit's kernel
for an A/B).  ``SIGUSR1`` starts a recording (``walk-PID.ready`` appears when it has);
``SIGUSR2`` ends it and writes ``walk-PID.json``.

While not recording, the profile hook returns at once: the process runs slower than
usual (a Python call per call), which is why this measures counts, never time.
"""

from __future__ import annotations

import os

WALK_DIR = os.environ.get("SHOAL_WALK_DIR", "")
PACKAGE = "shoal_mcp"
JSON_CALLS = frozenset({"dumps", "loads"})
JSON_MODULES = frozenset({"orjson", "ijson"})


def _install() -> None:
    import itertools
    import json
    import signal
    import sqlite3
    import sys
    import threading

    state: dict = {"on": False}
    calls: list[tuple[int, str, str]] = []
    counts: dict[str, int] = {}
    sites: dict[str, int] = {}  # "what shoal_module:function" -> times, to find the callers

    def bump(key: str, frame=None) -> None:  # noqa: ANN001 - a frame or None
        counts[key] = counts.get(key, 0) + 1
        while frame is not None and not frame.f_globals.get("__name__", "").startswith(PACKAGE):
            frame = frame.f_back
        if frame is not None:
            site = f"{key} {frame.f_globals['__name__']}:{frame.f_code.co_qualname}"
            sites[site] = sites.get(site, 0) + 1

    def profile(frame, event, arg):  # noqa: ANN001 - the sys.setprofile signature
        if not state["on"]:
            return
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith(PACKAGE):
                calls.append((threading.get_ident(), module, frame.f_code.co_qualname))
            elif module == "json" and frame.f_code.co_name in JSON_CALLS:
                bump(f"json.{frame.f_code.co_name}", frame.f_back)
        elif event == "c_call":
            name = getattr(arg, "__name__", "")
            owner = getattr(arg, "__module__", None) or ""
            if name in JSON_CALLS and owner.split(".")[0] in JSON_MODULES:
                bump(f"json.{name}", frame)

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
