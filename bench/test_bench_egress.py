"""The egress proxy's cost (issue 27), measured side by side in one run.

A local HTTP server (``http.server``, threaded) serves a SIZE file (100 MiB; 20 MiB with
``SHOAL_BENCH_QUICK=1``) and a small one.  Round by round, ``curl`` downloads them
directly on the host's loopback, then the default agent's ``curl`` downloads them
inside its sandbox through the proxy (bridge in its network namespace → the kernel's
proxy → the server).  ``curl -w`` reports its own figures, so an exec's overhead is not
counted: throughput (``speed_download``) of the big file, and for the small one the
time to the first byte (``time_starttransfer``), whose median difference is the connect
latency the proxy adds.  Targets: throughput ≥ 0.8× direct, ≤ 2 ms added at p50.
Printed and written to bench/.results/egress.json; only sizes are asserted, never a time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from tests.support.egress import egress_world

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "egress.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
SIZE = (20 if QUICK else 100) << 20
ROUNDS = 2 if QUICK else 3
PINGS = 20 if QUICK else 100
FORMAT = r"%{size_download} %{speed_download} %{time_starttransfer}\n"

pytestmark = pytest.mark.landlock


def _curl_lines(url: str, times: int) -> str:
    return f"for i in $(seq {times}); do curl -sS -o /dev/null -w '{FORMAT}' {url} || exit 1; done"


def _parse(text: str) -> list[tuple[int, float, float]]:
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].isdigit():
            rows.append((int(parts[0]), float(parts[1]), float(parts[2])))
    return rows


def test_bench_egress_proxy_vs_direct() -> None:
    with egress_world("shbeg") as world:
        (world.www / "big.bin").write_bytes(os.urandom(1 << 20) * (SIZE >> 20))
        direct = {"big": [], "small": []}
        proxied = {"big": [], "small": []}
        for _ in range(ROUNDS):
            for name, url_host, into in (
                ("direct", "127.0.0.1", direct),
                ("proxied", "allowed.test", proxied),
            ):
                big = f"http://{url_host}:{world.port}/big.bin"
                small = f"http://{url_host}:{world.port}/hello.txt"
                script = _curl_lines(big, 1) + "; " + _curl_lines(small, PINGS)
                if name == "direct":
                    out = subprocess.run(
                        ["bash", "-c", script], capture_output=True, text=True, check=True,
                        env={**os.environ, "no_proxy": "*"},
                    ).stdout  # fmt: skip
                else:
                    # Figures to a file in its temp dir (read here: the host sees it).
                    script = f'{{ {script}; }} > "$TMPDIR/egress-bench.txt"; echo "$TMPDIR"'
                    result = world.exec(script, timeout=600)
                    assert result["value"]["ok"] is True, result
                    tmpdir = result["_text"].split("\n", 1)[0].strip()
                    out = (Path(tmpdir) / "egress-bench.txt").read_text()
                rows = _parse(out)
                assert len(rows) == 1 + PINGS, out[-500:]
                assert rows[0][0] == SIZE  # every byte arrived
                into["big"].append(rows[0][1])
                into["small"] += [r[2] for r in rows[1:]]
    throughput = statistics.median(proxied["big"]) / statistics.median(direct["big"])
    added_ms = (statistics.median(proxied["small"]) - statistics.median(direct["small"])) * 1000
    results = {
        "quick": QUICK,
        "size_bytes": SIZE,
        "rounds": ROUNDS,
        "direct_mib_s": statistics.median(direct["big"]) / (1 << 20),
        "proxied_mib_s": statistics.median(proxied["big"]) / (1 << 20),
        "throughput_ratio": throughput,
        "direct_ttfb_p50_ms": statistics.median(direct["small"]) * 1000,
        "proxied_ttfb_p50_ms": statistics.median(proxied["small"]) * 1000,
        "connect_latency_added_p50_ms": added_ms,
        "targets": {"throughput_ratio": ">= 0.8", "connect_latency_added_p50_ms": "<= 2"},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
