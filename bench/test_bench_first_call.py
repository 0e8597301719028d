"""The first tool call after ``initialize`` against the ten after it (issue 16).

The facade connects to the kernel as it starts and attaches after ``initialize``, both in
the background, so the first ``shoal_exec`` should not pay a connect, an attach or a
kernel autostart. Two cases, each a fresh ``shoal-mcp``:

* ``running``: the kernel is up; the first call is sent right after ``initialized``;
* ``autostart``: no kernel is listening; the facade starts one. A client lists its tools
  and a model thinks before the first call: ``THINK_S`` stands for that pause.

Reports first-call latency, the median of the next ten and their ratio (goal: ≤ 3×), to
stdout and bench/.results/first_call.json.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from pathlib import Path

from shoal_mcp.client import KernelClient
from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import KernelProcess, running_kernel
from tests.support.tmp import short_tmp

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "first_call.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
FOLLOWING = 10
THINK_S = 1.0
RATIO_GOAL = 3.0


def _timed_calls(f: RawFacade, pause_s: float) -> tuple[float, list[float]]:
    f.initialize()
    f.request("tools/list")
    time.sleep(pause_s)
    times = []
    for _ in range(1 + FOLLOWING):
        t0 = time.perf_counter()
        reply = f.tool("shoal_exec", {"command": "true"}, timeout=60)
        times.append((time.perf_counter() - t0) * 1000)
        assert reply["result"]["isError"] is False, reply
    return times[0], times[1:]


def _record(name: str, first: float, rest: list[float]) -> float:
    median = statistics.median(rest)
    ratio = first / median
    print(f"\n{name}: first call {first:.1f} ms, median of next {len(rest)} {median:.1f} ms, "
          f"ratio {ratio:.2f} (goal <= {RATIO_GOAL})")  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[name] = {"first_ms": first, "median_next_ms": median, "ratio": ratio}
    RESULTS.write_text(json.dumps(data, indent=2))
    return ratio


def test_first_call_with_a_running_kernel():
    with running_kernel() as kernel:
        f = RawFacade(facade_env(kernel, "bench-first-call"))
        try:
            first, rest = _timed_calls(f, 0.0)
        finally:
            f.close()
    ratio = _record("running", first, rest)
    if not QUICK:
        assert ratio <= RATIO_GOAL


def test_first_call_after_autostart():
    with short_tmp() as tmp:
        kernel = KernelProcess(Path(tmp))  # not started: the facade autostarts it
        f = RawFacade(facade_env(kernel, "bench-autostart", SHOAL_NO_AUTOSTART="0"))
        try:
            first, rest = _timed_calls(f, THINK_S)
        finally:
            f.close()
            client = KernelClient(kernel.socket)
            try:
                pid = client.call("ping", {}, timeout=10)["kernel"]["pid"]
            finally:
                client.close()
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
    ratio = _record("autostart", first, rest)
    if not QUICK:
        assert ratio <= RATIO_GOAL
