"""Load bench (issue #9): N concurrent shoal-mcp facades × M mixed pipelined calls
against one kernel, over raw stdio pipes.

Reports calls/s and p50/p99 latency (printed and saved to ``bench/.results/load.json``).
No assertion on time; correctness is asserted (every id answered once, each result
matching its own call, no error: the kernel runs with ``LOAD_POLICY`` so the 128
foreground execs in flight fit the local human's ``max_tasks``). ``SHOAL_BENCH_QUICK=1`` shrinks it to CI size.

    pytest bench/test_bench_load.py -s             # 32 facades x 200 calls
    SHOAL_BENCH_QUICK=1 pytest bench/test_bench_load.py -s
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from bench import agents
from bench.loadgen import run_load
from bench.mcp_pipe import PipeClient
from shoal_mcp.protocol.framing import BACKEND
from tests.support.facade import facade_env
from tests.support.kernel import close_client, running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import fd_count, kernel_commands, threads

from .summary import (
    cpu_seconds,
    idle_share,
    load_baseline,
    machine_cpu_ms_per_call,
    machine_idle,
    register_summary,
    run_queue_s,
    thread_sched_s,
)

QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
FACADES = 8 if QUICK else 32
CALLS = 50 if QUICK else 200
WINDOW = 4
RESULTS = Path(__file__).resolve().parent / ".results" / "load.json"
LOAD_TASKS = 512
# Foreground execs count toward max_tasks (issue 14), and 32 facades x a window of 4 keep
# up to 128 in flight for the one local human, whose default is 64: the bench raises it.
# A table for the local human replaces its permissive grants, so the table grants what
# the mix runs (echo, sleep, exit) and keeps everything else as the local defaults.
LOAD_POLICY = f"""
[principal."uid:{os.geteuid()}"]
max_tasks = {LOAD_TASKS}
proc_spawn = ["*"]
env_read = ["*"]
sandbox = false
opaque = "allow"
[principal."uid:{os.geteuid()}".fs]
read = ["/**"]
write = ["/**"]
"""


def baseline_line(baseline: dict | None, figures: dict) -> str:
    if not baseline:
        return "no recorded baseline for this mode (bench/baselines.json)"
    return (
        f"throughput {figures['calls_per_s_over_baseline']}x the recorded baseline "
        f"({baseline['calls_per_s']} calls/s, p99 {baseline['p99_ms']} ms, {baseline['note']}; "
        "target >= 3x)"
    )


def test_load_many_facades(benchmark, request, tmp_path):
    figures: dict = {}
    policy = tmp_path / "load-policy.toml"
    policy.write_text(LOAD_POLICY)
    with running_kernel("--policy", str(policy), prefix="shbl-") as kernel:
        pid = kernel.pid
        before = {"fds": fd_count(pid), "threads": threads(pid)}
        cpu0 = cpu_seconds(pid)

        def once():
            figures.update(
                run_load(kernel, FACADES, CALLS, WINDOW, timeout=900.0, log_dir=kernel.tmp)
            )

        benchmark.pedantic(once, rounds=1, iterations=1, warmup_rounds=0)
        wait_until(lambda: not kernel_commands(pid), timeout=60, interval=0.2)
        after = {"fds": fd_count(pid), "threads": threads(pid)}
        # How often an exec found its session's ready shell (kernel/exec/ready.py).
        figures["warm"] = _warm(kernel)
        figures["kernel_cpu_ms_per_call"] = round(
            (cpu_seconds(pid) - cpu0) / (FACADES * CALLS) * 1e3, 3
        )

    figures.update(
        backend=BACKEND, quick=QUICK, kernel_before=before, kernel_after=after, cpus=os.cpu_count()
    )
    benchmark.extra_info.update(
        {k: figures[k] for k in ("calls_per_s", "p50_ms", "p99_ms", "calls")}
    )
    figures["lost"] = figures["calls"] - figures["answered"]
    baseline = load_baseline("load", QUICK)
    if baseline:
        figures["calls_per_s_over_baseline"] = round(
            figures["calls_per_s"] / baseline["calls_per_s"], 2
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({k: v for k, v in figures.items() if k != "bad_lines"}, indent=2) + "\n"
    )
    line = (
        f"load: {FACADES} facades x {CALLS} calls (window {WINDOW}, {BACKEND}): "
        f"{figures['answered']}/{figures['calls']} answered in {figures['wall_s']} s = "
        f"{figures['calls_per_s']} calls/s, p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms; "
        f"kernel fds {before['fds']} -> {after['fds']}, threads {before['threads']} -> {after['threads']}; "
        f"saved to {RESULTS}"
    )
    print("\n" + line)
    register_summary(
        request.config,
        f"load ({BACKEND} framing)",
        [
            f"{FACADES} facades x {CALLS} calls: lost {figures['lost']}, "
            f"{figures['calls_per_s']} calls/s, p50 {figures['p50_ms']} ms, "
            f"p99 {figures['p99_ms']} ms (target: 0 lost, p99 <= 150 ms); "
            f"kernel CPU {figures['kernel_cpu_ms_per_call']} ms per call; ready shells "
            f"{figures['warm']['ready_hits']} hits, {figures['warm']['ready_misses']} misses",
            baseline_line(baseline, figures),
            line,
        ],
    )
    assert figures["errors"] == []
    assert figures["duplicates"] == {}
    assert figures["answered"] == FACADES * CALLS


# -- many agents, each with its own server (issue 30) --------------------------------------

AGENTS = 4 if QUICK else 32
AGENT_CALLS = 10 if QUICK else 100
OLD_REF_ENV = "SHOAL_BENCH_OLD_REF"
"""A git ref of this repository: the bench adds a row for that commit's kernel and facade
(built into a temporary directory), so a kernel change is A/B'd in one run."""
AGENTS_RESULTS = RESULTS.with_name("agents.json")


