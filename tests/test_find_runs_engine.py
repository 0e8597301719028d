"""Find across runs in-process (``kernel/values/find.py``): the time budget's cursor, one
search per distinct blob, unreadable blobs, visibility and the order across sessions,
long lines. A real ``Kernel`` on a temporary state dir (no socket); the live tests are
``test_find_runs.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.access.identity import Principal
from shoal_mcp.kernel.app import Kernel
from shoal_mcp.kernel.config.limits import FIND_BUDGET_S, FIND_LINE_SHOWN, MATCH_BLOCK
from shoal_mcp.kernel.values.find import Finder
from shoal_mcp.kernel.values.find_reply import find_query, find_reply
from shoal_mcp.protocol.errors import RpcError
from tests.test_kernel_services import AGENT, OTHER, Services, store_result

ME = Principal("find-a", AGENT)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    s = Services(tmp_path)
    yield s.kernel
    s.close()


def find(
    kernel: Kernel,
    who: Principal,
    params: dict,
    budget_s: float = FIND_BUDGET_S,
    reads_all: bool = False,
) -> dict:
    params = {"ref": "outputs", **params}
    query = find_query(who, params, reads_all)
    found = Finder(kernel.db, kernel.cas, query).run(budget_s)
    return find_reply(params, query, found, who.session)


def walk(kernel: Kernel, who: Principal, params: dict, budget_s: float) -> list[dict]:
    """Every reply of a search and its continuations (``next_call``)."""
    replies = [find(kernel, who, params, budget_s)]
    while replies[-1]["truncated"]:
        nxt = {k: v for k, v in replies[-1]["next_call"].items() if k != "ref"}
        replies.append(find(kernel, who, nxt, budget_s))
        assert len(replies) < 200, "the cursor does not move on"
    return replies


def test_a_spent_budget_answers_a_cursor_and_the_cursors_visit_every_hit_once(
    kernel: Kernel,
) -> None:
    expected = set()
    for i in range(1, 13):
        lines = [f"run {i} line {k}" + (" HIT" if (i + k) % 3 == 0 else "") for k in range(7)]
        ref = store_result(kernel, ME, ("\n".join(lines) + "\n").encode())
        expected |= {(ref, k + 1) for k in range(7) if (i + k) % 3 == 0}
    # Budget 0: each call searches one output, then stops with a cursor (never an error).
    replies = walk(kernel, ME, {"match": {"regex": "HIT", "max": 2}}, budget_s=0)
    seen = [(h["ref"], h["line"]) for r in replies for h in r["hits"]]
    assert len(seen) == len(set(seen)) and set(seen) == expected
    assert all(r["searched"]["runs"] == 1 for r in replies)
    stopped = [r for r in replies if not r["complete"]]
    assert stopped and all("stopped after the" in r["render"] for r in stopped)
    # With the whole budget one call counts everything exactly.
    whole = find(kernel, ME, {"match": "HIT"})
    assert whole["complete"] and whole["total"] == len(expected)
    assert whole["searched"]["runs"] == 12


def test_a_blob_shared_by_many_outputs_is_searched_once(kernel: Kernel) -> None:
    same = b"alpha\nneedle one\nbeta\nneedle two\n"
    refs = [store_result(kernel, ME, same) for _ in range(10)]
    reply = find(kernel, ME, {"match": {"regex": "needle", "max": 1000}})
    assert reply["searched"] == {"runs": 10, "blobs": 1, "bytes": len(same)}
    assert reply["total"] == 20
    assert [(h["ref"], h["line"]) for h in reply["hits"]] == [
        (ref, line) for ref in reversed(refs) for line in (2, 4)
    ]
    # Fewer hits shown than the blob holds: the next page starts in the same output.
    first = find(kernel, ME, {"match": {"regex": "needle", "max": 3}})
    assert [(h["ref"], h["line"]) for h in first["hits"]] == [
        (refs[-1], 2),
        (refs[-1], 4),
        (refs[-2], 2),
    ]
    rest = find(kernel, ME, {"match": "needle", "cursor": first["cursor"]})
    assert (rest["hits"][0]["ref"], rest["hits"][0]["line"]) == (refs[-2], 4)
    assert rest["total"] == 17


def test_an_unreadable_blob_is_skipped_and_counted(kernel: Kernel) -> None:
    kept = store_result(kernel, ME, b"needle kept\n")
    store_result(kernel, ME, b"needle lost\n")
    lost = kernel.transcript.get(ME.session, 2)[1]["out"]["hash"]
    kernel.cas.path_of(lost).unlink()
    reply = find(kernel, ME, {"match": "needle"})
    assert reply["skipped"] == {"pruned": 0, "unreadable": 1}
    assert [h["ref"] for h in reply["hits"]] == [kept] and reply["searched"]["runs"] == 1
    assert "1 unreadable skipped" in reply["render"]


def test_visibility_and_the_order_across_sessions(kernel: Kernel) -> None:
    other_session = Principal("find-b", AGENT)
    stranger = Principal("find-a", OTHER)
    first = store_result(kernel, ME, b"token 1\n")
    store_result(kernel, stranger, b"token 2 of another principal\n")
    time.sleep(0.01)  # stored at a later instant: the order across sessions is by time
    second = store_result(kernel, other_session, b"token 3\n")
    mine = find(kernel, ME, {"match": "token"})
    assert [h["ref"] for h in mine["hits"]] == [first]
    everywhere = find(kernel, ME, {"match": "token", "session": "all"})
    assert [(h["ref"], h.get("session")) for h in everywhere["hits"]] == [
        (second, "find-b"),
        (first, None),
    ]
    assert "find-b:" + second in everywhere["render"]
    # journal_read = "all": every principal's outputs, as one-by-one reads allow.
    query = find_query(ME, {"ref": "outputs", "match": "token"}, reads_all=True)
    assert Finder(kernel.db, kernel.cas, query).run().total == 2
    # Across sessions the cursor carries time and session; budget 0 walks them one by one.
    replies = walk(kernel, ME, {"match": "token", "session": "all"}, budget_s=0)
    assert [h["ref"] for r in replies for h in r["hits"]] == [second, first]
    with pytest.raises(RpcError) as info:
        find(kernel, ME, {"match": "token", "session": "all", "cursor": "1,out,0,0"})
    assert info.value.data["field"] == "cursor"


def test_a_match_deep_in_a_long_line_is_shown_around_it(kernel: Kernel) -> None:
    line = "x" * 5000 + "NEEDLE" + "y" * 5000
    ref = store_result(kernel, ME, f"head\n{line}\n".encode())
    (hit,) = find(kernel, ME, {"match": "NEEDLE"})["hits"]
    assert hit["ref"] == ref and hit["line"] == 2 and "NEEDLE" in hit["text"]
    assert len(hit["text"].encode()) <= FIND_LINE_SHOWN + 6  # two ellipses
    assert line[hit["col"] - 1 :].startswith(hit["text"].strip("\u2026"))


def test_a_needle_across_two_read_blocks_is_found(kernel: Kernel) -> None:
    # The memmem pass reads MATCH_BLOCK bytes at a time: the needle spans the joint.
    lines = (MATCH_BLOCK - 3) // 100
    head = b"x" * 99 + b"\n"
    data = head * lines + b"y" * (MATCH_BLOCK - 3 - lines * 100) + b"NEEDLE\n" + b"b\n" * 10
    ref = store_result(kernel, ME, data)
    store_result(kernel, ME, b"b\n" * 10)
    reply = find(kernel, ME, {"match": "NEEDLE"})
    assert [(h["ref"], h["line"]) for h in reply["hits"]] == [(ref, lines + 1)]
    assert reply["searched"]["runs"] == 2 and reply["total"] == 1
    # A regex is prefiltered by the literal its matches hold (here "EEDL").
    assert find(kernel, ME, {"match": "N?EEDL[E]"})["total"] == 1
