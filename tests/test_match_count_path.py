"""``match`` totals past a full reply: the count-only path on a live kernel.

Once a reply holds ``max`` matches, the rest of the output is only counted: a literal
by the framing core's ``count_lines_with`` (memmem), a newline-safe regex by one
``findall`` per block (skipping windows of lines without its required literal),
anything else line by line. Each path must give the exact total
an independent oracle gives, over several read blocks (the blocks are read into one
reused buffer), with lines straddling the block edges, a line over MATCH_LINE_MAX, and
a last line without a newline; and the reply's one match must be the first one.
"""

from __future__ import annotations

import random
import shlex

import pytest
import regex

from shoal_mcp.kernel.config.limits import MATCH_BLOCK, MATCH_LINE_MAX
from tests.support.kernel import close_client


@pytest.fixture(scope="module")
def mc(kernel):
    c = kernel.client("match-count")
    yield c
    close_client(c)


@pytest.fixture(scope="module")
def big(mc, tmp_path_factory):
    """About 2.5 read blocks of log lines of random lengths, stored through ``cat``."""
    rnd = random.Random(1717)
    words = [b"ERROR", b"error", b"Error", b"WARN", b"INFO", b"timeout", b"ok"]
    parts, size = [], 0
    while size < 2 * MATCH_BLOCK + MATCH_BLOCK // 2:
        n = rnd.choice([0, 3, 20, 60, 200, 5000])
        body = b" ".join(rnd.choice(words) for _ in range(max(1, n // 6)))[:n]
        if len(parts) % 3000 == 1500:  # rare lines: most prefilter windows hold none
            body += b" rare-%d " % rnd.randrange(10)
        parts.append(body)
        size += len(body) + 1
        if len(parts) == 4000:  # one line longer than MATCH_LINE_MAX, its hit in the head
            parts.append(b"x" * 100 + b" ERROR " + b"y" * (MATCH_LINE_MAX + 10))
            size += len(parts[-1]) + 1
    data = b"\n".join(parts) + b"\nlast line ERROR without newline"
    path = tmp_path_factory.mktemp("count") / "log"
    path.write_bytes(data)
    ref = mc.call("exec", {"src": f"cat {shlex.quote(str(path))}"}, timeout=120)["ref"]
    return data, ref


def oracle(data: bytes, pattern: str, ignore_case: bool, invert: bool) -> list[int]:
    rx = regex.compile(pattern.encode(), regex.IGNORECASE if ignore_case else 0)
    lines = data.split(b"\n")
    return [i + 1 for i, ln in enumerate(lines) if bool(rx.search(ln[:MATCH_LINE_MAX])) != invert]


@pytest.mark.parametrize(
    "pattern, ignore_case",
    [
        ("ERROR", False),  # literal: count_lines_with
        ("ERROR timeout", False),  # literal with a space
        ("error", True),  # literal, any case: the regex counter
        (r"ERROR\b \w+", False),  # newline-safe regex: the regex counter
        (r"ERROR[ ]+timeout", False),  # a plain class: the regex counter too
        (r"rare-\d ", False),  # its literal "rare-" is rare: windows are skipped
        (r"ERROR[^x]timeout", False),  # a negated class may match a newline: line by line
    ],
)
@pytest.mark.parametrize("invert", [False, True])
def test_totals_past_the_reply_match_the_oracle(mc, big, pattern, ignore_case, invert):
    data, ref = big
    want = oracle(data, pattern, ignore_case, invert)
    assert len(want) > 2  # the reply fills and the count-only path runs
    spec = {"regex": pattern, "max": 1, "ignore_case": ignore_case, "invert": invert}
    reply = mc.call("value.get", {"ref": ref, "match": spec}, timeout=120)
    assert reply["total"] == len(want)
    assert [m["line"] for m in reply["matches"]] == want[:1]
    assert reply["truncated"] is True
    assert reply["cut_lines"] == 1
    # From a later line on: the count still runs to the end, numbers stay exact.
    later = want[len(want) // 2]
    spec2 = {**spec, "from_line": later, "max": 3}
    reply2 = mc.call("value.get", {"ref": ref, "match": spec2}, timeout=120)
    assert [m["line"] for m in reply2["matches"]] == want[len(want) // 2 :][:3]
    assert reply2["total"] == len(want)


@pytest.mark.parametrize(
    "pattern, oracle_pattern",
    [(r"\AERROR", "^ERROR"), (r"\GERROR", "^ERROR"), (r"ERROR\Z", "ERROR$")],
)
@pytest.mark.parametrize("max_", [1, 1000])
def test_string_anchors_anchor_each_line(mc, big, pattern, oracle_pattern, max_):
    """A line is searched as a string of its own, so \\A, \\G and \\Z anchor at each
    line, on the block-wide candidate search and on the per-block count alike."""
    data, ref = big
    want = oracle(data, oracle_pattern, False, False)
    assert len(want) > 2
    reply = mc.call(
        "value.get", {"ref": ref, "match": {"regex": pattern, "max": max_}}, timeout=120
    )
    assert reply["total"] == len(want)
    got = [m["line"] for m in reply["matches"]]
    assert got and got == want[: len(got)]  # (max 1000 stops at the 64 KiB reply bound)