def _shoal_row(env: dict[str, str] | None, policy: Path) -> dict:
    """AGENTS facades, each in a session of its own, on one kernel (run with ``env``)."""
    with running_kernel("--policy", str(policy), env=env, prefix="shag-") as kernel:
        tree = {"PYTHONPATH": env["PYTHONPATH"]} if env else {}
        clients = [
            PipeClient(agents.facade_argv(), facade_env(kernel, f"agent-{i}", **tree))
            for i in range(AGENTS)
        ]
        try:

            def ok(result: dict) -> None:
                assert result["structuredContent"]["value"]["ok"] is True, result

            for c in clients:  # each session's first exec starts its shell: not measured
                ok(c.call_tool("shoal_exec", {"command": "true"}))
            warm0 = _warm(kernel)
            cpu0, queued0, idle0 = cpu_seconds(kernel.pid), run_queue_s(kernel.pid), machine_idle()
            facades0 = sum(cpu_seconds(c.pid) for c in clients)
            loop0 = thread_sched_s(kernel.pid, "owner")
            row = agents.mcp_row(clients, "shoal_exec", {"command": "true"}, AGENT_CALLS, ok)
            idle1, loop1 = machine_idle(), thread_sched_s(kernel.pid, "owner")
            row["idle_share"] = idle_share(idle0, idle1)
            row["machine_cpu_ms_per_call"] = machine_cpu_ms_per_call(idle0, idle1, row["calls"])
            if loop0 is not None and loop1 is not None:
                # The owner loop every agent waits on: its own CPU, and its time runnable
                # but not running (another process had the CPU), per call.
                row["loop_cpu_ms_per_call"] = round((loop1[0] - loop0[0]) / row["calls"] * 1e3, 3)
                row["loop_wait_ms_per_call"] = round((loop1[1] - loop0[1]) / row["calls"] * 1e3, 3)
            # Runnable but not running: every agent waits while the kernel does.
            row["server_queued_ms_per_call"] = round(
                (run_queue_s(kernel.pid) - queued0) / row["calls"] * 1e3, 3
            )
            warm1 = _warm(kernel)
            # An exec that found no ready shell started cold: the slowest calls.
            row["ready_misses"] = warm1.get("ready_misses", 0) - warm0.get("ready_misses", 0)
            if "ready_waited_for" in warm1:  # execs that waited for their shell's start
                row["ready_waited_for"] = warm1["ready_waited_for"] - warm0["ready_waited_for"]
            row["server_cpu_ms_per_call"] = round(
                (cpu_seconds(kernel.pid) - cpu0) / row["calls"] * 1e3, 3
            )
            # The facades are shoal's too: the MCP side FastMCP's one process does.
            row["facade_cpu_ms_per_call"] = round(
                (sum(cpu_seconds(c.pid) for c in clients) - facades0) / row["calls"] * 1e3, 3
            )
        finally:
            for c in clients:
                c.close()
    return row


def there_and_back(contenders: dict[str, Callable[[], dict]]) -> dict[str, dict]:
    """Each contender's row, run twice: in the order given, then in reverse (A B C C B A),
    and the row is the mean of its two runs. Run once each in a fixed order, the later
    rows come out ahead: with the same code on both sides, the row that ran second was
    3-10% faster (HEAD against HEAD: 388 against 354 calls/s, swapped 435 against 426),
    and the FastMCP row, always last, had that advantage over shoal's."""
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    for name in [*contenders, *reversed(contenders)]:
        runs[name].append(contenders[name]())
    return {name: _mean_row(*pair) for name, pair in runs.items()}


def _mean_row(a: dict, b: dict) -> dict:
    """Two runs of one contender as one row: the mean of each figure both have (a
    percentile's mean is not the percentile of both runs' calls, but near it)."""
    row = dict(a)
    for key, value in a.items():
        other = b.get(key)
        if isinstance(value, int | float) and isinstance(other, int | float):
            mean = (value + other) / 2
            row[key] = round(mean) if isinstance(value, int) else round(mean, 3)
    row["runs"] = [a, b]
    return row


