"""Soak bench (issue 14): two abusive principals beside a normal agent.

A kernel runs; a normal agent (the local human) measures its call latency alone (idle
p99: half before the abuse and half after it, pooled, so the machine's own load at
both ends is in the baseline), and while two token principals with no grants run the
abuse mix of ``bench/abuse.py`` in their own processes (each within the default
``max_cpu_ms_per_s`` of a token principal). Printed as a table and saved to
``bench/.results/soak.json``: the agent's idle and loaded p50/p99 and their ratio
(target: loaded p99 within 2x idle), kernel RSS at start, peak and end (target: end
within 100 MiB of start), and each abuser's tally of answers.

Memory is asserted (the end RSS bound; no traceback, no lost connection for the agent);
times are reported, not asserted (a shared machine makes them noisy).

    pytest bench/test_bench_soak.py -s                       # 10 minutes
    SHOAL_BENCH_QUICK=1 pytest bench/test_bench_soak.py -s   # ~30 s
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from bench.abuse import abuse
from tests.support.budgets import token_kernel
from tests.support.procfs import rss_kib, threads, vm_hwm_kib
from tests.support.wire import RawConn

QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
IDLE_S = 8.0 if QUICK else 60.0
ABUSE_S = 30.0 if QUICK else 600.0
END_RSS_BOUND_KIB = 100 * 1024
P99_TARGET = 2.0
RESULTS = Path(__file__).resolve().parent / ".results" / "soak.json"


def _agent_calls(conn: RawConn, seconds: float) -> list[float]:
    """The normal agent: exec, read its value, a short journal query, a ping; latencies."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    ref = None
    while time.monotonic() < deadline:
        for method, params in (
            ("exec", {"src": "echo ok", "position": "value"}),
            ("value.get", {"ref": ref or "out:1", "path": ".out"}),
            ("journal.query", {"limit": 5}),
            ("ping", {}),
        ):
            started = time.perf_counter()
            reply = conn.call(method, params, timeout=120)
            latencies.append(time.perf_counter() - started)
            assert "result" in reply, (method, reply)
            if method == "exec":
                ref = reply["result"]["ref"]
    return latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@pytest.mark.timeout(IDLE_S + ABUSE_S + 300)  # the suite's 300 s default is per test
def test_soak_two_abusers_beside_a_normal_agent() -> None:
    with token_kernel("shsoak") as env:
        pid = env.kernel.pid
        with env.raw("soak-agent", principal=None) as agent:
            _agent_calls(agent, 1.0)  # warm up
            rss_start = rss_kib(pid)
            idle = _agent_calls(agent, IDLE_S / 2)
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            deadline = time.monotonic() + ABUSE_S
            abusers = [
                ctx.Process(
                    target=abuse,
                    args=(str(env.kernel.socket), env.tokens[name], name, deadline, out),
                )
                for name in ("agent:flood", "agent:other")
            ]
            for proc in abusers:
                proc.start()
            loaded = _agent_calls(agent, ABUSE_S)
            tallies = dict(out.get(timeout=300) for _ in abusers)
            for proc in abusers:
                proc.join(60)
            peak = vm_hwm_kib(pid)
            idle += _agent_calls(agent, IDLE_S / 2)  # also lets closed connections finish
            rss_end = rss_kib(pid)
            kernel_threads = threads(pid)
    figures = {
        "quick": QUICK,
        "abuse_s": ABUSE_S,
        "agent_calls_idle": len(idle),
        "agent_calls_loaded": len(loaded),
        "idle_p50_ms": round(_pct(idle, 0.50), 2),
        "idle_p99_ms": round(_pct(idle, 0.99), 2),
        "loaded_p50_ms": round(_pct(loaded, 0.50), 2),
        "loaded_p99_ms": round(_pct(loaded, 0.99), 2),
        "rss_start_mib": round(rss_start / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_end_mib": round(rss_end / 1024, 1),
        "kernel_threads_end": kernel_threads,
        "abusers": tallies,
    }
    figures["p99_ratio"] = round(figures["loaded_p99_ms"] / max(figures["idle_p99_ms"], 1e-3), 2)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    _print_table(figures)
    for name, tally in tallies.items():
        lost = {k: v for k, v in tally.items() if k.startswith("lost:")}
        assert not lost, (name, lost)
    assert rss_end - rss_start <= END_RSS_BOUND_KIB, figures


def _print_table(f: dict) -> None:
    ratio_ok = "yes" if f["p99_ratio"] <= P99_TARGET else "NO"
    rss_ok = "yes" if f["rss_end_mib"] - f["rss_start_mib"] <= 100 else "NO"
    rows = [
        ("agent calls (idle / loaded)", f"{f['agent_calls_idle']} / {f['agent_calls_loaded']}", ""),
        ("agent p50 ms (idle / loaded)", f"{f['idle_p50_ms']} / {f['loaded_p50_ms']}", ""),
        ("agent p99 ms (idle / loaded)", f"{f['idle_p99_ms']} / {f['loaded_p99_ms']}", ""),
        ("p99 loaded / idle", f"{f['p99_ratio']}", f"<= {P99_TARGET}: {ratio_ok}"),
        (
            "kernel RSS MiB start / peak / end",
            f"{f['rss_start_mib']} / {f['rss_peak_mib']} / {f['rss_end_mib']}",
            f"end - start <= 100: {rss_ok}",
        ),
        ("kernel threads at end", f"{f['kernel_threads_end']}", ""),
    ]
    print(f"\nsoak ({f['abuse_s']:.0f} s of abuse{', quick' if f['quick'] else ''}):")
    width = max(len(r[0]) for r in rows)
    for label, value, target in rows:
        print(f"  {label:<{width}}  {value:<24} {target}")
    for name, tally in f["abusers"].items():
        print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in sorted(tally.items())))
    print(f"saved to {RESULTS}")
