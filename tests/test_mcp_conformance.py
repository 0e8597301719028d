"""Conformance matrix: one live session per MCP revision, every message checked.

For each revision shoal speaks, a real ``shoal-mcp`` (over raw pipes, against a real
kernel) runs the same scripted session: lifecycle, every list, tool calls of each result
shape (render, text page, binary page, error, plan, journal), reads of each mimeType,
subscribe/unsubscribe with an update, progress, cancellation, logging, errors; plus what
only that revision has (batches in 2025-03-26, tasks in 2025-11-25). Every line the
facade wrote is then validated against that revision's published JSON schema (vendored
in tests/mcp_schemas, closed as ``tests/support/mcp_schema`` explains), and the
version-dependent fields are checked to be there exactly when the revision has them.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.support.approving import approving_kernel as approving
from tests.support.facade import RawFacade, facade_env
from tests.support.mcp_schema import MODERN, REVISIONS, revision_schema
from tests.support.polling import wait_until

HANDSHAKE_REVISIONS = tuple(r for r in REVISIONS if r != MODERN)

BIG_ID = 123456789012345678901234567890


class Recorder:
    """A RawFacade whose requests are remembered by id (to check answers by method)."""

    def __init__(self, facade: RawFacade) -> None:
        self.f = facade
        self.method_of: dict[Any, str] = {}

    def send(self, method: str, params: dict | None = None, msg_id: Any = None) -> Any:
        """Send a request without waiting; returns its id."""
        msg_id = self.f.send(method, params, msg_id)
        self.method_of[msg_id] = method
        return msg_id

    def request(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        """Send a request and return its reply."""
        return self.f.read_reply(self.send(method, params), timeout)

    def tool(self, name: str, arguments: dict, **extra: Any) -> dict:
        return self.request("tools/call", {"name": name, "arguments": arguments, **extra})

    def notes(self, method: str) -> list[dict]:
        """Notifications seen so far (from the raw lines: nothing is consumed)."""
        out = []
        for line in list(self.f.lines):
            msg = json.loads(line)
            if isinstance(msg, dict) and msg.get("method") == method:
                out.append(msg)
        return out

    def wait_note(self, method: str, timeout: float = 20.0, **match: Any) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for note in self.notes(method):
                if all(note["params"].get(k) == v for k, v in match.items()):
                    return note
            time.sleep(0.05)
        raise AssertionError(f"no {method} {match} within {timeout} s")


def _content_types(reply: dict) -> list[str]:
    return [c["type"] for c in reply["result"]["content"]]


def _common_session(r: Recorder, revision: str) -> dict[str, Any]:
    """The part every revision runs; returns replies the test looks at."""
    seen: dict[str, Any] = {}
    seen["init"] = r.request(
        "initialize",
        {
            "protocolVersion": revision,
            "capabilities": {},
            "clientInfo": {"name": "conformance", "version": "0"},
        },
    )
    r.f.notify("notifications/initialized")
    assert r.request("ping")["result"] == {}
    assert r.request("logging/setLevel", {"level": "debug"})["result"] == {}
    seen["bad_level"] = r.request("logging/setLevel", {"level": "banana"})
    seen["tools"] = r.request("tools/list")
    seen["bad_cursor"] = r.request("tools/list", {"cursor": "not-one-of-ours"})
    r.request("resources/templates/list")
    r.request("resources/list")

    seen["exec"] = r.tool("shoal_exec", {"command": "echo hi; echo there >&2"})
    binary = r.tool("shoal_exec", {"command": "printf 'bin\\000\\377\\376'"})
    ref = re.search(r"out:[0-9]+", binary["result"]["content"][0]["text"])[0]
    seen["binary_page"] = r.tool("shoal_get", {"ref": ref, "path": ".out", "format": "raw"})
    seen["text_page"] = r.tool(
        "shoal_get", {"ref": "out:1", "path": ".out", "format": "raw", "length": 2}
    )
    seen["render"] = r.tool("shoal_get", {"ref": "out:1", "path": ".out.lines[0..1]"})
    seen["json"] = r.tool("shoal_get", {"ref": "out:1", "path": ".out", "format": "json"})
    seen["failed"] = r.tool("shoal_exec", {"command": "echo boom >&2; exit 3", "position": "stmt"})
    r.tool("shoal_plan", {"command": "rm -rf /tmp/shoal-conformance-nothing"})
    r.tool("shoal_journal", {"limit": 2})

    r.request("resources/read", {"uri": "shoal://out/1"})
    seen["read_render"] = r.request("resources/read", {"uri": "shoal://out/1?format=render"})
    seen["read_blob"] = r.request(
        "resources/read", {"uri": f"shoal://out/{ref[4:]}?path=.out&format=raw"}
    )
    seen["not_subscribable"] = r.request("resources/subscribe", {"uri": "shoal://journal"})

    started = r.tool("shoal_exec", {"command": "sleep 0.5; echo bg", "background": True})
    # Every revision finds the task's URI in the text (older ones have no link).
    task_uri = re.search(r"shoal://task/[0-9]+", started["result"]["content"][0]["text"])[0]
    assert r.request("resources/subscribe", {"uri": task_uri})["result"] == {}
    r.wait_note("notifications/resources/updated", uri=task_uri)
    assert r.request("resources/unsubscribe", {"uri": task_uri})["result"] == {}

    # Progress: a call longer than the progress interval, with a token.
    r.tool("shoal_exec", {"command": "sleep 1.6"}, _meta={"progressToken": "p-1"})
    seen["progress"] = r.notes("notifications/progress")

    # Cancellation: no answer for the cancelled request; the session goes on.
    slow = r.send("tools/call", {"name": "shoal_exec", "arguments": {"command": "sleep 30"}})
    time.sleep(0.3)
    r.f.notify("notifications/cancelled", {"requestId": slow, "reason": "test"})
    assert r.request("ping")["result"] == {}

    seen["unknown"] = r.request("no/such/method")
    seen["discover"] = r.request("server/discover")
    seen["big_id_line"] = None
    # An integer id past 64 bits (orjson's range) comes back exactly.
    r.method_of[BIG_ID] = "ping"
    r.f.write(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % BIG_ID)
    return seen


def _check_every_line(r: Recorder, revision: str) -> None:
    schema = revision_schema(revision)
    problems: list[str] = []
    for line in list(r.f.lines):
        message = json.loads(line)  # stdlib: big integers stay exact
        problems += schema.server_message_errors(message, r.method_of)
    assert problems == [], "\n".join(problems[:20])


@pytest.mark.parametrize("revision", HANDSHAKE_REVISIONS)
def test_a_live_session_conforms_to_its_revision(kernel, revision):
    f = RawFacade(facade_env(kernel, f"conformance-{revision}"))
    r = Recorder(f)
    try:
        seen = _common_session(r, revision)
        if revision == "2025-03-26":
            _batches(r)
        if revision == "2025-11-25":
            _tasks(r)
        # The big id answers last (the ping); wait for it in the raw lines.
        deadline = time.monotonic() + 10
        while not any(str(BIG_ID).encode() in line for line in f.lines):
            assert time.monotonic() < deadline, "no answer to the big id"
            time.sleep(0.05)
        _check_every_line(r, revision)
    finally:
        f.close()

    modern = revision >= "2025-06-18"
    assert seen["init"]["result"]["protocolVersion"] == revision
    assert ("title" in seen["init"]["result"]["serverInfo"]) is modern
    assert ("tasks" in seen["init"]["result"]["capabilities"]) is (revision == "2025-11-25")
    for name in ("bad_level", "bad_cursor", "not_subscribable"):
        assert seen[name]["error"]["code"] == -32602, seen[name]
    assert "not subscribable" in seen["not_subscribable"]["error"]["message"]
    assert seen["unknown"]["error"]["code"] == -32601
    # server/discover is answered in every revision (2026-07-28 clients probe with it)
    assert "2026-07-28" in seen["discover"]["result"]["supportedVersions"]
    assert seen["discover"]["result"]["resultType"] == "complete"
    # Version-dependent content: resource_link and structuredContent from 2025-06-18.
    exec_reply = seen["exec"]["result"]
    assert ("resource_link" in _content_types(seen["exec"])) is modern
    assert ("structuredContent" in exec_reply) is modern
    assert "shoal://out/1" in exec_reply["content"][0]["text"]  # the URI, for every revision
    assert exec_reply["content"][0]["text"].startswith("hi\n")
    if modern:
        # No output byte twice: the render is in the text only.
        structured = exec_reply["structuredContent"]
        assert "render" not in structured and "out" not in structured["value"]
        assert structured["value"]["err"] == {"$": "str", "v": "there\n"}  # not in the render
        assert "value" not in seen["render"]["result"]["structuredContent"]
        assert "raw" not in seen["text_page"]["result"]["structuredContent"]
        assert "value" in seen["json"]["result"]["structuredContent"]  # asked for it
    # A binary page is a blob with a real mimeType, the exact bytes.
    blob = next(c for c in seen["binary_page"]["result"]["content"] if c["type"] == "resource")
    assert blob["resource"]["mimeType"] == "application/octet-stream"
    assert blob["resource"]["blob"] == "YmluAP/+"  # b"bin\0\xff\xfe"
    (read_blob,) = seen["read_blob"]["result"]["contents"]
    assert read_blob["mimeType"] == "application/octet-stream" and "text" not in read_blob
    (read_text,) = seen["read_render"]["result"]["contents"]
    assert read_text["mimeType"] == "text/plain" and read_text["text"].startswith("hi")
    # A text page says where the next one is.
    assert "next: shoal://out/1?" in seen["text_page"]["result"]["content"][0]["text"]
    assert seen["progress"], "a 1.6 s call with a token got no progress"


def _batches(r: Recorder) -> None:
    """2025-03-26: a batch of requests and a notification is one array of answers."""
    r.method_of.update({"b1": "ping", "b2": "tools/list"})
    r.f.send_message(
        [
            {"jsonrpc": "2.0", "id": "b1", "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}},
            {"jsonrpc": "2.0", "id": "b2", "method": "tools/list"},
        ]
    )
    deadline = time.monotonic() + 10
    while True:
        arrays = [json.loads(line) for line in list(r.f.lines) if line.startswith(b"[")]
        if arrays:
            break
        assert time.monotonic() < deadline, "no batch answer"
        time.sleep(0.05)
    (answers,) = arrays
    assert sorted(a["id"] for a in answers) == ["b1", "b2"]


def _tasks(r: Recorder) -> None:
    """2025-11-25: a task-augmented shoal_exec, polled, fetched, listed; a cancel."""
    tools = r.request("tools/list")["result"]["tools"]
    support = {t["name"]: t["execution"]["taskSupport"] for t in tools}
    assert support["shoal_exec"] == "optional" and support["shoal_journal"] == "forbidden"

    created = r.tool(
        "shoal_exec",
        {"command": "sleep 1.6; echo tasked"},
        task={"ttl": 60000},
        _meta={"progressToken": "task-progress"},
    )
    task = created["result"]["task"]
    assert task["status"] == "working" and task["ttl"] == 60000
    got = r.request("tasks/get", {"taskId": task["taskId"]})["result"]
    assert got["taskId"] == task["taskId"]
    result = r.request("tasks/result", {"taskId": task["taskId"]})["result"]
    assert result["content"][0]["text"].startswith("tasked\n")
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    r.wait_note("notifications/tasks/status", taskId=task["taskId"], status="completed")
    # The request's progressToken stays valid for the task's life.
    assert r.notes("notifications/progress") and any(
        n["params"]["progressToken"] == "task-progress" for n in r.notes("notifications/progress")
    )
    listed = r.request("tasks/list")["result"]["tasks"]
    assert task["taskId"] in [t["taskId"] for t in listed]

    sleeper = r.tool("shoal_exec", {"command": "sleep 30"}, task={})["result"]["task"]
    cancelled = r.request("tasks/cancel", {"taskId": sleeper["taskId"]})["result"]
    assert cancelled["status"] == "cancelled"
    again = r.request("tasks/cancel", {"taskId": sleeper["taskId"]})
    assert again["error"]["code"] == -32602
    assert r.request("tasks/get", {"taskId": "task:999999"})["error"]["code"] == -32602
    forbidden = r.tool("shoal_journal", {"limit": 1}, task={})
    assert forbidden["error"]["code"] == -32601


@pytest.mark.parametrize("revision", ["2024-11-05", "2025-03-26"])
def test_the_checker_rejects_what_older_revisions_lack(revision):
    """The matrix can fail: what shoal sent these revisions before is an error for them."""
    schema = revision_schema(revision)
    link = {"type": "resource_link", "uri": "shoal://out/1", "name": "out:1"}
    assert schema.errors({"content": [{"type": "text", "text": "x"}, link]}, "CallToolResult")
    assert schema.errors(
        {"content": [{"type": "text", "text": "x"}], "structuredContent": {}}, "CallToolResult"
    )
    tool = {"name": "t", "title": "T", "inputSchema": {"type": "object"}}
    assert schema.errors({"tools": [tool]}, "ListToolsResult")
    batch = [{"jsonrpc": "2.0", "id": 1, "result": {}}]
    method_of = {1: "ping"}
    assert bool(schema.server_message_errors(batch, method_of)) is (revision != "2025-03-26")


@pytest.mark.parametrize("revision", ["2024-11-05", "2025-06-18", "2025-11-25"])
def test_revisions_without_batches_or_tasks_refuse_them(kernel, revision):
    f = RawFacade(facade_env(kernel, f"refuse-{revision}"))
    try:
        f.initialize(revision)
        f.send_message([{"jsonrpc": "2.0", "id": "b1", "method": "ping"}])
        refused = f.next_message()
        assert refused["error"]["code"] == -32600 and "2025-03-26" in refused["error"]["message"]
        assert "id" not in refused
        if revision != "2025-11-25":
            assert f.request("tasks/list")["error"]["code"] == -32601
            # A task field from a client that ignored our capabilities: served normally.
            plain = f.request(
                "tools/call",
                {"name": "shoal_exec", "arguments": {"command": "echo plain"}, "task": {}},
            )
            assert plain["result"]["content"][0]["text"].startswith("plain\n")
    finally:
        f.close()


def test_tasks_past_their_ttl_are_forgotten():
    from shoal_mcp.facade.mcp_tasks import McpTask, McpTasks
    from shoal_mcp.protocol.errors import RpcError
    from shoal_mcp.protocol.limits import MCP_TASKS_KEPT

    tasks = McpTasks(link=None, notify=lambda m, p: None, revision=lambda: None)  # type: ignore[arg-type]
    now = time.time()
    tasks._tasks["task:1"] = McpTask("task:1", now - 10, ttl_ms=5000)
    tasks._tasks["task:2"] = McpTask("task:2", now, ttl_ms=60000)
    assert [t["taskId"] for t in tasks.list({})["tasks"]] == ["task:2"]
    with pytest.raises(RpcError) as info:
        tasks.get({"taskId": "task:1"})
    assert info.value.code == -32602
    # Beyond MCP_TASKS_KEPT, the oldest finished ones go first; running ones stay.
    for n in range(3, MCP_TASKS_KEPT + 10):
        task = McpTask(f"task:{n}", now, ttl_ms=60000)
        task.done.set()
        tasks._tasks[task.task_id] = task
    tasks.list({})
    assert len(tasks._tasks) == MCP_TASKS_KEPT and "task:2" in tasks._tasks


# --- 2026-07-28: stateless requests, MRTR approvals, the tasks extension ----------------

TASKS_EXT = "io.modelcontextprotocol/tasks"
PV = "io.modelcontextprotocol/protocolVersion"


def _meta(**capabilities: Any) -> dict:
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "conformance", "version": "0"},
    }


@pytest.fixture(scope="module")
def approving_kernel():
    """A kernel whose ``agent:w`` (a token) needs approval for basename (tests/support)."""
    with approving(prefix="shmr") as found:
        yield found


def _wait_task(r: Recorder, task_id: str, caps: dict) -> dict:
    """The task once terminal, polled with tasks/get as a client would."""

    def terminal() -> dict | None:
        got = r.request("tasks/get", {"taskId": task_id, "_meta": _meta(**caps)})["result"]
        return got if got["status"] in ("completed", "failed", "cancelled") else None

    return wait_until(terminal, timeout=30, interval=0.1, what=f"{task_id} to end")


def test_a_live_2026_07_28_session_conforms(kernel):
    """No initialize: every request names the revision in _meta; every line validated."""
    f = RawFacade(facade_env(kernel, "conformance-2026"))
    r = Recorder(f)
    tasks = {"extensions": {TASKS_EXT: {}}}
    try:
        discover = r.request("server/discover", {"_meta": _meta()})["result"]
        assert (
            discover["supportedVersions"][0] == MODERN
            and "2025-11-25" in discover["supportedVersions"]
        )
        assert discover["capabilities"]["extensions"] == {TASKS_EXT: {}}
        assert discover["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "shoal"
        odd = r.request("tools/list", {"_meta": {**_meta(), PV: "1900-01-01"}})["error"]
        assert odd["code"] == -32022 and odd["data"]["requested"] == "1900-01-01"
        assert MODERN in odd["data"]["supported"]
        for method in ("tools/list", "resources/templates/list", "resources/list"):
            listed = r.request(method, {"_meta": _meta()})["result"]
            assert listed["resultType"] == "complete" and "ttlMs" in listed, method
            assert listed["cacheScope"] in ("public", "private")
        for gone in ("ping", "logging/setLevel", "resources/subscribe", "tasks/list"):
            assert (
                r.request(gone, {"_meta": _meta(), "level": "info", "uri": "x"})["error"]["code"]
                == -32601
            ), gone
        ran = r.tool("shoal_exec", {"command": "echo hi"}, _meta=_meta())["result"]
        assert ran["resultType"] == "complete" and ran["content"][0]["text"].startswith("hi\n")
        read = r.request("resources/read", {"uri": "shoal://out/1", "_meta": _meta()})["result"]
        assert read["ttlMs"] == 0 and read["cacheScope"] == "private"
        missing = r.request("resources/read", {"uri": "shoal://out/99999", "_meta": _meta()})
        assert missing["error"]["code"] == -32602  # resource not found, 2026-07-28

        # subscriptions/listen over a task's kernel channel
        started = r.tool(
            "shoal_exec", {"command": "sleep 0.5; echo bg", "background": True}, _meta=_meta()
        )["result"]  # no tasks extension declared: the plain handle
        task_uri = re.search(r"shoal://task/[0-9]+", started["content"][0]["text"])[0]
        listen = r.send(
            "subscriptions/listen",
            {"_meta": _meta(), "notifications": {"resourceSubscriptions": [task_uri]}},
        )
        ack = r.wait_note("notifications/subscriptions/acknowledged")
        assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == listen
        updated = r.wait_note("notifications/resources/updated", uri=task_uri)
        assert updated["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == listen
        r.f.notify("notifications/cancelled", {"requestId": listen})
        lists = r.send(
            "subscriptions/listen",
            {"_meta": _meta(), "notifications": {"resourcesListChanged": True}},
        )
        acks = wait_until(
            lambda: (a := r.notes("notifications/subscriptions/acknowledged"))[1:] and a,
            what="the second acknowledgement",
        )
        assert acks[1]["params"]["notifications"] == {"resourcesListChanged": True}
        assert acks[1]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == lists

        # the tasks extension: a background exec (and one past its wait) is a task handle
        handle = r.tool(
            "shoal_exec",
            {"command": "sleep 0.3; echo tasked", "background": True},
            _meta=_meta(**tasks),
        )["result"]
        assert handle["resultType"] == "task" and handle["status"] == "working"
        # a new running task changed the resource list: announced on the listen
        changed = r.wait_note("notifications/resources/list_changed")
        assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == lists
        done = _wait_task(r, handle["taskId"], tasks)
        assert done["status"] == "completed" and done["resultType"] == "complete"
        assert done["result"]["content"][0]["text"].startswith("tasked\n")
        waited = r.tool(
            "shoal_exec", {"command": "sleep 0.4; exit 3", "timeout_ms": 50}, _meta=_meta(**tasks)
        )["result"]
        assert waited["resultType"] == "task"
        exited = _wait_task(r, waited["taskId"], tasks)
        assert exited["status"] == "completed"  # failed is for JSON-RPC errors only here
        refused = r.request("tasks/update", {"taskId": waited["taskId"], "inputResponses": {},
                                          "_meta": _meta(**tasks)})["error"]  # fmt: skip
        assert refused["code"] == -32602 and "shoal_pty" in refused["message"]
        sleeper = r.tool(
            "shoal_exec", {"command": "sleep 30", "background": True}, _meta=_meta(**tasks)
        )["result"]
        assert r.request("tasks/cancel", {"taskId": sleeper["taskId"], "_meta": _meta(**tasks)})[
            "result"
        ] == {"resultType": "complete", "_meta": discover["_meta"]}
        assert _wait_task(r, sleeper["taskId"], tasks)["status"] == "cancelled"
        r.f.notify("notifications/cancelled", {"requestId": lists})
        undeclared = r.request("tasks/get", {"taskId": sleeper["taskId"], "_meta": _meta()})
        assert undeclared["error"]["code"] == -32021
        assert (
            r.request("tasks/get", {"taskId": "task:999999", "_meta": _meta(**tasks)})["error"][
                "code"
            ]
            == -32602
        )
        _check_every_line(r, MODERN)
    finally:
        f.close()
    assert not r.notes("notifications/message")  # no request asked for log messages


def test_an_approval_round_trips_through_the_client(approving_kernel):
    """MRTR (2026-07-28): input_required with the plan, the retry runs exactly that plan;
    the state is single-use; a decline denies; a client without elicitation keeps -32011."""
    kernel, token, tmp = approving_kernel
    f = RawFacade(facade_env(kernel, "mrtr", SHOAL_TOKEN=token))
    r = Recorder(f)
    forms = {"elicitation": {"form": {}}}
    command = "basename /x/approved-once # \r"  # the \r is shown escaped, not hidden
    try:
        asked = r.tool("shoal_exec", {"command": command}, _meta=_meta(**forms))["result"]
        assert asked["resultType"] == "input_required"
        form = asked["inputRequests"]["shoal_approval"]
        assert form["method"] == "elicitation/create" and form["params"]["mode"] == "form"
        assert "basename /x/approved-once # \\r" in form["params"]["message"]
        assert {c["const"] for c in form["params"]["requestedSchema"]["properties"]["decision"][
            "oneOf"]} == {"once", "session", "deny"}  # fmt: skip
        retry = {
            "requestState": asked["requestState"],
            "inputResponses": {"shoal_approval": {"action": "accept", "content": {"decision": "once"}}},
            "_meta": _meta(**forms),
        }  # fmt: skip
        ran = r.tool("shoal_exec", {"command": command}, **retry)["result"]
        assert ran["resultType"] == "complete" and not ran["isError"], ran
        assert ran["content"][0]["text"].startswith("approved-once\n")  # that plan ran
        replayed = r.tool("shoal_exec", {"command": command}, **retry)
        assert replayed["error"]["code"] == -32602 and "single-use" in replayed["error"]["message"]
        forged = r.tool("shoal_exec", {"command": command}, **{**retry, "requestState": "AAAA"})
        assert forged["error"]["code"] == -32602

        # "for this session": recorded with scope session on the plan
        other = "basename /x/for-the-session"
        asked = r.tool("shoal_exec", {"command": other}, _meta=_meta(**forms))
        state = asked["result"]["requestState"]
        ran = r.tool("shoal_exec", {"command": other}, **{
            **retry, "requestState": state, "inputResponses": {"shoal_approval": {
                "action": "accept", "content": {"decision": "session"}}}})["result"]  # fmt: skip
        assert ran["content"][0]["text"].startswith("for-the-session\n"), ran
        human = kernel.client("approver")
        try:
            plans = human.call("plan.list", {"all": True})["plans"]
        finally:
            human.close()
        by_src = {p["src"]: p for p in plans}
        assert by_src[other]["scope"] == "session" and by_src[other]["decided_via"] == "client"
        assert "scope" not in by_src[command] and by_src[command]["state"] == "applied"

        # a decline denies: nothing runs
        denied = "basename /x/never-runs"
        asked = r.tool("shoal_exec", {"command": denied}, _meta=_meta(**forms))
        declined = r.tool("shoal_exec", {"command": denied}, **{
            **retry, "requestState": asked["result"]["requestState"],
            "inputResponses": {"shoal_approval": {"action": "decline"}}})["result"]  # fmt: skip
        assert declined["isError"] and "denied by the user" in declined["content"][0]["text"]
        assert "never-runs\n" not in declined["content"][0]["text"]

        # no elicitation declared: the -32011 result, for shoal plans / shoal approve
        plain = r.tool("shoal_exec", {"command": "basename /x/plain"}, _meta=_meta())
        assert plain["result"]["isError"] and "-32011" in plain["result"]["content"][0]["text"]
        _check_every_line(r, MODERN)
    finally:
        f.close()


def test_older_revisions_ask_with_elicitation_create(approving_kernel):
    """2025-11-25 with elicitation declared: elicitation/create, then the plan runs."""
    kernel, token, tmp = approving_kernel
    f = RawFacade(facade_env(kernel, "elicit", SHOAL_TOKEN=token))
    r = Recorder(f)
    try:
        r.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
                              "clientInfo": {"name": "conformance", "version": "0"}})  # fmt: skip
        f.notify("notifications/initialized")
        call = r.send(
            "tools/call", {"name": "shoal_exec", "arguments": {"command": "basename /x/elicited"}}
        )
        ask = f.next_message(timeout=30)
        while ask.get("method") != "elicitation/create":
            ask = f.next_message(timeout=30)
        assert "basename /x/elicited" in ask["params"]["message"]
        f.send_message({"jsonrpc": "2.0", "id": ask["id"],
                "result": {"action": "accept", "content": {"decision": "once"}}})  # fmt: skip
        ran = f.read_reply(call, 60)["result"]
        assert not ran["isError"] and ran["content"][0]["text"].startswith("elicited\n"), ran
        _check_every_line(r, "2025-11-25")
    finally:
        f.close()
