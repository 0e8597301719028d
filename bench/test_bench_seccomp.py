"""What the seccomp allow-list costs a syscall-heavy program.

Each workload runs in a fresh ``python -I -S`` child three ways: unfiltered; under the
allow-list (``seccomp.install_filter``); and under the same program with one argument
load put in front, which the kernel's action cache cannot settle, so the whole program
runs on every syscall (what a filter that reads arguments everywhere would cost).  The
child times only its loop.  Workloads: ``getppid`` (an arg-free allowed syscall: the
cache's case), ``open``+``close`` of /dev/null (``openat`` has an argument check, so the
filter runs every time) and ``dd bs=1`` (read/write, in a program that is not Python).
Medians and ratios to unfiltered are printed and written to bench/.results/seccomp.json;
nothing about time is asserted.  ``SHOAL_BENCH_QUICK=1`` runs fewer, shorter rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import seccomp

from .summary import register_summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "seccomp.json"
SRC = str(Path(seccomp.__file__).resolve().parents[3])
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
ROUNDS = 3 if QUICK else 11
CALLS = 50_000 if QUICK else 200_000

CHILD = """
import ctypes, os, subprocess, sys, time
sys.path.insert(0, {src!r})
from shoal_mcp.kernel.access import seccomp
mode, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
assert ctypes.CDLL(None).prctl(38, 1, 0, 0, 0) == 0
if mode == "allowlist":
    seccomp.install_filter()
elif mode == "uncached":
    seccomp._install(seccomp._load([(seccomp.LD_W_ABS, 0, 0, 16), *seccomp._program()]))
getppid, open_, close = os.getppid, os.open, os.close
t = time.perf_counter()
if work == "getppid":
    for _ in range(n):
        getppid()
elif work == "open":
    for _ in range(n // 4):
        close(open_("/dev/null", os.O_RDONLY))
else:
    subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={{n}}"],
                   check=True, stderr=subprocess.DEVNULL)
print(time.perf_counter() - t)
"""

MODES = ("none", "allowlist", "uncached")
WORKLOADS = ("getppid", "open", "dd")


def _once(mode: str, work: str) -> float:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", CHILD.format(src=SRC), mode, work, str(CALLS)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout)


def test_bench_seccomp_syscall_cost(request) -> None:
    if not seccomp.supported():
        pytest.skip(f"no seccomp filter for {os.uname().machine}")
    medians: dict[str, dict[str, float]] = {}
    for work in WORKLOADS:
        runs: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(ROUNDS):  # interleaved, so drift hits every mode alike
            for mode in MODES:
                runs[mode].append(_once(mode, work))
        medians[work] = {m: statistics.median(v) for m, v in runs.items()}
    ratios = {
        work: {m: medians[work][m] / medians[work]["none"] for m in MODES[1:]} for work in WORKLOADS
    }
    results = {
        "what": "median seconds of a syscall loop in a child, per filter mode",
        "quick": QUICK,
        "rounds": ROUNDS,
        "calls": CALLS,
        "program_len": len(seccomp._program()),
        "medians_s": medians,
        "ratio_to_unfiltered": ratios,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"program: {results['program_len']} instructions; {CALLS} calls per loop"]
    for work in WORKLOADS:
        m, r = medians[work], ratios[work]
        lines.append(
            f"{work:>8}: none {m['none'] * 1e3:7.1f} ms, allow-list x{r['allowlist']:.2f},"
            f" uncached x{r['uncached']:.2f}"
        )
    lines.append(f"saved to {RESULTS}")
    register_summary(request.config, "seccomp allow-list cost (median)", lines)
