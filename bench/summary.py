"""Small helpers shared by the benches: percentiles and an end-of-run summary block."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

BASELINES = Path(__file__).resolve().parent / "baselines.json"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Summary:
    def __init__(self, title: str, lines: list[str]) -> None:
        self.title = title
        self.lines = lines

    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.write_sep("-", self.title)
        for line in self.lines:
            terminalreporter.write_line(line)


def register_summary(config, title: str, lines: list[str]) -> None:
    """Print ``lines`` under ``title`` in pytest's terminal summary (after the benchmark
    table)."""
    config.pluginmanager.register(_Summary(title, lines))


def load_baseline(name: str, quick: bool) -> dict | None:
    """The recorded figures of bench ``name`` (full or quick mode) from baselines.json:
    numbers measured before a change, kept so later runs print their ratio to them."""
    try:
        data = json.loads(BASELINES.read_text())
    except FileNotFoundError:
        return None
    return data.get(name, {}).get("quick" if quick else "full")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` itself (all its threads, not its children), in
    seconds: unlike latency, barely moved by other load on a shared machine."""
    from tests.support.procfs import stat_fields

    fields = stat_fields(pid)
    if fields is None:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_idle() -> tuple[int, int]:
    """(idle, all) CPU time of the whole machine so far, in clock ticks (``/proc/stat``):
    the share of two readings' difference that was idle says whether a row kept the
    CPUs busy or left them waiting on something."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[3] + values[4], sum(values)  # idle + iowait


def idle_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    return round((after[0] - before[0]) / max(1, after[1] - before[1]), 3)


def machine_cpu_ms_per_call(before: tuple[int, int], after: tuple[int, int], calls: int) -> float:
    """The whole machine's busy CPU per call between two ``machine_idle`` readings: what
    a call costs everything that ran for it (server, facades, commands, clients)."""
    busy = (after[1] - before[1]) - (after[0] - before[0])
    return round(busy / os.sysconf("SC_CLK_TCK") / max(1, calls) * 1e3, 3)


def thread_sched_s(pid: int, comm: str) -> tuple[float, float] | None:
    """(running, runnable but waiting) seconds of ``pid``'s thread named ``comm``
    (``/proc/PID/task/TID/schedstat``); None when it has no such thread (a kernel from
    before its owner loop named its thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != comm:
                continue
            run_ns, wait_ns = (task / "schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    return None


def run_queue_s(pid: int) -> float:
    """Seconds the live threads of ``pid`` have spent runnable but not running
    (``/proc/PID/task/*/schedstat``): a server every caller waits on must not queue."""
    waited = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            waited += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return waited / 1e9
