"""Context economy: an agent that follows only what the replies say, shoal vs plain exec.

Each question is asked of a fresh output, as an agent would: one exec, then only the
calls the replies (and the tool descriptions) point at, never a re-run of the producer.
Measured per question: calls after the exec, bytes of tool-result text read after the
exec, and the exec reply's own text. The same agent against the plain FastMCP exec
server (bench/fastmcp_exec_server.py) can only read the whole stdout it returns.

Questions (issue 17): the last line of a 2M-line output; the one FAILED line at a
random position of a 50k-line log (several seeds); a field at a random index of a 5 MB
JSON (one line, and pretty); the exact count of ERROR lines in a 1M-line log.
``SHOAL_BENCH_QUICK=1`` uses outputs a tenth of the size. Results:
bench/.results/context.json. Targets: <= 2 calls and <= 4 KiB read after the exec.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.test_bench_facade import PipeClient
from tests.support.facade import facade_env
from tests.support.kernel import running_kernel

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "context.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
SCALE = 10 if QUICK else 1
SEEDS = (1, 2, 3)
HINT = re.compile(r"shoal_get (?=\{)")


def text_of(result: dict) -> str:
    return "".join(c.get("text", "") for c in result["content"] if c.get("type") == "text")


class Agent:
    """Counts what it reads; ``ask`` is exec, ``get`` a follow-up call."""

    def __init__(self, client: PipeClient, exec_tool: str, src_arg: str) -> None:
        self.client = client
        self.exec_tool = exec_tool
        self.src_arg = src_arg
        self.calls = 0
        self.read = 0
        self.exec_bytes = 0

    def exec(self, src: str) -> tuple[str, dict]:
        result = self.client.call_tool(self.exec_tool, {self.src_arg: src})
        text = text_of(result)
        self.exec_bytes = len(text.encode())
        return text, result.get("structuredContent") or {}

    def get(self, args: dict) -> tuple[str, dict]:
        result = self.client.call_tool("shoal_get", args)
        text = text_of(result)
        self.calls += 1
        self.read += len(text.encode())
        return text, result.get("structuredContent") or {}


def body_lines(text: str) -> list[str]:
    """The reply text without shoal's trailing ``[out:N · uri]`` line."""
    lines = text.rstrip("\n").split("\n")
    if lines and lines[-1].startswith("[out:"):
        lines = lines[:-1]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# -- producers ---------------------------------------------------------------------------


def seq_src(n: int) -> str:
    return f"seq 1 {n}"


def log_src(n: int, seed: int, failed_at: int) -> str:
    return (
        "python3 -c 'import random\n"
        f"r = random.Random({seed})\n"
        f"for i in range({n}):\n"
        f'    print("FAILED test_%d: assertion %d" % (i, r.randrange(10**6)) if i == {failed_at} '
        'else "ok test_%d %d" % (i, r.randrange(10**6)))\''
    )


def error_log_src(n: int) -> str:
    return (
        "python3 -c 'import random\nr = random.Random(7)\n"
        f"for i in range({n}):\n"
        '    print(("ERROR" if r.random() < 0.07 else "INFO") + " request %d" % i)\''
    )


def json_src(n: int, indent: bool) -> str:
    dump = "json.dumps(doc, indent=2)" if indent else "json.dumps(doc)"
    return (
        "python3 -c 'import json\n"
        f'doc = {{"items": [{{"id": i, "name": "item-%d" % i, "tags": ["a", "b"]}} for i in range({n})], "count": {n}}}\n'
        f"print({dump})'"
    )


def expected_log_line(n: int, seed: int, failed_at: int) -> str:
    r = random.Random(seed)
    for i in range(n):
        v = r.randrange(10**6)
        if i == failed_at:
            return f"FAILED test_{i}: assertion {v}"
    raise AssertionError


def expected_errors(n: int) -> int:
    r = random.Random(7)
    return sum(1 for _ in range(n) if r.random() < 0.07)


# -- the agent's strategies ---------------------------------------------------------------


def last_line(agent: Agent, src: str) -> str:
    text, _ = agent.exec(src)
    return body_lines(text)[-1]


def find_failed(agent: Agent, src: str) -> str:
    text, sc = agent.exec(src)
    hits = [ln for ln in body_lines(text) if "FAILED" in ln]
    if hits:
        return hits[0]
    text, _ = agent.get({"ref": sc["ref"], "match": "FAILED"})
    line = next(ln for ln in body_lines(text)[1:] if ":" in ln)
    return line.split(":", 1)[1]


