"""The kernel's lean foreground exec (issue #18), against a live kernel.

A foreground exec is watched and finalized by the thread serving the call, and its reply
is built from the outcome just stored instead of reading it back. What a caller sees
must not change: the reply equals what ``value.get`` returns for the same ref later,
the task channel still carries started/output/finished, and a foreground exec that
outlives its wait budget still becomes a task that finishes and is stored.
"""

from __future__ import annotations

import pytest

from shoal_mcp.protocol.errors import RpcError
from tests.support.kernel import close_client
from tests.support.polling import wait_until


@pytest.fixture
def client(kernel):
    c = kernel.client("lean-exec")
    yield c
    close_client(c)


@pytest.mark.parametrize(
    "src",
    [
        "echo hi",
        "printf 'a\\nb\\n'; echo oops >&2; exit 3",
        "seq 1 5000",  # elided: head and tail lines, a ref to the rest
        "printf '\\xff\\xfe binary'",
    ],
)
def test_the_reply_equals_the_stored_value(client, src):
    reply = client.call("exec", {"src": src, "position": "value"}, timeout=60)
    stored = client.call("value.get", {"ref": reply["ref"], "with_render": True}, timeout=60)
    assert stored["ref"] == reply["ref"] and stored["uri"] == reply["uri"]
    assert stored["value"] == reply["value"]
    assert stored["render"] == reply["render"]


def _next_task_number(client) -> int:
    handle = client.call("exec", {"src": "true", "background": True}, timeout=60)
    n = int(handle["task"].split(":")[1])
    client.call("task.await", {"task": handle["task"], "timeout_ms": 30000}, timeout=60)
    return n + 1


def test_a_foreground_exec_still_reports_on_its_task_channel(client):
    n = _next_task_number(client)
    # Output, then quiet for longer than the output-event interval: an output event,
    # read while the exec runs (a finished foreground task is forgotten, its channel too).
    _, fut = client.start_call("exec", {"src": "echo first; sleep 1.5; echo second"})

    def output_event():
        try:
            events = client.call("events.read", {"channel": f"task.{n}"}, timeout=30)["events"]
        except RpcError:
            return None  # not spawned yet
        return [e["payload"] for e in events if e["payload"]["kind"] == "output"] or None

    outputs = wait_until(output_event, timeout=30, interval=0.05, what="an output event")
    assert outputs[0]["out_bytes"] == len("first\n")
    reply = fut.result(60)
    assert reply["value"]["out"] == {"$": "str", "v": "first\nsecond\n"}


def test_a_foreground_exec_past_its_budget_is_finished_by_a_waiter(client):
    handle = client.call("exec", {"src": "sleep 0.5; echo late", "timeout_ms": 50}, timeout=60)
    assert handle.get("timed_out") is True
    task = handle["task"]
    record = wait_until(
        lambda: (r := client.call("task.get", {"task": task}, timeout=30)).get("result_ref") and r,
        timeout=30,
        interval=0.05,
        what="the detached exec to be finalized",
    )
    assert record["state"] == "completed"
    value = client.call("value.get", {"ref": record["result_ref"]}, timeout=30)["value"]
    assert value["out"] == {"$": "str", "v": "late\n"}
