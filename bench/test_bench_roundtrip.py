"""Issue #18's headline figure: ``shoal_exec "echo hi"`` through ``shoal-mcp`` over raw
stdio pipes, interleaved round by round with its baselines.

Each round makes one call to each contender, in an order that rotates every round (so
no contender always runs right after another one's cleanup):

* ``bash``: ``subprocess.run(["bash", "-c", "echo hi"])`` from this process — the floor
  (what starting a shell costs at all);
* ``fastmcp``: the SDK's minimal exec server (bench/fastmcp_exec_server.py), same pipes;
* ``shoal``: ``tools/call shoal_exec {"src": "echo hi"}`` through shoal-mcp and a real
  kernel (every reply checked: ``out`` is ``hi\\n``).

Printed at the end: p50/p95 per contender and the targets' ratios (shoal p50 / bash p50
≤ 1.2, shoal p50 / fastmcp p50 ≤ 0.6, shoal p95 / bash p50 ≤ 2). Figures are saved to
``bench/.results/roundtrip.json``; nothing is asserted about time (a bench, not a test).

    pytest bench/test_bench_roundtrip.py            # 3 x 200 rounds
    SHOAL_BENCH_QUICK=1 pytest bench/test_bench_roundtrip.py   # 40 rounds
    SHOAL_BENCH_OLD_REF=REF pytest bench/test_bench_roundtrip.py

``SHOAL_BENCH_OLD_REF=REF`` adds a fourth contender, ``shoal@REF``: that commit's kernel
and facade (bench/agents.py ``old_tree``), interleaved with the others, so a kernel
change's before/after is measured in one run. Issue 30's target for a single call is
``shoal p50 / fastmcp p50 <= 0.9``, printed beside issue 18's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoal_mcp.protocol.framing import BACKEND
from tests.support.facade import facade_env
from tests.support.kernel import close_client, running_kernel

from . import agents
from .mcp_pipe import PipeClient
from .summary import cpu_seconds, load_baseline, percentile, register_summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "roundtrip.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
BLOCKS = 1 if QUICK else 3
ROUNDS_PER_BLOCK = 40 if QUICK else 200
WARMUP = 5 if QUICK else 20
SRC = "echo hi"
OLD_REF_ENV = "SHOAL_BENCH_OLD_REF"
ONE_OWNER_TARGET = 0.9
"""Issue 30: one call's p50 at most this times FastMCP's."""

# The targets, as ratios (see the module docstring).
TARGETS = {
    "shoal_p50_over_bash_p50": 1.2,
    "shoal_p50_over_fastmcp_p50": 0.6,
    "shoal_p95_over_bash_p50": 2.0,
}


def _bare_bash() -> None:
    done = subprocess.run(["bash", "-c", SRC], stdin=subprocess.DEVNULL, capture_output=True)
    assert done.stdout == b"hi\n"


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(contenders: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """``rounds`` rounds, one call to each contender per round, order rotating."""
    names = list(contenders)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_timed(contenders[name]))
    return samples


def summarize(samples: dict[str, list[float]]) -> dict:
    stats = {
        name: {
            "n": len(v),
            "p50_ms": percentile(v, 0.50) * 1e3,
            "p95_ms": percentile(v, 0.95) * 1e3,
            "p99_ms": percentile(v, 0.99) * 1e3,
        }
        for name, v in samples.items()
    }
    ratios = {
        "shoal_p50_over_bash_p50": stats["shoal"]["p50_ms"] / stats["bash"]["p50_ms"],
        "shoal_p50_over_fastmcp_p50": stats["shoal"]["p50_ms"] / stats["fastmcp"]["p50_ms"],
        "shoal_p95_over_bash_p50": stats["shoal"]["p95_ms"] / stats["bash"]["p50_ms"],
        "fastmcp_p50_over_bash_p50": stats["fastmcp"]["p50_ms"] / stats["bash"]["p50_ms"],
    }
    for name in stats:
        if name.startswith("shoal@"):  # the old kernel's row (SHOAL_BENCH_OLD_REF)
            ratios[f"{name}_p50_over_fastmcp_p50"] = (
                stats[name]["p50_ms"] / stats["fastmcp"]["p50_ms"]
            )
            ratios[f"shoal_p50_over_{name}_p50"] = stats["shoal"]["p50_ms"] / stats[name]["p50_ms"]
    return {"stats": stats, "ratios": ratios}


def table_lines(figures: dict) -> list[str]:
    lines = [f"{'':>8}  {'p50 ms':>8}  {'p95 ms':>8}  {'p99 ms':>8}  {'p50 / bash':>10}"]
    bash_p50 = figures["stats"]["bash"]["p50_ms"]
    for name, s in figures["stats"].items():
        lines.append(
            f"{name:>8}  {s['p50_ms']:8.3f}  {s['p95_ms']:8.3f}  {s['p99_ms']:8.3f}  "
            f"{s['p50_ms'] / bash_p50:9.2f}x"
        )
    for key, value in figures["ratios"].items():
        target = TARGETS.get(key)
        verdict = (
            ""
            if target is None
            else f"  (target <= {target}: {'met' if value <= target else 'NOT met'})"
        )
        lines.append(f"{key}: {value:.2f}{verdict}")
    return lines


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with running_kernel(prefix="shrt-") as kernel, _old_shoal(tmp_path_factory) as old:
        shoal = PipeClient(agents.facade_argv(), facade_env(kernel, "rt"))
        fastmcp = PipeClient(agents.fastmcp_argv(), dict(os.environ))
        try:
            yield shoal, fastmcp, kernel, old
        finally:
            shoal.close()
            fastmcp.close()


@contextlib.contextmanager
def _old_shoal(tmp_path_factory) -> Iterator[tuple[str, PipeClient, int] | None]:
    """(name, facade, kernel pid) of the commit ``SHOAL_BENCH_OLD_REF`` names, or None."""
    ref = os.environ.get(OLD_REF_ENV, "").strip()
    if not ref:
        yield None
        return
    with (
        agents.old_tree(ref, tmp_path_factory.mktemp("old")) as env,
        running_kernel(env=env, prefix="shro-") as kernel,
    ):
        tree = {"PYTHONPATH": env["PYTHONPATH"]}
        client = PipeClient(agents.facade_argv(), facade_env(kernel, "rt-old", **tree))
        try:
            yield f"shoal@{ref}", client, kernel.pid
        finally:
            client.close()


def _shoal_call(client: PipeClient) -> Callable[[], None]:
    def call() -> None:
        result = client.call_tool("shoal_exec", {"command": SRC})
        assert result["content"][0]["text"].startswith("hi\n"), result  # the render is the text

    return call


def test_bench_roundtrip_echo_interleaved(benchmark, servers, request):
    shoal, fastmcp, kernel, old = servers
    shoal_call = _shoal_call(shoal)

    def fastmcp_call() -> None:
        result = fastmcp.call_tool("exec", {"src": SRC})
        assert result["content"][0]["text"] == "hi\n", result

    contenders = {"bash": _bare_bash, "fastmcp": fastmcp_call, "shoal": shoal_call}
    server_pids = {"shoal": [kernel.pid, shoal.pid], "fastmcp": [fastmcp.pid]}
    if old is not None:
        old_name, old_client, old_kernel = old
        contenders[old_name] = _shoal_call(old_client)
        server_pids[old_name] = [old_kernel, old_client.pid]
    interleaved(contenders, WARMUP)
    blocks: list[dict] = []
    samples: dict[str, list[float]] = {n: [] for n in contenders}

    cpu_before = {n: [cpu_seconds(p) for p in pids] for n, pids in server_pids.items()}

    def run() -> None:
        for _ in range(BLOCKS):
            block = interleaved(contenders, ROUNDS_PER_BLOCK)
            blocks.append(summarize(block))
            for name, values in block.items():
                samples[name].extend(values)

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    figures = summarize(samples)
    status = kernel.client("rt-status")
    try:  # did each exec find its ready shell (kernel/exec/ready.py)?
        figures["warm"] = status.call("kernel.status", timeout=30)["warm"]
    finally:
        close_client(status)
    calls = BLOCKS * ROUNDS_PER_BLOCK + 0.0
    figures["server_cpu_ms_per_call"] = {
        n: sum(cpu_seconds(p) - c for p, c in zip(pids, cpu_before[n], strict=True)) / calls * 1e3
        for n, pids in server_pids.items()
    }
    figures.update(
        what=f'seconds per round trip of exec "{SRC}", interleaved, raw stdio pipes',
        quick=QUICK,
        rounds=BLOCKS * ROUNDS_PER_BLOCK,
        blocks=blocks,
        framing_backend=BACKEND,
        targets=TARGETS,
        cpus=os.cpu_count(),
    )
    benchmark.extra_info.update(figures["ratios"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    lines = table_lines(figures)
    lines += [
        f"block {i}: shoal/bash {b['ratios']['shoal_p50_over_bash_p50']:.2f}, "
        f"shoal/fastmcp {b['ratios']['shoal_p50_over_fastmcp_p50']:.2f}"
        + "".join(
            f", {key.removesuffix('_p50').replace('_p50_over_', '/')} {value:.2f}"
            for key, value in b["ratios"].items()
            if "shoal@" in key
        )
        for i, b in enumerate(blocks)
    ]
    ratio = figures["ratios"]["shoal_p50_over_fastmcp_p50"]
    verdict = "met" if ratio <= ONE_OWNER_TARGET else "NOT met"
    lines.append(f"issue 30: shoal p50 / fastmcp p50 {ratio:.2f} (target <= 0.9: {verdict})")
    cpu = figures["server_cpu_ms_per_call"]
    lines.append(
        "server CPU per call, bash excluded (kernel + facade for shoal): "
        + ", ".join(f"{name} {ms:.3f} ms" for name, ms in cpu.items())
    )
    warm = figures["warm"]
    lines.append(
        f"ready shells: {warm['ready_hits']} hits, {warm['ready_misses']} misses, "
        f"{warm.get('ready_waited_for', 0)} waited for"
    )
    baseline = load_baseline("roundtrip", QUICK)
    if baseline:
        lines.append(
            f"recorded baseline ({baseline['note']}): shoal {baseline['shoal_p50_ms']} ms = "
            f"{baseline['shoal_p50_ms'] / baseline['bash_p50_ms']:.2f}x bash, "
            f"{baseline['shoal_p50_ms'] / baseline['fastmcp_p50_ms']:.2f}x fastmcp"
        )
    lines.append(f"saved to {RESULTS}")
    register_summary(
        request.config,
        f"echo-hi round trip, interleaved, {BLOCKS}x{ROUNDS_PER_BLOCK} rounds ({BACKEND} framing)",
        lines,
    )
    assert len(samples["shoal"]) == BLOCKS * ROUNDS_PER_BLOCK
