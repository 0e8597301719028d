"""Many agents at once, each with its own MCP stdio server, side by side (issue 30).

The shape an agent fleet has: N agents, each a client of its own server process, each
making M sequential calls.  The same load runs against each contender in turn, in one
run, on the same machine:

* ``shoal``: N ``shoal-mcp`` facades sharing one kernel (the one-owner question);
* ``shoal@REF``: the same against the kernel and facade of another commit, built into a
  temporary directory (``old_tree``), to A/B a kernel change in one run;
* ``fastmcp``: N FastMCP exec servers (bench/fastmcp_exec_server.py), one process each;
* ``bash``: N threads each running ``bash -c`` M times, the ceiling.

Figures: calls/s over the whole run (first call sent to last reply), per-call latency
percentiles, and the server-side CPU per call where there is a server.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .mcp_pipe import PipeClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def figures(latencies: list[float], wall_s: float) -> dict:
    values = sorted(latencies)
    return {
        "calls": len(values),
        "wall_s": round(wall_s, 3),
        "calls_per_s": round(len(values) / wall_s, 1),
        "p50_ms": round(percentile(values, 0.50) * 1e3, 2),
        "p99_ms": round(percentile(values, 0.99) * 1e3, 2),
    }


def drive(workers: list[Callable[[], None]], calls: int) -> dict:
    """Each worker called ``calls`` times in its own thread, all released at once."""
    latencies: list[list[float]] = [[] for _ in workers]
    errors: list[BaseException] = []
    start = threading.Barrier(len(workers) + 1)

    def run(i: int) -> None:
        start.wait()
        try:
            for _ in range(calls):
                t0 = time.perf_counter()
                workers[i]()
                latencies[i].append(time.perf_counter() - t0)
        except BaseException as exc:  # reported by the caller, never swallowed
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return figures([x for per in latencies for x in per], wall)


def mcp_row(
    clients: list[PipeClient], tool: str, arguments: dict, calls: int, check: Callable[[dict], None]
) -> dict:
    def one(client: PipeClient) -> Callable[[], None]:
        return lambda: check(client.call_tool(tool, arguments))

    return drive([one(c) for c in clients], calls)


def bash_row(agents: int, calls: int) -> dict:
    def one() -> None:
        subprocess.run(["bash", "-c", "true"], check=True, stdin=subprocess.DEVNULL)

    return drive([one] * agents, calls)


@contextlib.contextmanager
def started(argvs: list[list[str]], env: dict[str, str]) -> Iterator[list[PipeClient]]:
    clients: list[PipeClient] = []
    try:
        for argv in argvs:
            clients.append(PipeClient(argv, env))
        yield clients
    finally:
        for c in clients:
            c.close()


def fastmcp_argv() -> list[str]:
    return [sys.executable, str(HERE / "fastmcp_exec_server.py")]


def facade_argv() -> list[str]:
    return [sys.executable, "-m", "shoal_mcp.facade"]


@contextlib.contextmanager
def old_tree(ref: str, into: Path) -> Iterator[dict[str, str]]:
    """The shoal of git ``ref`` (this repository's), installed into ``into`` without
    its dependencies (this venv has them; its build dependencies come from the package
    index, as for any install) and with its compiled core unless ``SHOAL_PURE_PYTHON``
    says not to: the environment whose ``python -m shoal_mcp.kernel`` / ``.facade`` run
    it."""
    tree = into / "tree"
    site = into / "site"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    try:
        built = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--target", str(site), str(tree)],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if built.returncode != 0:
            raise RuntimeError(f"building shoal at {ref} failed:\n{built.stderr[-4000:]}")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
        found = subprocess.run(
            [sys.executable, "-c", "import shoal_mcp; print(shoal_mcp.__file__)"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if not found.startswith(str(site)):  # this tree's editable install won instead
            raise RuntimeError(f"shoal at {ref} is not the one imported: {found}")
        yield env
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )
