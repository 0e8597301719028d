"""Paginated, bounded MCP lists (issue 16): opaque cursors; resources/list stays small."""

from __future__ import annotations

import re

import pytest

from shoal_mcp.facade.paging import cursor_offset, make_cursor, page
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.protocol.limits import MCP_LIST_PENDING_PLANS, MCP_LIST_RECENT_TASKS
from tests.support.facade import RawFacade, facade_env
from tests.support.polling import wait_until


def test_pages_follow_their_cursors_to_the_end():
    entries = list(range(7))
    seen, params = [], {}
    while True:
        got = page(params, "things", "items", entries, size=3)
        seen += got["items"]
        if "nextCursor" not in got:
            break
        params = {"cursor": got["nextCursor"]}
    assert seen == entries


@pytest.mark.parametrize(
    "cursor",
    [
        "x",
        "",
        3,
        None,
        make_cursor("other-list", 3),
        make_cursor("things", 3)[:-2] + "AA",
        "é" * 300,
    ],
)
def test_a_cursor_we_did_not_give_for_this_list_is_invalid_params(cursor):
    if cursor is None:
        assert cursor_offset({"cursor": None}, "things") == 0  # absent = first page
        return
    with pytest.raises(RpcError) as info:
        cursor_offset({"cursor": cursor}, "things")
    assert info.value.code == ErrorCode.INVALID_PARAMS and info.value.data["field"] == "cursor"


def test_resources_list_is_bounded_and_older_entries_stay_readable(kernel):
    f = RawFacade(facade_env(kernel, "bounded-list"))
    try:
        f.initialize()
        tasks = []
        for i in range(MCP_LIST_RECENT_TASKS + 10):
            reply = f.tool("shoal_exec", {"command": f"echo t{i}", "background": True})
            tasks.append(
                re.search(r"shoal://task/[0-9]+", reply["result"]["content"][0]["text"])[0]
            )
        for i in range(MCP_LIST_PENDING_PLANS + 5):
            f.tool("shoal_plan", {"command": f"rm -rf /tmp/shoal-list-test-{i}"})
        # Let the tasks finish: finished ones beyond the recent few leave the list.
        wait_until(
            lambda: all(
                '"running"'
                not in f.request("resources/read", {"uri": t})["result"]["contents"][0]["text"]
                for t in tasks
            ),
            timeout=30,
            what="the background tasks to finish",
        )
        entries, params = [], {}
        while True:
            result = f.request("resources/list", params)["result"]
            entries += result["resources"]
            if "nextCursor" not in result:
                break
            params = {"cursor": result["nextCursor"]}
        uris = [e["uri"] for e in entries]
        listed_tasks = [u for u in uris if u.startswith("shoal://task/")]
        listed_plans = [u for u in uris if u.startswith("shoal://plan/")]
        assert len(listed_tasks) == MCP_LIST_RECENT_TASKS
        assert listed_tasks == tasks[::-1][:MCP_LIST_RECENT_TASKS]  # newest first
        assert len(listed_plans) == MCP_LIST_PENDING_PLANS
        # The oldest task is off the list but still readable by its URI.
        assert tasks[0] not in uris
        assert "contents" in f.request("resources/read", {"uri": tasks[0]})["result"]
        bad = f.request("resources/list", {"cursor": "forged"})
        assert bad["error"]["code"] == ErrorCode.INVALID_PARAMS
    finally:
        f.close()
