"""Round-trip cost of ``shoal_exec "true"`` through shoal-mcp, against two baselines.

* ``bare``: ``subprocess.run(["bash", "-c", "true"])`` in this process, the floor;
* ``fastmcp``: a minimal MCP exec server on the SDK's MCPServer (bench/fastmcp_exec_server.py);
* ``facade``: ``tools/call shoal_exec {"command": "true"}`` through shoal-mcp and a real kernel
  (spawn, spool to CAS, journal row, transcript entry, render, bounded MCP result).

Both MCP servers are driven identically: one already-initialized raw-pipe client reused
across rounds (a request line out, the response line back), so the numbers measure the
servers rather than a client library. Ratios of medians (facade/bare, facade/fastmcp) are
printed at the end and written to bench/.results/facade.json.

``SHOAL_BENCH_QUICK=1`` runs a handful of rounds (a smoke test of the bench itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.facade import facade_env
from tests.support.kernel import running_kernel

from .mcp_pipe import PipeClient
from .summary import register_summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "facade.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
ROUNDS = 5 if QUICK else 200
WARMUP = 1 if QUICK else 10
GROUP = "exec-true-round-trip"

MEDIANS: dict[str, float] = {}


@pytest.fixture(scope="module")
def kernel_env():
    """A live kernel; the environment that points a facade at it."""
    with running_kernel(prefix="shoal-bench-") as kernel:
        yield facade_env(kernel)


@pytest.fixture(scope="module")
def facade(kernel_env):
    client = PipeClient([sys.executable, "-m", "shoal_mcp.facade"], kernel_env)
    yield client
    client.close()


@pytest.fixture(scope="module")
def fastmcp():
    client = PipeClient([sys.executable, str(HERE / "fastmcp_exec_server.py")], dict(os.environ))
    yield client
    client.close()


@pytest.fixture(scope="module", autouse=True)
def ratio_report(request):
    yield
    if not {"bare", "fastmcp", "facade"} <= MEDIANS.keys():
        return
    ratios = {
        "facade_over_bare": MEDIANS["facade"] / MEDIANS["bare"],
        "facade_over_fastmcp": MEDIANS["facade"] / MEDIANS["fastmcp"],
        "fastmcp_over_bare": MEDIANS["fastmcp"] / MEDIANS["bare"],
    }
    from shoal_mcp.protocol.framing import BACKEND

    results = {
        "what": 'median seconds per round trip of exec "true"',
        "quick": QUICK,
        "rounds": ROUNDS,
        "framing_backend": BACKEND,
        "medians_s": MEDIANS,
        "ratios": ratios,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"{name:>8}: {MEDIANS[name] * 1e3:8.3f} ms median" for name in ("bare", "fastmcp", "facade")
    ]
    lines += [f"{name}: {value:.2f}" for name, value in ratios.items()]
    lines.append(f"saved to {RESULTS}")
    # Printed in the terminal summary, after pytest-benchmark's table (a late-registered
    # plugin: bench/conftest.py belongs to the framing bench).
    register_summary(request.config, f"facade round-trip ratios (median, {BACKEND} framing)", lines)


def _run(benchmark, name: str, fn) -> None:
    benchmark.group = GROUP
    benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=WARMUP)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        MEDIANS[name] = stats.stats.median


def test_bench_exec_true_bare(benchmark):
    def bare():
        subprocess.run(["bash", "-c", "true"], check=True)

    _run(benchmark, "bare", bare)


def test_bench_exec_true_fastmcp(benchmark, fastmcp):
    _run(benchmark, "fastmcp", lambda: fastmcp.call_tool("exec", {"src": "true"}))


def test_bench_exec_true_facade(benchmark, facade):
    result = facade.call_tool("shoal_exec", {"command": "true"})
    assert result["structuredContent"]["value"]["ok"] is True
    _run(benchmark, "facade", lambda: facade.call_tool("shoal_exec", {"command": "true"}))
