"""What each MCP revision we speak allows in what we send (docs/protocol.md, "MCP versions").

A session negotiates one revision at ``initialize``; every result is then shaped by its
``Revision``: content types and fields a revision does not define are not sent (a
client validating against that revision rejects them, as mcp<1.10 and TS SDK<1.13 do
with ``resource_link``). Checked against each revision's published JSON schema by
tests/test_mcp_conformance.py (the schemas are vendored in tests/mcp_schemas/).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.limits import MCP_PROTOCOL_VERSION, MCP_SUPPORTED_VERSIONS


@dataclass(frozen=True, slots=True)
class Revision:
    name: str
    resource_link: bool  # content type "resource_link" (2025-06-18)
    structured_content: bool  # CallToolResult.structuredContent, Tool.outputSchema (2025-06-18)
    titles: bool  # "title" on Tool, Implementation, Resource, ResourceTemplate (2025-06-18)
    tool_annotations: bool  # Tool.annotations (2025-03-26)
    batches: bool  # JSON-RPC batches (2025-03-26 only: 2025-06-18 removed them)
    tasks: bool  # the tasks utility and task-augmented tools/call (2025-11-25)


REVISIONS: dict[str, Revision] = {
    "2024-11-05": Revision("2024-11-05", False, False, False, False, False, False),
    "2025-03-26": Revision("2025-03-26", False, False, False, True, True, False),
    "2025-06-18": Revision("2025-06-18", True, True, True, True, False, False),
    "2025-11-25": Revision("2025-11-25", True, True, True, True, False, True),
}
SPOKEN = {name: REVISIONS[name] for name in MCP_SUPPORTED_VERSIONS}

LATEST = REVISIONS[MCP_PROTOCOL_VERSION]


def negotiate(requested: object) -> Revision:
    """The revision to answer ``initialize`` with: the one asked for when we speak it,
    else our latest (the client then decides whether it can go on)."""
    if isinstance(requested, str) and requested in SPOKEN:
        return SPOKEN[requested]
    return LATEST