def _warm(kernel) -> dict:
    """The kernel's warm-pool and ready-shell counters (kernel.status)."""
    status = kernel.client("bench-status")
    try:
        return status.call("kernel.status", timeout=30)["warm"]
    finally:
        close_client(status)


def _column(value: float | None, width: int) -> str:
    return " " * (width + 1) if value is None else f" {value:{width}.3f}"


def _fastmcp_row() -> dict:
    with agents.started([agents.fastmcp_argv()] * AGENTS, dict(os.environ)) as clients:

        def ok(result: dict) -> None:
            assert result["content"] == [] or result["content"][0]["text"] == "", result

        for c in clients:
            ok(c.call_tool("exec", {"src": "true"}))
        cpu0, idle0 = sum(cpu_seconds(c.pid) for c in clients), machine_idle()
        row = agents.mcp_row(clients, "exec", {"src": "true"}, AGENT_CALLS, ok)
        idle1 = machine_idle()
        row["idle_share"] = idle_share(idle0, idle1)
        row["machine_cpu_ms_per_call"] = machine_cpu_ms_per_call(idle0, idle1, row["calls"])
        row["server_cpu_ms_per_call"] = round(
            (sum(cpu_seconds(c.pid) for c in clients) - cpu0) / row["calls"] * 1e3, 3
        )
    return row


def test_agents_each_with_a_server(request, tmp_path):
    """AGENTS agents x AGENT_CALLS sequential ``true`` calls: shoal, (shoal at another
    commit,) FastMCP servers, bare bash; ratios to the FastMCP row (issue 30's targets:
    shoal's throughput >= 1.0x, its p99 <= 1.0x)."""
    policy = tmp_path / "load-policy.toml"
    policy.write_text(LOAD_POLICY)
    old_ref = os.environ.get(OLD_REF_ENV, "").strip()
    with contextlib.ExitStack() as stack:
        contenders: dict[str, Callable[[], dict]] = {"shoal": lambda: _shoal_row(None, policy)}
        if old_ref:
            old_env = stack.enter_context(agents.old_tree(old_ref, tmp_path / "old"))
            contenders[f"shoal@{old_ref}"] = lambda: _shoal_row(old_env, policy)
        contenders["fastmcp"] = _fastmcp_row
        rows = there_and_back(contenders)
    rows["bash"] = agents.bash_row(AGENTS, AGENT_CALLS)
    peer = rows["fastmcp"]
    for row in rows.values():
        row["throughput_over_fastmcp"] = round(row["calls_per_s"] / peer["calls_per_s"], 2)
        row["p99_over_fastmcp"] = round(row["p99_ms"] / peer["p99_ms"], 2)
    AGENTS_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    AGENTS_RESULTS.write_text(
        json.dumps({"agents": AGENTS, "calls": AGENT_CALLS, "backend": BACKEND,
                    "cpus": os.cpu_count(), "quick": QUICK, "rows": rows}, indent=2) + "\n"
    )  # fmt: skip
    lines = [
        f"{'':>14} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'x fastmcp':>10} {'p99 x':>6} {'server CPU ms/call':>19} {'facade CPU':>11} {'cold':>5} {'idle':>5} {'queued':>7} {'machine':>8} {'loop':>6} {'l.wait':>6} {'waited':>6}"
    ]
    for name, row in rows.items():
        cpu = row.get("server_cpu_ms_per_call")
        facade = row.get("facade_cpu_ms_per_call")
        cold, waited = row.get("ready_misses"), row.get("ready_waited_for")
        idle, queued = row.get("idle_share"), row.get("server_queued_ms_per_call")
        lines.append(
            f"{name:>14} {row['calls_per_s']:9.1f} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} "
            f"{row['throughput_over_fastmcp']:10.2f} {row['p99_over_fastmcp']:6.2f} "
            f"{'' if cpu is None else f'{cpu:19.3f}'} {'' if facade is None else f'{facade:11.3f}'}"
            f"{' ' * 6 if cold is None else f' {cold:5d}'}"
            f"{' ' * 6 if idle is None else f' {idle:5.2f}'}"
            f"{' ' * 8 if queued is None else f' {queued:7.3f}'}"
            f"{_column(row.get('machine_cpu_ms_per_call'), 8)}"
            f"{_column(row.get('loop_cpu_ms_per_call'), 6)}"
            f"{_column(row.get('loop_wait_ms_per_call'), 6)}"
            f"{'' if waited is None else f' {waited:6d}'}"
        )
    lines.append(f"saved to {AGENTS_RESULTS}")
    print("\n" + "\n".join(lines))
    register_summary(
        request.config,
        f"{AGENTS} agents x {AGENT_CALLS} calls, each its own server ({BACKEND})",
        lines,
    )
    for row in rows.values():
        assert row["calls"] == AGENTS * AGENT_CALLS
