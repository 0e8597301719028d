"""Bounded selections of issue #31, measured: kernel peak RSS growth of a tail slice of
one 1 GiB line, and of a path into (and the whole of) a 16 MiB `.json` document
(target ≤ 64 MiB each).

Growth is VmHWM after the selection minus VmRSS just before it, with VmHWM reset
(``/proc/PID/clear_refs``) in between. ``SHOAL_BENCH_QUICK=1`` uses 64 MiB / 2 MiB.
Printed and saved to ``bench/.results/bounded_values.json``; the suite's own bounds
live in tests/test_values_bounded.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.kernel import close_client, running_kernel
from tests.support.procfs import peak_growth_kib, reset_peak_rss, rss_kib

from .summary import register_summary

QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
LINE_BYTES = (64 if QUICK else 1024) * 1024 * 1024
JSON_RECORDS = 25_000 if QUICK else 216_000  # ~1.8 MiB / ~16 MiB of records
RESULTS = Path(__file__).resolve().parent / ".results" / "bounded_values.json"
TARGET_GROWTH_MIB = 64.0

_RECORDS = (
    'BEGIN { printf "{\\"meta\\":{\\"n\\":%d},\\"items\\":[", N;'
    ' for (i = 0; i < N; i++) printf "%s{\\"id\\":%d,\\"name\\":\\"record-%d\\",'
    '\\"tags\\":[\\"a\\",\\"b\\",%d],\\"v\\":%d.5,\\"ok\\":true}", (i ? "," : ""), i, i, i % 7, i;'
    ' print "]}" }'
)


def _growth_mib(k, c, ref: str, path: str) -> float:
    reset_peak_rss(k.pid)
    base = rss_kib(k.pid)
    c.call("value.get", {"ref": ref, "path": path}, timeout=600)
    return round(peak_growth_kib(k.pid, base) / 1024, 1)


def test_bench_bounded_values(benchmark, request):
    figures: dict[str, float] = {}
    with running_kernel(prefix="shoal-bbv-") as k:
        c = k.client("bench")
        try:
            line = c.call(
                "exec", {"src": f"head -c {LINE_BYTES} /dev/zero | tr '\\0' a"}, timeout=900
            )
            doc = c.call("exec", {"src": f"awk -v N={JSON_RECORDS} '{_RECORDS}'"}, timeout=600)
            figures["line_mib"] = LINE_BYTES / 2**20
            figures["json_mib"] = round(doc["value"]["out"]["bytes"] / 2**20, 1)
            figures["line_tail_slice_growth_mib"] = _growth_mib(k, c, line["ref"], ".out[-10..]")
            figures["json_last_record_growth_mib"] = _growth_mib(
                k, c, doc["ref"], ".out.json.items[-1].name"
            )
            figures["json_middle_record_growth_mib"] = _growth_mib(
                k, c, doc["ref"], f".out.json.items[{JSON_RECORDS // 2}]"
            )
            figures["json_whole_document_growth_mib"] = _growth_mib(k, c, doc["ref"], ".out.json")
            benchmark.pedantic(
                c.call,
                ("value.get", {"ref": doc["ref"], "path": ".out.json.items[-1].name"}),
                rounds=1 if QUICK else 3,
                iterations=1,
            )
        finally:
            close_client(c)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    lines = [f"{name}: {value}" for name, value in figures.items()]
    lines.append(f"target: growth <= {TARGET_GROWTH_MIB} MiB each; saved to {RESULTS}")
    register_summary(request.config, "bounded selections", lines)
