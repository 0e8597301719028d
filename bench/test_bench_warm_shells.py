"""Exec latency at the kernel socket, cold supervisors vs the warm pool (issue 18).

* ``bare``: ``subprocess.run(["bash", "-c", CMD])`` in this process, the floor;
* ``cold``: ``exec {"src": CMD}`` on a kernel started with ``SHOAL_WARM_SHELLS=0``
  (each exec starts its supervisor, a ``python -I -S``, on the critical path);
* ``warm``: the same on a kernel with warm shells (the zygote forks a supervisor).

Measured over a raw ``KernelClient`` (the MCP round trip is ``test_bench_facade.py``'s).
Calls are spaced by ``PAUSE_S`` (outside the timed part), as between an agent's calls.  p50/p95 per case and the ratios
warm/cold and warm/bare are printed and written to bench/.results/warm_shells.json.

``SHOAL_BENCH_QUICK=1`` runs a handful of rounds (a smoke test of the bench itself).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.kernel import running_kernel

from .summary import register_summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "warm_shells.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
ROUNDS = 5 if QUICK else 40
WARMUP = 2 if QUICK else 10
PAUSE_S = 0.02
COMMANDS = ("echo hi", "true")

SAMPLES: dict[str, list[float]] = {}


@pytest.fixture(scope="module")
def clients():
    with (
        running_kernel(env={"SHOAL_WARM_SHELLS": "0"}, prefix="shoal-bcold-") as cold,
        running_kernel(prefix="shoal-bwarm-") as warm,
    ):
        made = {"cold": cold.client("bench"), "warm": warm.client("bench")}
        try:
            yield made
        finally:
            for c in made.values():
                c.close()


def _measure(key: str, fn) -> None:
    for _ in range(WARMUP):
        fn()
        time.sleep(PAUSE_S)
    out = SAMPLES.setdefault(key, [])
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        time.sleep(PAUSE_S)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_bench_exec_latency_cold_vs_warm(clients, cmd: str) -> None:
    # Interleaved in blocks (ROUNDS calls each) so load drifts hit all three alike.
    blocks = 1 if QUICK else 5
    for _ in range(blocks):
        _measure(f"bare {cmd}", lambda: subprocess.run(["bash", "-c", cmd], check=True))
        for mode in ("cold", "warm"):
            client = clients[mode]

            def call(client=client) -> None:
                got = client.call("exec", {"src": cmd}, timeout=60)
                assert got["value"]["ok"] is True

            _measure(f"{mode} {cmd}", call)


@pytest.fixture(scope="module", autouse=True)
def report(request):
    yield
    if not SAMPLES:
        return
    table = {}
    for key, xs in SAMPLES.items():
        xs = sorted(xs)
        table[key] = {
            "p50_ms": round(statistics.median(xs) * 1e3, 3),
            "p95_ms": round(xs[int(0.95 * (len(xs) - 1))] * 1e3, 3),
            "n": len(xs),
        }
    ratios = {}
    for cmd in COMMANDS:
        keys = [f"{m} {cmd}" for m in ("bare", "cold", "warm")]
        if all(k in table for k in keys):
            bare, cold, warm = (table[k]["p50_ms"] for k in keys)
            ratios[f"warm/cold p50 ({cmd})"] = round(warm / cold, 3)
            ratios[f"warm/bare p50 ({cmd})"] = round(warm / bare, 3)
            ratios[f"cold/bare p50 ({cmd})"] = round(cold / bare, 3)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"quick": QUICK, "rounds": ROUNDS, "table": table, "ratios": ratios}, indent=2)
        + "\n"
    )
    lines = [
        f"{k:>14}: p50 {v['p50_ms']:8.3f} ms  p95 {v['p95_ms']:8.3f} ms  (n={v['n']})"
        for k, v in table.items()
    ]
    lines += [f"{k}: {v}" for k, v in ratios.items()]
    lines.append(f"saved to {RESULTS}")
    register_summary(request.config, "exec latency, cold vs warm shells", lines)
