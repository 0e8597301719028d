"""Bench-only hooks: print the framing ratios and save them (see bench/report.py)."""

from __future__ import annotations

from . import report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    results = report.framing_ratios(session.benchmarks)
    if not results["ratios"]:
        return
    path = report.save(results)
    terminalreporter.write_sep("-", "framing ratios (median times)")
    for line in report.format_lines(results):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"saved to {path}")
