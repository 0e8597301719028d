"""``match`` over real stored outputs (docs/protocol.md, Search): exact totals, line
numbers, context, flags, paging by ``next`` that visits every match once, long lines,
read-block boundaries, URIs, and the errors for bad patterns and a runaway regex."""

from __future__ import annotations

import random
import shlex

import pytest
import regex

from shoal_mcp.kernel.config.limits import (
    MATCH_BLOCK,
    MATCH_DEADLINE_S,
    MATCH_LINE_MAX,
    MATCH_TEXT_MAX,
)
from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.limits import MiB
from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import close_client
from tests.support.polling import wait_until
from tests.support.results import call_err, structured


@pytest.fixture(scope="module")
def mc(kernel):
    c = kernel.client("match")
    yield c
    close_client(c)


def run(c, src: str) -> str:
    return c.call("exec", {"src": src}, timeout=60)["ref"]


def cat_file(c, path) -> str:
    return run(c, f"cat {shlex.quote(str(path))}")


def get(c, ref: str, **params) -> dict:
    return c.call("value.get", {"ref": ref, **params}, timeout=60)


def reference(data: bytes, pattern: str, ignore_case=False, invert=False) -> list[int]:
    """1-based numbers of the lines that match, computed line by line (the oracle)."""
    flags = regex.IGNORECASE if ignore_case else 0
    rx = regex.compile(pattern.encode(), flags | regex.MULTILINE)
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return [i + 1 for i, ln in enumerate(lines) if bool(rx.search(ln[:MATCH_LINE_MAX])) != invert]


def all_matches(c, ref: str, match, **params) -> tuple[list[dict], list[dict]]:
    """Follow ``next`` from the first reply; (every match seen, every reply)."""
    replies = [get(c, ref, match=match, **params)]
    while replies[-1]["truncated"]:
        nxt = replies[-1]["next"]
        assert nxt not in [r.get("next") for r in replies[:-1]], "a next URI repeated"
        replies.append(get(c, nxt))
    return [m for r in replies for m in r["matches"]], replies


def test_literal_match_lines_total_and_paging(mc):
    ref = run(mc, "seq 1 100000 | sed 's/^\\(.*77\\)$/FAILED \\1/'")
    first = get(mc, ref, match="FAILED")
    expected = [n for n in range(1, 100001) if str(n).endswith("77")]
    assert first["total"] == len(expected) == 1000
    assert first["truncated"] and len(first["matches"]) == 50
    assert first["matches"][0] == {"line": 77, "text": "FAILED 77"}
    assert first["path"] == ".out"  # an outcome searches its stdout
    assert "shoal_get" in first["render"] and first["next"] in first["render"]
    seen, replies = all_matches(mc, ref, "FAILED")
    assert [m["line"] for m in seen] == expected  # every match once, in order
    assert all(r["total"] == 1000 for r in replies)


def test_regex_is_per_line_and_flags(mc, tmp_path):
    rnd = random.Random(7)
    words = ["alpha", "Beta", "ERROR x", "error y", "", "a b", "tab\there", "ÉRROR"]
    data = "\n".join(rnd.choice(words) for _ in range(3000)).encode() + b"\nlast"
    (tmp_path / "f").write_bytes(data)
    ref = cat_file(mc, tmp_path / "f")
    cases = [
        ("error", {}),
        ("error", {"ignore_case": True}),
        ("^$", {}),
        ("a\\sb", {}),
        ("^[A-Z]", {"invert": True}),
        ("E.ROR", {"ignore_case": True, "invert": True}),
        ("st$", {}),
    ]
    for pattern, flags in cases:
        want = reference(data, pattern, **flags)
        seen, replies = all_matches(mc, ref, {"regex": pattern, "max": 400, **flags})
        assert replies[0]["total"] == len(want), (pattern, flags)
        assert [m["line"] for m in seen] == want, (pattern, flags)
    # a regex never matches across a newline: "a\nb" is two lines
    assert get(mc, ref, match="alpha\\nBeta")["total"] == 0


def test_context_lines(mc):
    ref = run(mc, "seq 1 30")
    reply = get(mc, ref, match={"regex": "^(1|15|30)$", "context": 2})
    by_line = {m["line"]: m for m in reply["matches"]}
    assert by_line[1].get("before") is None and by_line[1]["after"] == ["2", "3"]
    assert by_line[15]["before"] == ["13", "14"] and by_line[15]["after"] == ["16", "17"]
    assert by_line[30]["before"] == ["28", "29"] and "after" not in by_line[30]
    assert "14-14" in reply["render"] and "15:15" in reply["render"]


