"""The walk of one ``shoal_exec`` (issue 30): what the kernel and the facade run for it.

For one ``tools/call shoal_exec {"command": "true"}`` through a real ``shoal-mcp`` and
kernel, after a warm-up: the shoal modules and Python calls each process ran, how many
threads took part and how often the work hopped between them, the whole-message JSON
passes (``orjson``/``json`` dumps and loads) and the SQLite commits.  The recorder is
tests/support/walk/sitecustomize.py, loaded through ``PYTHONPATH``: the code under test
is unchanged.  Then, on a kernel without the recorder, the kernel's CPU and its futex calls
per exec (``strace -c``, where strace exists).

``SHOAL_BENCH_OLD_REF=REF`` adds the same figures for that commit's kernel and facade
(bench/agents.py ``old_tree``): the before/after of a kernel change in one run.
Counts are printed and saved to ``bench/.results/walk.json``; nothing about them is
asserted but that the walk was recorded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from bench import agents
from bench.mcp_pipe import PipeClient
from shoal_mcp.protocol.framing import BACKEND
from tests.support.facade import facade_env
from tests.support.kernel import running_kernel
from tests.support.recorder import recorded, recorder_env

from .summary import cpu_seconds, register_summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "walk.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
WARMUP = 5
CPU_EXECS = 20 if QUICK else 200
OLD_REF_ENV = "SHOAL_BENCH_OLD_REF"


def _ok(result: dict) -> None:
    assert result["structuredContent"]["value"]["ok"] is True, result


def walk(tree_env: dict[str, str], tmp: Path) -> dict:
    """The walk of one exec, per process (kernel, facade)."""
    walk_dir = tmp / "walk"
    walk_dir.mkdir(parents=True)
    env = recorder_env(walk_dir, tree_env.get("PYTHONPATH"))
    with running_kernel(env=env, prefix="shwk-") as kernel:
        client = PipeClient(agents.facade_argv(), facade_env(kernel, "walk", **env))
        try:
            for _ in range(WARMUP):
                _ok(client.call_tool("shoal_exec", {"command": "true"}))
            pids = {"kernel": kernel.pid, "facade": client.pid}
            for pid in pids.values():
                recorded(pid, walk_dir, signal.SIGUSR1, "ready")
            _ok(client.call_tool("shoal_exec", {"command": "true"}))
            time.sleep(0.2)  # the exec's after-reply work (journal, events) lands too
            reports = {
                name: json.loads(recorded(pid, walk_dir, signal.SIGUSR2, "json").read_text())
                for name, pid in pids.items()
            }
        finally:
            client.close()
    return {
        name: {k: r[k] for k in ("calls", "threads", "thread_hops", "counts", "sites")}
        | {"modules": len(r["modules"]), "module_names": r["modules"]}
        for name, r in reports.items()
    }


def kernel_cost(tree_env: dict[str, str]) -> dict:
    """Kernel CPU and futex calls per exec, without the recorder."""
    extra = {"PYTHONPATH": tree_env["PYTHONPATH"]} if "PYTHONPATH" in tree_env else {}
    with running_kernel(env=extra, prefix="shwc-") as kernel:
        client = PipeClient(agents.facade_argv(), facade_env(kernel, "cost", **extra))
        try:
            for _ in range(WARMUP):
                _ok(client.call_tool("shoal_exec", {"command": "true"}))
            cpu0 = cpu_seconds(kernel.pid)
            for _ in range(CPU_EXECS):
                _ok(client.call_tool("shoal_exec", {"command": "true"}))
            figures = {"kernel_cpu_ms_per_exec": (cpu_seconds(kernel.pid) - cpu0) / CPU_EXECS * 1e3}
            futex = _futex_calls(kernel.pid, client)
            if futex is not None:
                figures["kernel_futex_calls_per_exec"] = futex
        finally:
            client.close()
    return figures


def _futex_calls(pid: int, client: PipeClient, execs: int = 20) -> float | None:
    strace = shutil.which("strace")
    if strace is None:
        return None
    out = Path(f"/tmp/shoal-walk-strace-{pid}.txt")
    tracer = subprocess.Popen(
        [strace, "-f", "-c", "-e", "trace=futex", "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert tracer.stderr is not None
        line = tracer.stderr.readline()  # "strace: Process N attached": tracing from here
        if b"attached" not in line:
            return None
        for _ in range(execs):
            _ok(client.call_tool("shoal_exec", {"command": "true"}))
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    if not out.exists():
        return None
    text = out.read_text()
    out.unlink()
    found = re.search(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?futex\s*$", text, re.M)
    if found:
        return round(int(found[1]) / execs, 1)
    # strace -c lists only the calls it saw (and nothing when it saw none): attached as
    # above and without a futex line, the kernel made none.
    return 0.0


def test_walk_of_one_exec(request, tmp_path):
    trees: dict[str, dict[str, str]] = {"this tree": {}}
    old_ref = os.environ.get(OLD_REF_ENV, "").strip()
    rows: dict[str, dict] = {}
    with _maybe_old(old_ref, tmp_path) as old_env:
        if old_env is not None:
            trees[f"shoal@{old_ref}"] = old_env
        for i, (name, env) in enumerate(trees.items()):
            rows[name] = walk(env, tmp_path / f"t{i}") | {"cost": kernel_cost(env)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"backend": BACKEND, "rows": rows}, indent=2) + "\n")
    lines = []
    for name, row in rows.items():
        k, f, cost = row["kernel"], row["facade"], row["cost"]
        passes = sum(k["counts"].get(f"json.{n}", 0) + f["counts"].get(f"json.{n}", 0)
                     for n in ("dumps", "loads"))  # fmt: skip
        lines.append(
            f"{name}: kernel {k['modules']} modules, {k['calls']} calls, {k['threads']} threads, "
            f"{k['thread_hops']} thread hops, {k['counts'].get('sqlite.commit', 0)} commits; "
            f"facade {f['modules']} modules, {f['calls']} calls; JSON passes {passes} "
            f"(kernel {k['counts']}, facade {f['counts']}); kernel CPU "
            f"{cost['kernel_cpu_ms_per_exec']:.3f} ms/exec, futex "
            f"{cost.get('kernel_futex_calls_per_exec', 'n/a')}/exec"
        )
    lines.append(f"saved to {RESULTS}")
    print("\n" + "\n".join(lines))
    register_summary(request.config, f"the walk of one shoal_exec ({BACKEND})", lines)
    for row in rows.values():
        assert row["kernel"]["calls"] > 0 and row["facade"]["calls"] > 0, row


class _maybe_old:
    """``agents.old_tree`` for ``ref``, or None when no ref is given."""

    def __init__(self, ref: str, tmp: Path) -> None:
        self._cm = agents.old_tree(ref, tmp / "old") if ref else None

    def __enter__(self) -> dict[str, str] | None:
        return self._cm.__enter__() if self._cm else None

    def __exit__(self, *exc: object) -> None:
        if self._cm:
            self._cm.__exit__(*exc)
