"""MCP resources: roots, dynamic entries, templates and reads.

The URIs are listed in docs/protocol.md, Resource templates.

URIs arrive raw or percent-encoded (clients normalise them differently); both parse to
the same kernel call. Unknown resources are -32002.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from ..protocol.errors import MCP_UNKNOWN_RESOURCE, RpcError
from ..protocol.framing import bound_text
from ..protocol.limits import TEXT_LIMIT

ROOTS = [
    ("shoal://journal", "journal", "What ran in this kernel, newest first (journal.query)."),
    ("shoal://jobs", "jobs", "Background and detached tasks of this session."),
    ("shoal://session/cwd", "session cwd", "The session's live working directory."),
    ("shoal://session/env", "session env", "Environment variable names (values per policy)."),
    ("shoal://session/reef", "session reef", "Active project root and the tools it uses."),
    ("shoal://pty", "ptys", "Open pseudoterminals of this session."),
]

TEMPLATES = [
    (
        "shoal://out/{n}{?path,slice,format}",
        "transcript value",
        "Value out:N of this session; path selects.",
    ),
    ("shoal://val/{hash}{?offset,length}", "blob", "Raw bytes of a stored blob, paged (base64)."),
    ("shoal://task/{id}", "task", "A task record (state, result ref)."),
    (
        "shoal://task/{id}/out{?path,slice,format}",
        "task output",
        "A task's stdout, live while it runs.",
    ),
    ("shoal://plan/{ref}", "plan", "A stored plan: effects, verdict, state."),
    ("shoal://session/{view}", "session view", "cwd, env or reef."),
    ("shoal://pty/{id}", "pty screen", "The rendered screen of a PTY."),
    (
        "shoal://journal{?since,until,head,principal,ok,effects,limit}",
        "journal query",
        "Filtered journal rows.",
    ),
    ("shoal://events/{channel}{?since,limit}", "event channel", "Recent events of a channel."),
]


def unknown(uri: str) -> RpcError:
    return RpcError(MCP_UNKNOWN_RESOURCE, f"resource not found: {uri[:200]}", {"uri": uri[:200]})


@dataclass
class ParsedUri:
    uri: str
    parts: list[str]
    query: dict[str, str]


def parse_uri(uri: str) -> ParsedUri:
    if not isinstance(uri, str) or not uri.startswith("shoal://"):
        raise unknown(str(uri))
    split = urlsplit(uri)
    parts = [unquote(p) for p in (split.netloc + split.path).split("/") if p]
    if any(p in (".", "..") or "\x00" in p for p in parts):
        raise unknown(uri)
    query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
    return ParsedUri(uri, parts, query)


def _int(q: dict, key: str) -> int | None:
    if key not in q:
        return None
    try:
        return int(q[key])
    except ValueError:
        raise RpcError(-32602, f"invalid params: {key}: not an integer", {"field": key}) from None


def _slice(q: dict) -> Any:
    return q.get("slice")


def kernel_read(p: ParsedUri) -> tuple[str, dict, str]:
    """(kernel method, params, mime) for a resource URI."""
    head, rest, q = (p.parts[0] if p.parts else ""), p.parts[1:], p.query
    if head == "out" and len(rest) == 1 and rest[0].isdigit():
        return _value_get(f"out:{rest[0]}", q)
    if head == "task" and len(rest) == 1:
        return "task.get", {"task": f"task:{rest[0]}"}, "application/json"
    if head == "task" and len(rest) == 2 and rest[1] in ("out", "err"):
        path = q.get("path", "")
        if rest[1] == "err":
            return _value_get(f"shoal://task/{rest[0]}", {**q, "path": ".err" + path})
        return _value_get(f"shoal://task/{rest[0]}/out", q)
    if head == "val" and len(rest) == 1:
        params: dict[str, Any] = {"hash": rest[0]}
        for key in ("offset", "length"):
            if (v := _int(q, key)) is not None:
                params[key] = v
        return "blob.get", params, "application/json"
    if head == "plan" and len(rest) == 1:
        return "plan.get", {"plan_ref": rest[0]}, "application/json"
    if head == "session" and len(rest) == 1 and rest[0] in ("cwd", "env", "reef"):
        return f"session.{rest[0]}", {}, "application/json"
    if head == "pty" and not rest:
        return "pty.list", {}, "application/json"
    if head == "pty" and len(rest) == 1:
        return (
            "pty.read",
            {"pty_id": f"pty:{rest[0]}" if rest[0].isdigit() else rest[0]},
            "application/json",
        )
    if head == "jobs" and not rest:
        return "task.list", {}, "application/json"
    if head == "journal" and not rest:
        params = {}
        for key in ("since", "until"):
            if key in q:
                try:
                    params[key] = float(q[key])
                except ValueError:
                    raise RpcError(
                        -32602, f"invalid params: {key}: not a number", {"field": key}
                    ) from None
        for key in ("head", "principal"):
            if key in q:
                params[key] = q[key]
        if "ok" in q:
            params["ok"] = q["ok"].lower() in ("1", "true", "yes")
        if "effects" in q:
            params["effects"] = [e for e in q["effects"].split(",") if e]
        if (limit := _int(q, "limit")) is not None:
            params["limit"] = limit
        return "journal.query", params, "application/json"
    if head == "events" and len(rest) == 1:
        params = {"channel": rest[0]}
        for key in ("since", "limit"):
            if (v := _int(q, key)) is not None:
                params[key] = v
        return "events.read", params, "application/json"
    raise unknown(p.uri)


def _value_get(ref: str, q: dict) -> tuple[str, dict, str]:
    params: dict[str, Any] = {"ref": ref}
    if q.get("path"):
        params["path"] = q["path"]
    if q.get("slice"):
        params["slice"] = q["slice"]
    fmt = q.get("format", "json")
    params["format"] = fmt
    for key in ("offset", "length"):
        if (v := _int(q, key)) is not None:
            params[key] = v
    return "value.get", params, ("application/json" if fmt == "json" else "text/plain")


def read_contents(uri: str, result: dict, mime: str) -> dict:
    if mime == "text/plain":
        text = (
            result.get("render")
            if "render" in result
            else result.get("raw", result.get("raw_base64", ""))
        )
    else:
        text = orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
    return {
        "contents": [{"uri": uri, "mimeType": mime, "text": bound_text(text, TEXT_LIMIT, uri)}],
        "structuredContent": result,
    }


def subscription_channel(p: ParsedUri) -> str:
    """Kernel channel behind a subscribable URI (see docs/protocol.md), or -32002."""
    head, rest = (p.parts[0] if p.parts else ""), p.parts[1:]
    if head == "events" and len(rest) == 1:
        return rest[0]
    if head == "task" and len(rest) in (1, 2) and (len(rest) == 1 or rest[1] == "out"):
        return f"task.{rest[0].removeprefix('task:')}"
    if head == "pty" and len(rest) == 1:
        return f"pty.{rest[0].removeprefix('pty:')}"
    raise unknown(p.uri)


def listing_entry(uri: str, name: str, description: str, mime: str = "application/json") -> dict:
    return {"uri": uri, "name": name, "description": description, "mimeType": mime}