def test_block_boundaries_match_the_oracle(mc, tmp_path):
    """Lines of random lengths straddle the read blocks; totals and numbers stay exact."""
    rnd = random.Random(3)
    parts, size = [], 0
    while size < 2 * MATCH_BLOCK + 12345:
        n = rnd.choice([0, 1, 5, 80, 3000, 70000])
        line = ("x" * n if rnd.random() < 0.9 else "y" * max(0, n - 4) + "HIT!") + "\n"
        parts.append(line)
        size += len(line)
    data = "".join(parts).encode()
    (tmp_path / "b").write_bytes(data)
    ref = cat_file(mc, tmp_path / "b")
    want = reference(data, "HIT!")
    seen, replies = all_matches(mc, ref, {"regex": "HIT!", "max": 1000})
    assert replies[0]["total"] == len(want) and [m["line"] for m in seen] == want
    assert replies[0]["lines"] == data.count(b"\n")


def test_long_lines_show_the_match_and_are_capped(mc, tmp_path):
    head = b"a" * 5000 + b"NEEDLE" + b"b" * (MATCH_LINE_MAX + MiB)
    data = head + b"LATE\nshort NEEDLE\n"
    (tmp_path / "l").write_bytes(data)
    ref = cat_file(mc, tmp_path / "l")
    reply = get(mc, ref, match="NEEDLE")
    assert reply["total"] == 2 and reply["cut_lines"] == 1
    first = reply["matches"][0]
    assert first["line"] == 1 and "NEEDLE" in first["text"]
    assert len(first["text"].encode()) <= MATCH_TEXT_MAX and first["col"] > 1
    # past MATCH_LINE_MAX a line is not searched (documented), and the reply says so
    assert get(mc, ref, match="LATE")["total"] == 0


def test_match_over_err_lines_range_and_uri(mc, kernel):
    ref = run(mc, "seq 1 100; seq 1 20 >&2")
    assert get(mc, ref, path=".err", match="^2")["total"] == 2  # 2, 20
    ranged = get(mc, ref, path=".out.lines[49..60]", match="5")
    assert [m["line"] for m in ranged["matches"]] == [50, 51, 52, 53, 54, 55, 56, 57, 58, 59]
    n = ref.split(":")[1]
    via_uri = get(mc, f"shoal://out/{n}?path=.out&match=%5E9&max=3")
    assert via_uri["total"] == 11 and len(via_uri["matches"]) == 3 and via_uri["truncated"]


def test_bad_patterns_and_targets(mc):
    ref = run(mc, "echo hi")
    err = call_err(mc, "value.get", {"ref": ref, "match": "(unclosed"})
    assert err.code == ErrorCode.INVALID_PARAMS and "match.regex" in err.message
    err = call_err(mc, "value.get", {"ref": ref, "match": {"regex": "x", "context": 99}})
    assert err.code == ErrorCode.INVALID_PARAMS
    err = call_err(mc, "value.get", {"ref": ref, "match": {"context": 1}})
    assert err.code == ErrorCode.INVALID_PARAMS
    err = call_err(mc, "value.get", {"ref": ref, "path": ".status", "match": "0"})
    assert err.code == ErrorCode.BAD_SELECTION
    n = ref.split(":")[1]
    err = call_err(mc, "value.get", {"ref": f"shoal://out/{n}?match=x&max=ten"})
    assert err.code == ErrorCode.INVALID_PARAMS and "max" in err.message


def test_runaway_regex_is_stopped_and_kernel_keeps_serving(mc, kernel):
    ref = run(mc, "python3 -c 'print(\"a\" * 3000)'")
    err = call_err(
        mc, "value.get", {"ref": ref, "match": "(a|aa)+$b"}, timeout=MATCH_DEADLINE_S * 10 + 30
    )
    assert err.code == ErrorCode.BAD_SELECTION and "deadline" in err.message
    assert get(mc, ref, match="a")["total"] == 1


def test_match_through_shoal_get_and_resources(kernel):
    mcp = McpPipe(facade_env(kernel, "match-mcp"))
    try:
        mcp.initialize()
        src = "seq 1 50000 | sed 's/^31337$/FAILED here/'"
        ref = structured(mcp.tool("shoal_exec", {"command": src}))["ref"]
        got = mcp.tool("shoal_get", {"ref": ref, "match": "FAILED"})["result"]
        text = got["content"][0]["text"]
        assert "31337:FAILED here" in text and got["structuredContent"]["total"] == 1
        assert len(text.encode()) < 1024
        n = ref.split(":")[1]
        read = mcp.request("resources/read", {"uri": f"shoal://out/{n}?match=FAILED"})
        assert '"line":31337' in read["result"]["contents"][0]["text"].replace(" ", "")
    finally:
        assert mcp.close() == 0


def test_match_over_a_running_tasks_output(mc):
    started = mc.call(
        "exec",
        {"src": "seq 1 1000; echo FAILED live; sleep 30.4242", "background": True},
        timeout=30,
    )
    n = started["task"].split(":")[1]
    try:

        def found() -> dict | None:
            reply = get(mc, f"shoal://task/{n}/out?match=FAILED")
            return reply if reply["total"] else None

        reply = wait_until(found, timeout=30, what="the live output to show FAILED")
        assert reply["matches"] == [{"line": 1001, "text": "FAILED live"}]
        assert get(mc, f"shoal://task/{n}/out?match=%5E99%24")["total"] == 1
    finally:
        mc.call("task.cancel", {"task": started["task"]}, timeout=30)
