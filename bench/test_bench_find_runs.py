"""Find across runs (issue 33) against ``grep -rc`` over the same blob files.

OUTPUTS stored outputs of a live kernel totalling SIZE bytes (1,000 × 1 MiB = 1 GiB;
200 × 256 KiB = 50 MiB with ``SHOAL_BENCH_QUICK=1``), each a distinct log, one of
them holding a rare line. Then, alternating round by round so both read from the same
page cache, ``grep -rc RARE <state>/cas`` and ``value.get {ref: "outputs", match:
RARE}`` (following its cursor if the time budget cuts the walk) are timed; the ratio of
medians and the kernel's RSS growth during the searches (polled from /proc, plus its
VmHWM) are printed and written to bench/.results/find_runs.json. Targets (issue 33):
ratio ≤ 1.5, RSS growth ≤ 32 MiB; only the memory is asserted, never a time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from bench.test_bench_match import PeakRss
from tests.support.kernel import close_client, running_kernel
from tests.support.procfs import rss_kib, vm_hwm_kib

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "find_runs.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
OUTPUTS = 200 if QUICK else 1000
PER_OUTPUT = (256 if QUICK else 1024) * 1024
ROUNDS = 3 if QUICK else 5
RARE = "RARE-NEEDLE-7d1f"
RARE_RUN = OUTPUTS * 3 // 4  # an older output: most of the walk comes first
RSS_GROWTH_MAX_MIB = 32


def _template(path: Path, size: int) -> None:
    """Log lines filling about ``size`` bytes, before each run prefixes its number."""
    line = b"2026-12-04 12:00:00 INFO request %06d served in 12 ms from cache\n"
    with open(path, "wb") as fh:
        i = 0
        while fh.tell() + len(line) + 16 <= size * 9 // 10:
            fh.write(line % i)
            i += 1


def _find_all(c) -> tuple[dict, int]:
    """The search and its continuations: (the last reply, calls made)."""
    params: dict = {"ref": "outputs", "match": RARE}
    calls, total = 0, 0
    while True:
        reply = c.call("value.get", params, timeout=600)
        calls += 1
        total += reply["total"]
        if not reply["truncated"]:
            return {**reply, "total": total}, calls
        params = reply["next_call"]


def test_bench_find_runs_vs_grep_rc(tmp_path: Path) -> None:
    template = tmp_path / "template.log"
    _template(template, PER_OUTPUT)
    with running_kernel(prefix="shoal-bench-find-") as kernel:
        c = kernel.client("bench-find")
        try:
            for i in range(1, OUTPUTS + 1):
                src = f"awk -v i={i} '{{print i, $0}}' {template}"
                if i == RARE_RUN:
                    src = f"{{ {src}; echo '{RARE} in run {i}'; }}"
                c.call("exec", {"src": src}, timeout=600)
            cas = kernel.state / "cas"
            stored = sum(p.stat().st_size for p in cas.glob("*/*"))
            grep_t, find_t, calls = [], [], []
            start_rss = rss_kib(kernel.pid)
            with PeakRss(kernel.pid) as peak:
                for _ in range(ROUNDS):
                    t = time.perf_counter()
                    grep = subprocess.run(
                        ["grep", "-rc", RARE, str(cas)], capture_output=True, text=True
                    )
                    grep_t.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    reply, n = _find_all(c)
                    find_t.append(time.perf_counter() - t)
                    calls.append(n)
                    counts = [int(x.rsplit(":", 1)[1]) for x in grep.stdout.split()]
                    assert sum(counts) == reply["total"] == 1
                    assert reply["hits"][0]["ref"] == f"out:{RARE_RUN}"
                    assert reply["searched"]["runs"] >= 1
            hwm = vm_hwm_kib(kernel.pid)
        finally:
            close_client(c)
    ratio = statistics.median(find_t) / statistics.median(grep_t)
    growth_mib = (peak.peak - start_rss) / 1024
    results = {
        "quick": QUICK,
        "outputs": OUTPUTS,
        "stored_bytes": stored,
        "grep_rc_median_s": statistics.median(grep_t),
        "find_median_s": statistics.median(find_t),
        "find_over_grep": ratio,
        "calls_per_search": calls,
        "kernel_rss_before_mib": start_rss / 1024,
        "kernel_rss_growth_mib": growth_mib,
        "kernel_vm_hwm_mib": hwm / 1024,
        "targets": {"find_over_grep": "<= 1.5", "kernel_rss_growth_mib": "<= 32"},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    assert growth_mib <= RSS_GROWTH_MAX_MIB  # memory is evidence, not a timing


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
