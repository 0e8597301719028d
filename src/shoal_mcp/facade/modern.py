"""What 2026-07-28 adds to every exchange (docs/protocol.md, "MCP versions").

Requests name their revision and the client's capabilities in ``_meta``
(``request_context``); a revision we do not speak is -32022 with the ones we do. Results
carry ``resultType`` and our ``serverInfo``; cacheable ones ``ttlMs`` and ``cacheScope``.
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..protocol.errors import MCP_UNSUPPORTED_VERSION, RpcError, invalid_params
from ..protocol.limits import MCP_STATIC_TTL_MS, MCP_SUPPORTED_VERSIONS
from .versions import (
    CLIENT_CAPABILITIES_KEY,
    MODERN,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    TASKS_EXTENSION,
    RequestContext,
    Revision,
)

SERVER_INFO = {"name": "shoal", "title": "shoal shell", "version": __version__}
# (ttlMs, cacheScope) per cacheable method: the tool and template lists and discover are
# fixed for a facade's life and the same for everyone; what lists or reads the kernel's
# state (outputs, tasks, plans) changes with every exec and is the user's own.
CACHE: dict[str, tuple[int, str]] = {
    "server/discover": (MCP_STATIC_TTL_MS, "public"),
    "tools/list": (MCP_STATIC_TTL_MS, "public"),
    "resources/templates/list": (MCP_STATIC_TTL_MS, "public"),
    "resources/list": (0, "private"),
    "resources/read": (0, "private"),
}


def request_context(params: object) -> RequestContext | None:
    """The 2026-07-28 context a request names in ``_meta``; None for a request that names
    no revision (it belongs to the ``initialize`` era). Raises -32022 for a revision we do
    not serve statelessly and -32602 for missing client capabilities."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or PROTOCOL_VERSION_KEY not in meta:
        return None
    version = meta[PROTOCOL_VERSION_KEY]
    rev = MODERN.get(version) if isinstance(version, str) else None
    if rev is None:
        raise unsupported_version(version)
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
    if not isinstance(capabilities, dict):
        raise invalid_params(f"_meta.{CLIENT_CAPABILITIES_KEY}", "required object")
    return RequestContext(rev, capabilities)


def unsupported_version(requested: object) -> RpcError:
    return RpcError(
        MCP_UNSUPPORTED_VERSION,
        "Unsupported protocol version",
        {"supported": list(MCP_SUPPORTED_VERSIONS), "requested": str(requested)[:100]},
    )


def shaped(method: str, result: Any, rev: Revision) -> Any:
    """``result`` with the fields 2026-07-28 requires of every result (and of cacheable
    ones); unchanged for an older revision, except ``server/discover``, which exists only
    in the 2026-07-28 shape."""
    if not isinstance(result, dict) or not (rev.stateless or method == "server/discover"):
        return result
    out = dict(result)
    out.setdefault("resultType", "complete")
    meta = out.get("_meta")
    out["_meta"] = {**(meta if isinstance(meta, dict) else {}), SERVER_INFO_KEY: SERVER_INFO}
    if method in CACHE and out["resultType"] == "complete":
        out["ttlMs"], out["cacheScope"] = CACHE[method]
    return out


def discover_result(instructions: str) -> dict:
    """``server/discover``: every revision we speak and what 2026-07-28 clients may use.
    The tool list never changes in a facade's life; the resource list does, and
    ``subscriptions/listen`` announces it (``resourcesListChanged``)."""
    return {
        "supportedVersions": list(MCP_SUPPORTED_VERSIONS),
        "capabilities": {
            "tools": {"listChanged": False},
            "resources": {"subscribe": True, "listChanged": True},
            "extensions": {TASKS_EXTENSION: {}},
        },
        "instructions": instructions,
    }