def json_field(agent: Agent, src: str, k: int) -> str:
    text, sc = agent.exec(src)
    if "ref" not in sc:  # a plain exec server: the whole document is in the reply
        return json.loads(text)["items"][k]["name"]
    path = re.search(r"(\.out\.json\.items)\[0\]\.name", text).group(1)  # from the shape
    text, _ = agent.get({"ref": sc["ref"], "path": f"{path}[{k}].name"})
    return body_lines(text)[0]


def count_errors(agent: Agent, src: str) -> int:
    text, sc = agent.exec(src)
    if "ref" not in sc:
        return sum(1 for ln in text.split("\n") if "ERROR" in ln)
    text, _ = agent.get({"ref": sc["ref"], "match": {"regex": "ERROR", "max": 1}})
    return int(text.split(" ", 1)[0])


def questions() -> list[tuple[str, Callable[[Agent], object], object]]:
    qs: list[tuple[str, Callable[[Agent], object], object]] = []
    n = 2_000_000 // SCALE
    qs.append(("last line of seq", lambda a: last_line(a, seq_src(n)), str(n)))
    log_n = 50_000 // SCALE
    for seed in SEEDS:
        at = random.Random(seed).randrange(log_n)
        src = log_src(log_n, seed, at)
        qs.append(
            (
                f"FAILED line (seed {seed})",
                lambda a, s=src: find_failed(a, s),
                expected_log_line(log_n, seed, at),
            )
        )
    for pretty, items in ((False, 90_000 // SCALE), (True, 45_000 // SCALE)):  # ~5 MB each
        k = random.Random(5).randrange(items)
        src = json_src(items, pretty)
        name = f"JSON items[K].name ({'pretty' if pretty else 'one line'})"
        qs.append((name, lambda a, s=src, k=k: json_field(a, s, k), f"item-{k}"))
    err_n = 1_000_000 // SCALE
    qs.append(
        (
            "count of ERROR lines",
            lambda a: count_errors(a, error_log_src(err_n)),
            expected_errors(err_n),
        )
    )
    return qs


def tool_arg(client: PipeClient, tool: str) -> str:
    listed = client.request("tools/list", {})["result"]["tools"]
    props = next(t for t in listed if t["name"] == tool)["inputSchema"]["properties"]
    return "command" if "command" in props else "src"


@pytest.fixture(scope="module")
def servers():
    with running_kernel(prefix="shoal-bench-ctx-") as kernel:
        shoal = PipeClient([sys.executable, "-m", "shoal_mcp.facade"], facade_env(kernel))
        plain = PipeClient([sys.executable, str(HERE / "fastmcp_exec_server.py")], dict(os.environ))
        try:
            yield {"shoal": shoal, "fastmcp": plain}
        finally:
            shoal.close()
            plain.close()


def test_bench_context_economy(servers, request):
    rows = []
    for name, ask, expected in questions():
        row: dict = {"question": name}
        for server, client in servers.items():
            tool = "shoal_exec" if server == "shoal" else "exec"
            agent = Agent(client, tool, tool_arg(client, tool))
            answer = ask(agent)
            row[server] = {
                "correct": str(answer).strip() == str(expected),
                "calls_after_exec": agent.calls,
                "bytes_after_exec": agent.read,
                "exec_reply_bytes": agent.exec_bytes,
            }
        rows.append(row)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"quick": QUICK, "rows": rows}, indent=2) + "\n")
    lines = [f"{'question':34} {'shoal calls/bytes (exec reply)':34} fastmcp exec reply"]
    for r in rows:
        s, f = r["shoal"], r["fastmcp"]
        lines.append(
            f"{r['question']:34} {s['calls_after_exec']} / {s['bytes_after_exec']:>5} B "
            f"({s['exec_reply_bytes']:>5} B){'' if s['correct'] else ' WRONG':7}"
            f"         {f['exec_reply_bytes']:>9} B{'' if f['correct'] else ' WRONG'}"
        )
    print("\n".join(lines))
    for r in rows:  # evidence, not timing: every answer right, within the budget
        assert r["shoal"]["correct"], r
        assert r["shoal"]["calls_after_exec"] <= 2 and r["shoal"]["bytes_after_exec"] <= 4096, r
