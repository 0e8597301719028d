"""Store bench (issue 19 item 6, issue 18): what durability costs per exec.

Measures, in one run on the same file system, the per-exec cost of the finalize
transaction (blob rows + transcript row + journal completion + session state) with
SQLite at ``synchronous=NORMAL`` (what the kernel uses) and at ``synchronous=FULL`` (the
alternative the issue names), the start row, and the durable ref counter's allocation
(one fsynced reservation per 64 numbers, written ahead of need in the background). Printed and saved to
``bench/.results/store.json``; no assertion on time.

    pytest bench/test_bench_store.py -s
    SHOAL_BENCH_QUICK=1 pytest bench/test_bench_store.py -s
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from shoal_mcp.kernel.store.db import Database
from shoal_mcp.kernel.store.journal import Journal, JournalEntry
from shoal_mcp.kernel.store.refs import RefCounter
from shoal_mcp.kernel.store.sessions import SessionTable, StateDelta
from shoal_mcp.kernel.store.transcript import TranscriptStore

QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
EXECS = 200 if QUICK else 2000
RESULTS = Path(__file__).resolve().parent / ".results" / "store.json"


def _finalize_like(db, journal, transcript, sessions, session, i: int) -> None:
    jid = journal.begin(
        JournalEntry(session=session.name, principal="bench", cwd="/", src=f"echo {i}"),
        spool={"out": "/x", "err": "/y"},
    )
    n = transcript.allocate(session.name)
    with db.transaction() as conn:
        for h in (f"{i:064x}", f"{i + 1:064x}"):
            conn.execute(
                "INSERT OR IGNORE INTO blobs(hash, size, lines, chars, utf8) VALUES (?,?,?,?,?)",
                (h, 6, 1, 6, 1),
            )
        transcript.insert_in(conn, session.name, n, "bench", {"$": "outcome", "status": 0})
        state = sessions.stage(conn, session, StateDelta(set={"I": str(i)}))
        journal.finish_in(
            conn,
            jid,
            JournalEntry(
                session=session.name, principal="bench", cwd="/", src=f"echo {i}", status=0, ok=True
            ),
        )
    sessions.adopt(session, state)


def _run(tmp: Path, synchronous: str) -> dict:
    tmp.mkdir()
    db = Database(tmp / "journal.sqlite3")
    with db.lease() as conn:  # the one pooled connection the loop below reuses
        conn.execute(f"PRAGMA synchronous={synchronous}")
    refs = RefCounter(tmp / "refs.json", db)
    journal = Journal(db)
    transcript = TranscriptStore(db, refs)
    sessions = SessionTable(db, base_env={"PATH": "/usr/bin"})
    session = sessions.get_or_create("bench", "/")
    times = []
    for i in range(EXECS):
        t0 = time.perf_counter()
        _finalize_like(db, journal, transcript, sessions, session, i)
        times.append(time.perf_counter() - t0)
    db.close()
    return {
        "p50_us": round(statistics.median(times) * 1e6, 1),
        "mean_us": round(statistics.fmean(times) * 1e6, 1),
        "durable_ref_writes": refs.durable_writes,
    }


def _counter_cost(tmp: Path) -> dict:
    tmp.mkdir()
    db = Database(tmp / "journal.sqlite3")
    refs = RefCounter(tmp / "refs.json", db)
    times = []
    for _ in range(EXECS):
        t0 = time.perf_counter()
        refs.allocate("bench")
        times.append(time.perf_counter() - t0)
    write_t0 = time.perf_counter()
    refs._write(dict(refs._durable))
    one_write = time.perf_counter() - write_t0
    db.close()
    return {
        "alloc_mean_us": round(statistics.fmean(times) * 1e6, 2),
        "alloc_p50_us": round(statistics.median(times) * 1e6, 2),
        "alloc_max_us": round(max(times) * 1e6, 1),
        "one_reservation_write_us": round(one_write * 1e6, 1),
        "writes": refs.durable_writes,
    }


def test_store_durability_cost(benchmark, tmp_path):
    figures: dict = {}

    def once():
        figures["normal"] = _run(tmp_path / "normal", "NORMAL")
        figures["full"] = _run(tmp_path / "full", "FULL")
        figures["counter"] = _counter_cost(tmp_path / "counter")

    benchmark.pedantic(once, rounds=1, iterations=1, warmup_rounds=0)
    figures.update(execs=EXECS, quick=QUICK, fs=str(tmp_path))
    figures["full_over_normal_p50"] = round(
        figures["full"]["p50_us"] / max(figures["normal"]["p50_us"], 1e-9), 2
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(
        f"\nstore: {EXECS} finalize-shaped execs (start row + one end transaction): "
        f"synchronous=NORMAL p50 {figures['normal']['p50_us']} us, "
        f"FULL p50 {figures['full']['p50_us']} us ({figures['full_over_normal_p50']}x); "
        f"ref counter alloc mean {figures['counter']['alloc_mean_us']} us, p50 "
        f"{figures['counter']['alloc_p50_us']} us, max {figures['counter']['alloc_max_us']} us "
        f"(one fsynced reservation {figures['counter']['one_reservation_write_us']} us per "
        f"64, ahead of need); saved to {RESULTS}"
    )
    assert figures["counter"]["writes"] >= EXECS // 64 - 1
