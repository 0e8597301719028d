"""Memory figures of issue #18 ("memory unchanged or better"), read from ``/proc``.

* facade: ``shoal-mcp``'s VmHWM after ``FACADE_CALLS`` ``shoal_exec`` round trips
  (target ≤ 40 MB after 1,000);
* kernel growth: the kernel's VmRSS after a warm-up and again after ``KERNEL_EXECS``
  more execs on one connection (target ≤ 16 MiB growth over 10,000);
* big output: the kernel's VmHWM after ``seq 1 SEQ_N`` (target ≤ 64 MiB at 20,000,000).

Printed and saved to ``bench/.results/memory.json``. The suite's own bounds live in
tests (tests/test_kernel_bigoutput.py, tests/test_mcp_stdio.py); this file records the
figures against the issue's targets. ``SHOAL_BENCH_QUICK=1`` shrinks every count.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from shoal_mcp.protocol.framing import BACKEND
from tests.support.facade import facade_env
from tests.support.kernel import close_client, running_kernel
from tests.support.procfs import rss_kib, vm_hwm_kib

from .mcp_pipe import PipeClient
from .summary import register_summary

QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
FACADE_CALLS = 200 if QUICK else 1000
KERNEL_WARMUP = 100 if QUICK else 500
KERNEL_EXECS = 400 if QUICK else 10_000
SEQ_N = 2_000_000 if QUICK else 20_000_000
RESULTS = Path(__file__).resolve().parent / ".results" / "memory.json"

TARGETS = {
    "facade_vm_hwm_mb": 40.0,
    "kernel_rss_growth_mib": 16.0,
    "kernel_vm_hwm_after_seq_mib": 64.0,
}


def test_bench_memory(benchmark, request):
    figures: dict = {}

    def run() -> None:
        with running_kernel(prefix="shmem-") as kernel:
            facade = PipeClient(
                [sys.executable, "-m", "shoal_mcp.facade"], facade_env(kernel, "mem-facade")
            )
            try:
                for i in range(FACADE_CALLS):
                    facade.call_tool("shoal_exec", {"command": f"echo {i}"})
                figures["facade_vm_hwm_mb"] = vm_hwm_kib(facade.pid) * 1024 / 1e6
            finally:
                facade.close()

            client = kernel.client("mem-kernel")
            try:
                for i in range(KERNEL_WARMUP):
                    client.call("exec", {"src": f"echo {i}"}, timeout=60)
                before = rss_kib(kernel.pid)
                for i in range(KERNEL_EXECS):
                    client.call("exec", {"src": f"echo {i}"}, timeout=60)
                after = rss_kib(kernel.pid)
                figures["kernel_rss_before_kib"] = before
                figures["kernel_rss_after_kib"] = after
                figures["kernel_rss_growth_mib"] = (after - before) / 1024

                result = client.call("exec", {"src": f"seq 1 {SEQ_N}"}, timeout=600)
                assert result["value"]["status"] == 0, result
                figures["kernel_vm_hwm_after_seq_mib"] = kernel.vm_hwm_kib() / 1024
            finally:
                close_client(client)

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    figures.update(
        quick=QUICK,
        facade_calls=FACADE_CALLS,
        kernel_execs=KERNEL_EXECS,
        seq_n=SEQ_N,
        framing_backend=BACKEND,
        targets=TARGETS,
    )
    benchmark.extra_info.update({k: figures[k] for k in TARGETS})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    labels = {
        "facade_vm_hwm_mb": f"facade VmHWM after {FACADE_CALLS} calls (MB)",
        "kernel_rss_growth_mib": f"kernel RSS growth over {KERNEL_EXECS} execs (MiB)",
        "kernel_vm_hwm_after_seq_mib": f"kernel VmHWM after seq 1 {SEQ_N} (MiB)",
    }
    lines = [
        f"{labels[k]}: {figures[k]:.1f}  (target <= {t}: {'met' if figures[k] <= t else 'NOT met'})"
        for k, t in TARGETS.items()
    ]
    lines.append(f"saved to {RESULTS}")
    register_summary(request.config, f"memory ({BACKEND} framing)", lines)
