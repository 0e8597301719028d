"""One MCP 2026-07-28 session with the official Python SDK 2.3 (its ``Client``, mode auto:
it probes ``server/discover`` and stays modern), approving one command and declining another
through its elicitation callback.

Run by tests/test_mcp_sdk_matrix.py: ``python python_modern_client.py <facade python>``
with the facade's environment (an agent whose ``basename`` needs approval). Prints one JSON
line of what it saw; the test judges it.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import version

import anyio
from mcp import Client, StdioServerParameters, types

FACADE_PYTHON = sys.argv[1]


def texts(result) -> list[str]:
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return [c["text"] for c in dumped["content"] if c["type"] == "text"]


async def main() -> dict:
    seen: dict = {"sdk": version("mcp"), "asked": []}
    answers = iter(["once", "decline"])

    async def on_elicit(context, params) -> types.ElicitResult:
        seen["asked"].append(params.message)
        answer = next(answers)
        if answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"decision": answer})

    server = StdioServerParameters(
        command=FACADE_PYTHON, args=["-m", "shoal_mcp.facade"], env=dict(os.environ)
    )
    async with Client(server, mode="auto", elicitation_callback=on_elicit) as client:
        seen["protocol"] = client.protocol_version
        seen["server"] = client.server_info.name if client.server_info else None
        seen["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        ran = await client.call_tool("shoal_exec", {"command": "echo hi"})
        seen["exec_text"] = texts(ran)
        approved = await client.call_tool("shoal_exec", {"command": "basename /x/sdk-approved"})
        seen["approved"] = {"isError": approved.is_error, "text": texts(approved)}
        declined = await client.call_tool("shoal_exec", {"command": "basename /x/sdk-declined"})
        seen["declined"] = {"isError": declined.is_error, "text": texts(declined)}
    return seen


print(json.dumps(anyio.run(main)))
