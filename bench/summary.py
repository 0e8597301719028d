"""Small helpers shared by the benches: percentiles and an end-of-run summary block."""

from __future__ import annotations

import json
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
