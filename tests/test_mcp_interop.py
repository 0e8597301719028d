"""What the interop pass with the newest clients found on the handshake revisions (issue 28),
and the human's path for a client that cannot elicit.

Each against a real kernel through a real ``shoal-mcp`` over raw pipes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.support.approving import approving_kernel
from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import child_env
from tests.support.polling import wait_until
from tests.support.procfs import kill_pids, pids_with_arg

CLI = [sys.executable, "-c", "from shoal_mcp.cli import run; run()"]


def test_stdin_closed_with_a_call_in_flight_logs_no_error(kernel):
    """The client hung up mid-call: the facade exits quietly; no "kernel unavailable"."""
    f = RawFacade(facade_env(kernel, "interop-hangup"))
    marker = "20.2804"
    try:
        f.initialize("2025-11-25")
        f.request("logging/setLevel", {"level": "debug"})
        f.send("tools/call", {"name": "shoal_exec", "arguments": {"command": f"sleep {marker}"}})
        wait_until(lambda: pids_with_arg(marker), timeout=30, what="the call to be running")
    finally:
        code = f.close()
        kill_pids(pids_with_arg(marker))
    assert code == 0
    logs = [json.loads(line) for line in f.lines if b'"notifications/message"' in line]
    assert not [m for m in logs if m["params"]["level"] in ("error", "critical")], logs
    assert not any(b"kernel unavailable" in line for line in f.lines)


def test_a_second_initialize_is_refused_and_the_revision_stays(kernel):
    f = RawFacade(facade_env(kernel, "interop-reinit"))
    try:
        assert f.initialize("2025-03-26")["result"]["protocolVersion"] == "2025-03-26"
        again = f.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                      "clientInfo": {"name": "t", "version": "0"}})  # fmt: skip
        assert (
            again["error"]["code"] == -32600 and "already initialized" in again["error"]["message"]
        )
        tools = f.request("tools/list")["result"]["tools"]
        assert "title" not in tools[0]  # still 2025-03-26: no titles
    finally:
        f.close()


def test_tools_call_before_initialize_is_refused(kernel):
    f = RawFacade(facade_env(kernel, "interop-early"))
    try:
        early = f.request(
            "tools/call", {"name": "shoal_exec", "arguments": {"command": "echo ran-early"}}
        )
        assert early["error"]["code"] == -32600 and "initialize" in early["error"]["message"]
        assert f.request("ping")["result"] == {}  # a ping is allowed before
        assert "supportedVersions" in f.request("server/discover")["result"]
        f.initialize("2025-06-18")
        ran = f.tool("shoal_exec", {"command": "echo ran-after"})["result"]
        assert ran["content"][0]["text"].startswith("ran-after\n")
        journal = f.tool("shoal_journal", {"limit": 5})["result"]["content"][0]["text"]
        assert "ran-early" not in journal  # it never ran
    finally:
        f.close()


def test_a_2025_11_25_task_is_failed_exactly_when_its_result_is_an_error(kernel):
    """exit 3 is a result (isError false), so its task is completed; 2025-11-25 keeps
    failed for isError true."""
    f = RawFacade(facade_env(kernel, "interop-task"))
    try:
        f.initialize("2025-11-25")
        created = f.request("tools/call", {"name": "shoal_exec", "task": {},
                                        "arguments": {"command": "exit 3"}})  # fmt: skip
        task_id = created["result"]["task"]["taskId"]
        result = f.request("tasks/result", {"taskId": task_id}, timeout=30)["result"]
        status = f.request("tasks/get", {"taskId": task_id})["result"]["status"]
        assert (status == "failed") is bool(result["isError"]), (status, result["isError"])
        assert status == "completed"
    finally:
        f.close()


def test_a_client_without_elicitation_leaves_the_approval_to_shoal_approve():
    """2026-07-28 without elicitation: -32011, the human approves with ``shoal approve``,
    then ``shoal_apply`` runs the plan."""
    with approving_kernel("shia") as (kernel, token, _tmp):
        f = RawFacade(facade_env(kernel, "interop-cli", SHOAL_TOKEN=token))
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        try:
            asked = f.request(
                "tools/call",
                {"name": "shoal_exec", "arguments": {"command": "basename /x/by-cli"},
                 "_meta": meta},
                timeout=30,
            )["result"]  # fmt: skip
            assert asked["isError"] and "-32011" in asked["content"][0]["text"]
            plan_ref = re.search(r"plan:[0-9a-f]+", asked["content"][0]["text"])[0]
            cli_env = child_env(
                {"SHOAL_SOCKET": str(kernel.socket), "SHOAL_STATE_DIR": str(kernel.state)}
            )
            listed = subprocess.run([*CLI, "plans"], env=cli_env, capture_output=True, text=True,
                                    timeout=60)  # fmt: skip
            assert plan_ref in listed.stdout, listed.stdout + listed.stderr
            approved = subprocess.run([*CLI, "approve", plan_ref], env=cli_env,
                                      capture_output=True, text=True, timeout=60)  # fmt: skip
            assert approved.returncode == 0, approved.stderr
            ran = f.request(
                "tools/call",
                {"name": "shoal_apply", "arguments": {"plan_ref": plan_ref}, "_meta": meta},
                timeout=30,
            )["result"]
            assert not ran["isError"] and ran["content"][0]["text"].startswith("by-cli\n"), ran
        finally:
            f.close()


def test_no_tool_the_agent_can_call_answers_an_approval():
    """Deciding stays with the human: no tool reaches cap.ask, cap.answer or cap.decide,
    and no tool argument can carry a request state or input responses."""
    from shoal_mcp.facade.tools import TOOLS

    deciding = {"cap.ask", "cap.answer", "cap.decide"}
    assert not {tool.method for tool in TOOLS} & deciding
    for tool in TOOLS:
        assert not {tool.source(name)[0] for name in tool.args} & deciding, tool.name
        names = set(tool.schema["properties"])
        assert not names & {"requestState", "inputResponses", "request_state", "decision"}
