"""Framing bench ratios from pytest-benchmark results.

Used two ways:
* bench/conftest.py calls it at the end of every bench session (prints + saves);
* ``python bench/report.py RESULTS.json`` recomputes it from a ``--benchmark-json`` file.

All ratios use median times. Throughput ratios ("x_vs_y") are time(y) / time(x), so
> 1 means x is faster. Output: bench/.results/framing.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / ".results" / "framing.json"

# name prefix of the bench test -> short key
_TESTS = {
    "test_reader_small_frames": "reader_200B",
    "test_reader_big_frames": "reader_1MiB",
    "test_bound_text_64mib": "bound_text",
    "test_b64_slice_end_of_blob": "b64_slice",
}

# (key, target description, predicate)
_TARGETS = (
    ("reader_200B.compiled_vs_readline", ">= 1.0", lambda v: v >= 1.0),
    ("reader_1MiB.compiled_vs_readline", ">= 0.9", lambda v: v >= 0.9),
    ("bound_text.compiled_time_over_bytes_count", "<= 2.0", lambda v: v <= 2.0),
    ("bound_text.compiled_vs_fallback", ">= 10", lambda v: v >= 10),
    ("b64_slice.compiled_1GiB_time_over_1MiB", "~1 (size independent, <= 2)", lambda v: v <= 2),
)


def _fields(bench):
    """(test name, params dict, median seconds) from a Metadata object or a JSON dict."""
    if isinstance(bench, dict):
        return bench["name"], bench.get("params") or {}, bench["stats"]["median"]
    return bench.name, bench.params or {}, bench.stats.median


def framing_ratios(benchmarks) -> dict:
    medians: dict[str, dict[str, float]] = {}
    for bench in benchmarks:
        if not isinstance(bench, dict) and not bench.stats.data:
            continue  # a benchmark that failed before timing anything has no median
        name, params, median = _fields(bench)
        key = _TESTS.get(name.split("[", 1)[0])
        if key is None:
            continue
        label = params.get("impl", "?")
        if "blob" in params:
            label = f"{label}_{params['blob']}"
        medians.setdefault(key, {})[label] = median

    ratios: dict[str, float] = {}

    def put(name, num, den):
        if num and den:
            ratios[name] = round(num / den, 3)

    for key in ("reader_200B", "reader_1MiB"):
        m = medians.get(key, {})
        for impl in ("compiled", "compiled-batches", "fallback"):
            short = impl.replace("-", "_")
            put(f"{key}.{short}_vs_readline", m.get("readline"), m.get(impl))
            put(f"{key}.{short}_vs_readline_256KiB", m.get("readline-256KiB-buffer"), m.get(impl))
    m = medians.get("bound_text", {})
    put("bound_text.compiled_time_over_bytes_count", m.get("compiled"), m.get("bytes.count"))
    put("bound_text.fallback_time_over_bytes_count", m.get("fallback"), m.get("bytes.count"))
    put("bound_text.compiled_vs_fallback", m.get("fallback"), m.get("compiled"))
    m = medians.get("b64_slice", {})
    put("b64_slice.compiled_1GiB_time_over_1MiB", m.get("compiled_1GiB"), m.get("compiled_1MiB"))
    put("b64_slice.fallback_1GiB_time_over_1MiB", m.get("fallback_1GiB"), m.get("fallback_1MiB"))

    targets = {
        name: {"value": ratios[name], "target": text, "met": bool(ok(ratios[name]))}
        for name, text, ok in _TARGETS
        if name in ratios
    }
    return {
        "quick": os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0"),
        "medians_s": medians,
        "ratios": ratios,
        "targets": targets,
    }


def format_lines(results: dict) -> list[str]:
    lines = [f"{name:48s} {value:10.3f}" for name, value in sorted(results["ratios"].items())]
    for name, t in results["targets"].items():
        verdict = "met" if t["met"] else "NOT MET"
        lines.append(f"target {name}: {t['value']} (want {t['target']}) -> {verdict}")
    return lines


def save(results: dict, path: Path = RESULTS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python bench/report.py BENCHMARK_JSON", file=sys.stderr)
        return 2
    data = json.loads(Path(argv[1]).read_text())
    results = framing_ratios(data["benchmarks"])
    for line in format_lines(results):
        print(line)
    print(f"saved to {save(results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
