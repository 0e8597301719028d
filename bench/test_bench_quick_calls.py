"""Quick calls answered by the owner loop: ``task.list`` round trips through a real kernel.

A quick method that answers from the kernel's tables alone (``on_loop`` in
``kernel/rpc/registry.py``) is run by the owner loop as it reads the frame, instead of
being handed to a worker thread and its answer back. One client, sequential calls, on a
session with a few finished tasks, in blocks that alternate between the kernels:

* ``shoal``: this tree's kernel;
* ``shoal@REF``: the kernel of git ``REF`` when ``SHOAL_BENCH_OLD_REF`` names one
  (built into a temporary directory, as ``test_bench_load.py`` does), the same client.

Printed: p50/p99 per kernel and the ratio to the old one; saved to
``bench/.results/quick_calls.json``. Nothing is asserted about time.

    SHOAL_BENCH_OLD_REF=<ref> pytest bench/test_bench_quick_calls.py -s   # 3 x 1000 calls
    SHOAL_BENCH_QUICK=1 pytest bench/test_bench_quick_calls.py             # 1 x 100
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bench import agents
from shoal_mcp.client import KernelClient
from tests.support.kernel import close_client, running_kernel

from .summary import percentile

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "quick_calls.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
BLOCKS = 1 if QUICK else 3
CALLS_PER_BLOCK = 100 if QUICK else 1000
WARMUP = 20 if QUICK else 200
OLD_REF_ENV = "SHOAL_BENCH_OLD_REF"


@contextlib.contextmanager
def _client_of(env: dict[str, str] | None, tmp: Path) -> Iterator[KernelClient]:
    with running_kernel(env=env, prefix="shqc-") as kernel:
        client = kernel.client("bench-quick")
        try:
            for _ in range(3):  # a few finished tasks to list
                client.call("exec", {"src": "true"}, timeout=60)
            yield client
        finally:
            close_client(client)


def _block(client: KernelClient, n: int) -> list[float]:
    took = []
    for _ in range(n):
        began = time.perf_counter()
        reply = client.call("task.list", {}, timeout=30)
        took.append(time.perf_counter() - began)
        assert "tasks" in reply, reply
    return took


def test_quick_calls_on_the_owner_loop(tmp_path: Path) -> None:
    old_ref = os.environ.get(OLD_REF_ENV, "").strip()
    samples: dict[str, list[float]] = {"shoal": []}
    with contextlib.ExitStack() as stack:
        clients = {"shoal": stack.enter_context(_client_of(None, tmp_path))}
        if old_ref:
            env = stack.enter_context(agents.old_tree(old_ref, tmp_path / "old"))
            clients[f"shoal@{old_ref}"] = stack.enter_context(_client_of(env, tmp_path))
            samples[f"shoal@{old_ref}"] = []
        for client in clients.values():
            _block(client, WARMUP)
        for b in range(BLOCKS):
            order = list(clients.items())
            if b % 2:
                order.reverse()
            for name, client in order:
                samples[name] += _block(client, CALLS_PER_BLOCK)
    rows = {}
    for name, took in samples.items():
        took.sort()
        rows[name] = {
            "calls": len(took),
            "p50_ms": round(percentile(took, 0.50) * 1e3, 4),
            "p99_ms": round(percentile(took, 0.99) * 1e3, 4),
        }
    if old_ref:
        old = rows[f"shoal@{old_ref}"]
        rows["shoal"]["p50_x_old"] = round(rows["shoal"]["p50_ms"] / old["p50_ms"], 3)
        rows["shoal"]["p99_x_old"] = round(rows["shoal"]["p99_ms"] / old["p99_ms"], 3)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print(f"\n--- task.list round trips, one client ({BLOCKS} x {CALLS_PER_BLOCK}) ---")
    for name, row in rows.items():
        extra = ""
        if "p50_x_old" in row:
            extra = f"  p50 x old {row['p50_x_old']}  p99 x old {row['p99_x_old']}"
        print(f"{name:>20}  p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms{extra}")
    assert all(row["calls"] == BLOCKS * CALLS_PER_BLOCK for row in rows.values())
