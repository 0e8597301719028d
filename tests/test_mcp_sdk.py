"""shoal-mcp end to end through the official MCP Python SDK client (issue #5).

See docs/protocol.md, MCP surface.

Every test launches a real ``shoal-mcp`` subprocess (``python -m shoal_mcp.facade``)
against a real kernel on a temporary socket, and speaks to it with
``mcp.ClientSession`` over ``mcp.client.stdio.stdio_client``: the same code path a
Python agent uses. No mocks.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from shoal_mcp import __version__
from shoal_mcp.protocol.limits import TEXT_LIMIT
from tests.support.facade import facade_env
from tests.support.kernel import KernelProcess, running_kernel
from tests.support.procfs import kill_pids, pids_with_arg
from tests.support.wire import find_nulls

pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

TOOL_NAMES = {
    "shoal_exec",
    "shoal_plan",
    "shoal_apply",
    "shoal_get",
    "shoal_journal",
    "shoal_cancel",
    "shoal_cap_request",
    "shoal_pty_open",
    "shoal_pty_send",
    "shoal_pty_read",
    "shoal_pty_resize",
    "shoal_pty_close",
    "shoal_pty_list",
}
RAW = TypeAdapter(dict[str, Any])  # send_request(..., RAW) returns the result as the server sent it
SCENARIO_TIMEOUT_S = 45


# --- fixtures and helpers ---------------------------------------------------------------


@pytest.fixture
def kernel():
    """A fresh kernel per test: sessions, transcripts and tasks start empty."""
    with running_kernel() as k:
        yield k


class Notes:
    """Server notifications captured by the SDK's message_handler."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    async def __call__(self, message: Any) -> None:
        self.items.append(message)

    def updated(self, uri: str | None = None) -> list[str]:
        return [
            n.params.uri
            for n in self.items
            if getattr(n, "method", None) == "notifications/resources/updated"
            and (uri is None or n.params.uri == uri)
        ]

    def errors(self) -> list[Exception]:
        return [n for n in self.items if isinstance(n, Exception)]


def run_session(
    k: KernelProcess,
    scenario: Callable[[ClientSession, Notes], Awaitable[Any]],
) -> Any:
    """Start shoal-mcp, initialize an SDK session, run ``scenario``, shut it all down."""
    notes = Notes()
    errlog_path = k.tmp / "facade.err"

    async def main() -> Any:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "shoal_mcp.facade"],
            env=facade_env(k),
            cwd=str(k.tmp),
        )
        with open(errlog_path, "a") as errlog, anyio.fail_after(SCENARIO_TIMEOUT_S):
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write, message_handler=notes) as session,
            ):
                await session.initialize()
                return await scenario(session, notes)

    result = anyio.run(main)
    assert not notes.errors(), f"transport errors: {notes.errors()}"
    return result


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    with anyio.fail_after(timeout):
        while not (value := predicate()):
            await anyio.sleep(0.02)
    return value


def text_of(result: types.CallToolResult) -> str:
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    assert len(texts) == 1, result.content
    return texts[0]


def links_of(result: types.CallToolResult) -> list[types.ResourceLink]:
    return [c for c in result.content if isinstance(c, types.ResourceLink)]


def unwrap_str_list(wire: dict) -> list[str]:
    assert wire["$"] == "list", wire
    return [item["v"] for item in wire["v"]]


# --- lifecycle and listing ---------------------------------------------------------------


