"""What the OS sandbox costs an exec: ``exec "true"`` sandboxed vs unsandboxed, one kernel.

Two token principals with the same grants, one with ``sandbox = false``: the difference
is the sandbox supervisor (``sandbox_run.py``: spec read, no_new_privs, network
namespace, Landlock ruleset, seccomp filter) in front of bash.  Both are driven through
the kernel socket with one attached client each, in the same run; the ratio of medians
(sandboxed / unsandboxed; issue 13's target: <= 1.15) is printed and written to
bench/.results/sandbox.json.  ``SHOAL_BENCH_QUICK=1`` runs a handful of rounds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import sandbox
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess
from tests.support.tmp import short_tmp

from .summary import register_summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "sandbox.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
ROUNDS = 5 if QUICK else 200
WARMUP = 1 if QUICK else 10
GROUP = "exec-true-sandbox"
TARGET_RATIO = 1.15

POLICY = """
[principal."bench:boxed"]
proc_spawn = ["true"]
sandbox = true
[principal."bench:boxed".fs]
read = ["{work}/**"]
write = ["{work}/**"]

[principal."bench:open"]
proc_spawn = ["true"]
sandbox = false
[principal."bench:open".fs]
read = ["{work}/**"]
write = ["{work}/**"]
"""

MEDIANS: dict[str, float] = {}


@pytest.fixture(scope="module")
def clients():
    if sandbox.probe().enforced() is False:
        pytest.skip(f"no enforcing sandbox here: {sandbox.probe().reason}")
    with short_tmp("shoal-bench-sb-") as tmp:
        work = tmp / "work"
        work.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(POLICY.format(work=work))
        kernel = KernelProcess(tmp, "--policy", str(policy), "--sandbox", "required")
        store = TokenStore(kernel.state / "tokens.json")
        tokens = {name: store.create(f"bench:{name}")[1] for name in ("boxed", "open")}
        kernel.start()
        made = {name: kernel.client(f"bench-{name}", token=tok) for name, tok in tokens.items()}
        try:
            yield made
        finally:
            for c in made.values():
                c.close()
            kernel.stop()


@pytest.fixture(scope="module", autouse=True)
def ratio_report(request):
    yield
    if not {"boxed", "open"} <= MEDIANS.keys():
        return
    ratio = MEDIANS["boxed"] / MEDIANS["open"]
    results = {
        "what": 'median seconds per exec "true" round trip over the kernel socket',
        "quick": QUICK,
        "rounds": ROUNDS,
        "enforced": sandbox.probe().enforced(),
        "medians_s": MEDIANS,
        "sandboxed_over_unsandboxed": ratio,
        "target": TARGET_RATIO,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"{n:>6}: {MEDIANS[n] * 1e3:8.3f} ms median" for n in ("open", "boxed")]
    lines.append(f"sandboxed/unsandboxed: {ratio:.2f} (target <= {TARGET_RATIO})")
    lines.append(f"saved to {RESULTS}")
    register_summary(request.config, "sandbox exec cost (median)", lines)


def _bench(benchmark, clients, name: str) -> None:
    c = clients[name]
    assert c.call("exec", {"src": "true", "position": "value"}, timeout=60)["value"]["ok"]
    benchmark.group = GROUP
    benchmark.pedantic(
        lambda: c.call("exec", {"src": "true"}, timeout=60),
        rounds=ROUNDS,
        iterations=1,
        warmup_rounds=WARMUP,
    )
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        MEDIANS[name] = stats.stats.median


def test_bench_exec_true_unsandboxed(benchmark, clients):
    _bench(benchmark, clients, "open")


def test_bench_exec_true_sandboxed(benchmark, clients):
    _bench(benchmark, clients, "boxed")
