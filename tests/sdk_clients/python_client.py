"""One MCP session with the official Python SDK of whatever version runs this script.

Run by tests/test_mcp_sdk_matrix.py under each SDK version (a throwaway venv per version):
``python python_client.py <facade python> <marker>`` with the facade's environment. Does
exec, get, a resource read, subscribe/unsubscribe (with an update in between) and a
cancel, and prints one JSON line of what it saw; the test judges it. Uses only API that
mcp 1.9 and 2.x share.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import version

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

FACADE_PYTHON, MARKER = sys.argv[1], sys.argv[2]


def wire(model) -> dict:
    """A result as it was on the wire (1.9 names fields camelCase, 2.x snake_case)."""
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def texts(result) -> list[str]:
    return [c["text"] for c in wire(result)["content"] if c["type"] == "text"]


async def main() -> dict:
    seen: dict = {"sdk": version("mcp")}
    updates: list[str] = []

    async def on_message(message) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            updates.append(str(root.params.uri))

    params = StdioServerParameters(
        command=FACADE_PYTHON, args=["-m", "shoal_mcp.facade"], env=dict(os.environ)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=on_message) as session,
    ):
        init = await session.initialize()
        seen["protocol"] = wire(init)["protocolVersion"]
        ran = await session.call_tool("shoal_exec", {"command": "echo hi"})
        seen["exec_error"] = wire(ran)["isError"]
        seen["exec_text"] = texts(ran)
        seen["exec_types"] = [c["type"] for c in wire(ran)["content"]]
        got = await session.call_tool("shoal_get", {"ref": "out:1", "path": ".out"})
        seen["get_text"] = texts(got)
        read_result = await session.read_resource("shoal://out/1?format=render")
        seen["read"] = wire(read_result)["contents"]
        started = await session.call_tool(
            "shoal_exec", {"command": "sleep 0.5; echo bg", "background": True}
        )
        task_uri = next(
            word.strip('[]",')
            for text in texts(started)
            for word in text.split()
            if word.strip('[]",').startswith("shoal://task/")
        )
        await session.subscribe_resource(task_uri)
        with anyio.fail_after(20):
            while task_uri not in updates:
                await anyio.sleep(0.05)
        await session.unsubscribe_resource(task_uri)
        seen["updates"] = len(updates)

        # Cancel: 2.x sends notifications/cancelled when the call is cancelled; 1.9 does
        # not, so its id (the session's next request id) is cancelled by hand as well.
        request_id = getattr(session, "_request_id", None)
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await session.call_tool("shoal_exec", {"command": f"sleep {MARKER}"})

            tg.start_soon(call)
            await anyio.sleep(1.0)
            tg.cancel_scope.cancel()
        if request_id is not None:
            note = types.CancelledNotification(
                method="notifications/cancelled",
                params=types.CancelledNotificationParams(requestId=request_id, reason="test"),
            )
            await session.send_notification(types.ClientNotification(note))
        after = await session.call_tool("shoal_exec", {"command": "echo after-cancel"})
        seen["after_cancel"] = texts(after)
    return seen


print(json.dumps(anyio.run(main)))