def test_initialize_negotiates_and_lists_13_closed_tools(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        raw_tools = await s.send_request(types.ListToolsRequest(), RAW)
        raw_templates = await s.send_request(types.ListResourceTemplatesRequest(), RAW)
        tools = await s.list_tools()
        await s.send_ping()
        return s.initialize_result, raw_tools, raw_templates, tools

    init, raw_tools, raw_templates, tools = run_session(kernel, scenario)
    # The SDK offers a newer revision than shoal speaks; the server answers with its own.
    assert init.protocol_version == "2025-06-18"
    assert init.server_info.name == "shoal"
    assert init.server_info.version == __version__
    caps = init.capabilities
    assert caps.tools is not None
    assert caps.resources is not None and caps.resources.subscribe is True
    assert caps.logging is not None
    assert caps.prompts is None
    assert init.instructions and "shoal_get" in init.instructions

    assert find_nulls(raw_tools) == [], "tools/list must omit optional fields, never send null"
    assert find_nulls(raw_templates) == []
    assert "nextCursor" not in raw_tools
    listed = raw_tools["tools"]
    assert {t["name"] for t in listed} == TOOL_NAMES
    assert len(listed) == 13
    for tool in listed:
        schema = tool["inputSchema"]
        assert schema["type"] == "object", tool["name"]
        assert schema["additionalProperties"] is False, tool["name"]
        assert tool["title"].strip(), tool["name"]
        assert len(tool["description"]) > 30, tool["name"]
        assert "outputSchema" not in tool, tool["name"]
    # The SDK's own typed view agrees.
    assert {t.name for t in tools.tools} == TOOL_NAMES
    exec_schema = next(t for t in listed if t["name"] == "shoal_exec")["inputSchema"]
    assert exec_schema["required"] == ["src"]
    assert {"src", "mode", "position", "background", "timeout_ms", "elide"} <= set(
        exec_schema["properties"]
    )


# --- tools ------------------------------------------------------------------------------


def test_exec_echo(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        return await s.call_tool("shoal_exec", {"src": "echo hi"})

    result = run_session(kernel, scenario)
    assert result.is_error is False
    assert text_of(result).startswith("hi\n")
    structured = result.structured_content
    assert structured["value"]["$"] == "outcome"
    assert structured["value"]["ok"] is True
    assert structured["value"]["out"] == {"$": "str", "v": "hi\n"}
    (link,) = links_of(result)
    assert link.uri == structured["uri"]
    assert link.uri.startswith("shoal://out/")


def test_big_output_is_bounded_and_drillable(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        big = await s.call_tool("shoal_exec", {"src": "seq 1 2000000"})
        ref = big.structured_content["ref"]
        got = await s.call_tool("shoal_get", {"ref": ref, "path": ".out.lines[-1..]"})
        uri = big.structured_content["uri"]
        reads = {}
        for form in (
            f"{uri}?path=.out.lines[-1..]",
            f"{uri}?path=.out.lines%5B-1..%5D",
            f"{uri}?path=%2Eout%2Elines%5B%2D1%2E%2E%5D",
        ):
            reads[form] = await s.read_resource(form)
        return big, got, reads

    big, got, reads = run_session(kernel, scenario)
    assert big.is_error is False
    text = text_of(big)
    assert len(text.encode()) <= TEXT_LIMIT
    # The preview shows head and tail, and says how to fetch the middle.
    assert text.startswith("1\n2\n3\n")
    assert "2000000" in text and "shoal_get" in text
    (link,) = links_of(big)
    assert link.uri == big.structured_content["uri"]
    out = big.structured_content["value"]["out"]
    assert out["$"] == "ref" and out["lines"] == 2_000_000

    assert got.is_error is False
    # a line range through shoal_get is a page of text (docs/protocol.md, Paging)
    assert got.structured_content["render"] == "2000000"
    assert "2000000" in text_of(got)

    for form, read in reads.items():
        (content,) = read.contents
        assert content.uri == form
        assert content.mime_type == "application/json"
        assert '"2000000"' in content.text, form
        assert len(content.text.encode()) <= TEXT_LIMIT


def test_background_task_subscription_and_wait(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        started = await s.call_tool("shoal_exec", {"src": "sleep 1; echo bg", "background": True})
        handle = started.structured_content
        await s.subscribe_resource(handle["uri"])
        await wait_for(lambda: notes.updated(handle["uri"]), timeout=15)
        done = await s.call_tool("shoal_get", {"ref": handle["task"], "wait_ms": 10_000})
        record = await s.read_resource(handle["uri"])
        await s.unsubscribe_resource(handle["uri"])
        return started, handle, done, record

    started, handle, done, record = run_session(kernel, scenario)
    assert started.is_error is False
    assert handle["task"].startswith("task:")
    assert handle["uri"] == f"shoal://task/{handle['task'].split(':')[1]}"
    assert any(link.uri == handle["uri"] for link in links_of(started))
    assert done.is_error is False
    assert done.structured_content["task"]["state"] == "completed"
    assert done.structured_content["value"]["out"] == {"$": "str", "v": "bg\n"}
    assert "bg" in text_of(done)
    (content,) = record.contents
    assert '"completed"' in content.text


def test_get_task_wait_ms_is_a_budget(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        started = await s.call_tool("shoal_exec", {"src": "sleep 2; echo late", "background": True})
        task = started.structured_content["task"]
        t0 = time.monotonic()
        early = await s.call_tool("shoal_get", {"ref": task, "wait_ms": 200})
        waited = time.monotonic() - t0
        late = await s.call_tool("shoal_get", {"ref": task, "wait_ms": 10_000})
        return early, waited, late

    early, waited, late = run_session(kernel, scenario)
    assert early.is_error is False
    assert early.structured_content["state"] == "running"
    assert waited < 1.5
    assert late.structured_content["task"]["state"] == "completed"
    assert late.structured_content["value"]["out"]["v"] == "late\n"


def test_unsubscribe_really_stops_notifications(kernel):
    uri = "shoal://events/user.x"
    publisher = kernel.client()

    async def scenario(s: ClientSession, notes: Notes):
        await s.subscribe_resource(uri)
        publisher.call("events.publish", {"channel": "user.x", "payload": {"n": 1}}, timeout=10)
        await wait_for(lambda: notes.updated(uri), timeout=10)
        first = len(notes.updated(uri))
        await s.unsubscribe_resource(uri)
        publisher.call("events.publish", {"channel": "user.x", "payload": {"n": 2}}, timeout=10)
        await anyio.sleep(1.0)
        after = len(notes.updated(uri))
        # The facade is still healthy and the channel still readable.
        read = await s.read_resource(uri)
        return first, after, read

    try:
        first, after, read = run_session(kernel, scenario)
    finally:
        publisher.close()
    assert first == 1
    assert after == first, "a notification arrived after resources/unsubscribe"
    (content,) = read.contents
    assert '"n": 2' in content.text


def test_cancelling_an_inflight_call_ends_the_kernel_task(kernel):
    marker = f"30.{random.randrange(10**6):06d}"
    watcher = kernel.client()

    async def scenario(s: ClientSession, notes: Notes):
        t0 = time.monotonic()
        with anyio.move_on_after(20) as scope:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await s.call_tool("shoal_exec", {"src": f"sleep {marker}"})

                tg.start_soon(call)
                await wait_for(lambda: pids_with_arg(marker), timeout=10)
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled
        assert not scope.cancelled_caught
        # The kernel cancels the task: the sleep is gone well before its 30 s.
        await wait_for(lambda: not pids_with_arg(marker), timeout=8)
        gone_after = time.monotonic() - t0
        # The facade keeps serving on the same session.
        after = await s.call_tool("shoal_exec", {"src": "echo still-here"})
        return gone_after, after

    try:
        gone_after, after = run_session(kernel, scenario)
        rows = watcher.call("journal.query", {"limit": 20}, timeout=10)
    finally:
        watcher.close()
        kill_pids(pids_with_arg(marker))
    assert gone_after < 15
    assert text_of(after).startswith("still-here")
    row = next(r for r in rows["rows"] if marker in r["src"])
    assert row["ok"] is False


def test_kernel_error_is_an_iserror_result(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        failed = await s.call_tool(
            "shoal_exec", {"src": "echo oops >&2; false", "position": "stmt"}
        )
        as_value = await s.call_tool("shoal_exec", {"src": "false"})
        unknown = await s.call_tool("shoal_get", {"ref": "out:999999"})
        return failed, as_value, unknown

    failed, as_value, unknown = run_session(kernel, scenario)
    assert failed.is_error is True
    error = failed.structured_content["error"]
    assert error["code"] == -32002
    assert error["data"]["status"] == 1
    assert "oops" in error["data"]["stderr_tail"]
    text = text_of(failed)
    assert "-32002" in text and "oops" in text
    assert [link.uri for link in links_of(failed)] == [error["data"]["uri"]]
    # position defaults to value in the MCP tool: a failure is a value, not an error.
    assert as_value.is_error is False
    assert as_value.structured_content["value"]["ok"] is False
    assert unknown.is_error is True
    assert unknown.structured_content["error"]["code"] == -32004


@pytest.mark.parametrize(
    ("name", "arguments", "field"),
    [
        ("shoal_exec", {"src": 1}, "arguments.src"),
        ("shoal_exec", {"src": "true", "bogus": 1}, "bogus"),
        ("shoal_exec", {}, "src"),
        ("shoal_exec", {"src": "true", "mode": "yolo"}, "mode"),
        ("shoal_get", {"ref": "out:1", "slice": [1]}, "slice"),
        ("no_such_tool", {}, "no_such_tool"),
    ],
)
def test_bad_arguments_are_jsonrpc_invalid_params(kernel, name, arguments, field):
    async def scenario(s: ClientSession, notes: Notes):
        with pytest.raises(MCPError) as info:
            await s.call_tool(name, arguments)
        return info.value

    error = run_session(kernel, scenario)
    assert error.error.code == -32602
    assert field in error.error.message or field in str(error.error.data)


def test_progress_notifications_for_a_slow_command(kernel):
    updates: list[tuple[float, float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((time.monotonic(), progress, total, message))

    async def scenario(s: ClientSession, notes: Notes):
        quick = await s.call_tool("shoal_exec", {"src": "true"}, progress_callback=on_progress)
        quick_updates = len(updates)
        slow = await s.call_tool(
            "shoal_exec",
            {"src": "for i in 1 2 3; do echo tick $i; sleep 1; done"},
            progress_callback=on_progress,
        )
        return quick, quick_updates, slow

    quick, quick_updates, slow = run_session(kernel, scenario)
    assert quick.is_error is False and quick_updates == 0
    assert slow.is_error is False and "tick 3" in text_of(slow)
    assert 2 <= len(updates) <= 4, updates
    values = [u[1] for u in updates]
    assert values == sorted(values) and len(set(values)) == len(values), "progress must increase"
    gaps = [b[0] - a[0] for a, b in zip(updates, updates[1:], strict=False)]
    assert all(gap > 0.5 for gap in gaps), f"progress at most about once per second: {gaps}"
    assert all(u[3] and "elapsed" in u[3] for u in updates)


def test_oversize_request_fails_fast_instead_of_hanging(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        t0 = time.monotonic()
        with pytest.raises(MCPError) as info:
            await s.call_tool("shoal_exec", {"src": "echo " + "x" * (17 * 1024 * 1024)})
        elapsed = time.monotonic() - t0
        await s.send_ping()
        after = await s.call_tool("shoal_exec", {"src": "echo fine"})
        return info.value, elapsed, after

    error, elapsed, after = run_session(kernel, scenario)
    # The SDK writes the id before params, so the facade answers that very request.
    assert error.error.code == -32600
    assert "too large" in error.error.message
    assert elapsed < 20
    assert text_of(after).startswith("fine")


def test_unknown_resources_are_32002(kernel):
    async def scenario(s: ClientSession, notes: Notes):
        codes = {}
        for uri in (
            "shoal://nope",
            "shoal://out/999999",
            "shoal://task/999999",
            "file:///etc/passwd",
        ):
            with pytest.raises(MCPError) as info:
                await s.read_resource(uri)
            codes[uri] = info.value.error.code
        return codes

    codes = run_session(kernel, scenario)
    assert set(codes.values()) == {-32002}, codes
