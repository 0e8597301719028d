"""What each MCP revision we speak allows in what we send (docs/protocol.md, "MCP versions").

One table for all five. The four handshake revisions are chosen once, by ``initialize``;
2026-07-28 is stateless: each request names it in ``_meta`` (with the client's
capabilities), so one facade can serve both eras, request by request (``RequestContext``).
Every result is shaped by its request's ``Revision``: content types and fields a revision
does not define are not sent (a client validating against that revision rejects them, as
mcp<1.10 and TS SDK<1.13 do with ``resource_link``). Checked against each revision's
published JSON schema by tests/test_mcp_conformance.py (vendored in tests/mcp_schemas/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocol.limits import MCP_PROTOCOL_VERSION, MCP_SUPPORTED_VERSIONS


@dataclass(frozen=True, slots=True)
class Revision:
    name: str
    resource_link: bool  # content type "resource_link" (2025-06-18)
    structured_content: bool  # CallToolResult.structuredContent, Tool.outputSchema (2025-06-18)
    titles: bool  # "title" on Tool, Implementation, Resource, ResourceTemplate (2025-06-18)
    tool_annotations: bool  # Tool.annotations (2025-03-26)
    batches: bool  # JSON-RPC batches (2025-03-26 only: 2025-06-18 removed them)
    tasks: bool  # the tasks utility and task-augmented tools/call (2025-11-25 only)
    elicitation: bool  # elicitation/create, form mode (2025-06-18)
    titled_enums: bool  # oneOf/const/title single-select enums in elicitation (2025-11-25)
    # 2026-07-28: no initialize; _meta on every request; resultType, serverInfo, ttlMs and
    # cacheScope on results; server/discover; MRTR; subscriptions/listen; the tasks extension.
    stateless: bool


REVISIONS: dict[str, Revision] = {
    #                                link   struct titles annot  batch  tasks  elicit titled state
    "2024-11-05": Revision("2024-11-05", False, False, False, False, False, False, False, False, False),
    "2025-03-26": Revision("2025-03-26", False, False, False, True, True, False, False, False, False),
    "2025-06-18": Revision("2025-06-18", True, True, True, True, False, False, True, False, False),
    "2025-11-25": Revision("2025-11-25", True, True, True, True, False, True, True, True, False),
    "2026-07-28": Revision("2026-07-28", True, True, True, True, False, False, True, True, True),
}  # fmt: skip
SPOKEN = {name: REVISIONS[name] for name in MCP_SUPPORTED_VERSIONS}
HANDSHAKE = {name: rev for name, rev in SPOKEN.items() if not rev.stateless}
MODERN = {name: rev for name, rev in SPOKEN.items() if rev.stateless}

LATEST = REVISIONS[MCP_PROTOCOL_VERSION]

# _meta keys of 2026-07-28 (the reserved io.modelcontextprotocol/ prefix)
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


def negotiate(requested: object) -> Revision:
    """The revision to answer ``initialize`` with: the handshake revision asked for when we
    speak it, else our latest (the client then decides whether it can go on)."""
    if isinstance(requested, str) and requested in HANDSHAKE:
        return HANDSHAKE[requested]
    return LATEST


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What one request is served under: its revision and the client capabilities in force
    (a 2026-07-28 request's own ``_meta``; the ``initialize`` ones for the older revisions)."""

    revision: Revision
    capabilities: dict[str, Any] = field(default_factory=dict)

    def elicits_forms(self) -> bool:
        """The client takes form elicitations (an empty ``elicitation`` object means form)."""
        if not self.revision.elicitation:
            return False
        elicitation = self.capabilities.get("elicitation")
        if not isinstance(elicitation, dict):
            return False
        return not elicitation or "form" in elicitation or "url" not in elicitation

    def has_extension(self, name: str) -> bool:
        extensions = self.capabilities.get("extensions")
        return isinstance(extensions, dict) and isinstance(extensions.get(name), dict)
