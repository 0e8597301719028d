"""MCP resources: roots, dynamic entries, templates and reads.

The URIs are listed in docs/protocol.md, Resource templates.

URIs arrive raw or percent-encoded (clients normalise them differently); both parse to
the same kernel call. Unknown resources are -32002.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..protocol import uri
from ..protocol.errors import MCP_UNKNOWN_RESOURCE, RpcError, invalid_params
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


def unknown(text: str) -> RpcError:
    return RpcError(MCP_UNKNOWN_RESOURCE, f"resource not found: {text[:200]}", {"uri": text[:200]})


def parse_uri(text: str) -> uri.ShoalUri:
    """A resource URI (raw or percent-encoded), or MCP's resource-not-found."""
    try:
        return uri.parse_uri(text)
    except uri.BadName:
        raise unknown(str(text)) from None


def _int(q: dict, key: str) -> int | None:
    if key not in q:
        return None
    try:
        return int(q[key])
    except ValueError:
        raise invalid_params(key, "not an integer") from None


def kernel_read(p: uri.ShoalUri, text: str) -> tuple[str, dict, str]:
    """(kernel method, params, mime) for a resource URI."""
    kind, ident, q = p.kind, p.ident or "", p.query
    if kind == uri.OUT:
        return _value_get(uri.out_ref(int(ident)), q)
    if kind == uri.TASK:
        return "task.get", {"task": uri.task_ref(int(ident))}, "application/json"
    if kind == uri.TASK_ERR:
        path = q.get("path", "")
        return _value_get(uri.task_uri(int(ident)), {**q, "path": ".err" + path})
    if kind == uri.TASK_OUT:
        return _value_get(uri.task_uri(int(ident), "out"), q)
    if kind == uri.VAL:
        params: dict[str, Any] = {"hash": ident}
        for key in ("offset", "length"):
            if (v := _int(q, key)) is not None:
                params[key] = v
        return "blob.get", params, "application/json"
    if kind == uri.PLAN:
        return "plan.get", {"plan_ref": ident}, "application/json"
    if kind == uri.SESSION:
        return f"session.{ident}", {}, "application/json"
    if kind == uri.PTYS:
        return "pty.list", {}, "application/json"
    if kind == uri.PTY:
        return (
            "pty.read",
            {"pty_id": uri.pty_ref(int(ident)) if ident.isdigit() else ident},
            "application/json",
        )
    if kind == uri.JOBS:
        return "task.list", {}, "application/json"
    if kind == uri.JOURNAL:
        return "journal.query", _journal_params(q), "application/json"
    if kind == uri.EVENTS:
        params = {"channel": ident}
        for key in ("since", "limit"):
            if (v := _int(q, key)) is not None:
                params[key] = v
        return "events.read", params, "application/json"
    raise unknown(text)


def _journal_params(q: dict[str, str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key in ("since", "until"):
        if key in q:
            try:
                params[key] = float(q[key])
            except ValueError:
                raise invalid_params(key, "not a number") from None
    for key in ("head", "principal"):
        if key in q:
            params[key] = q[key]
    if "ok" in q:
        params["ok"] = q["ok"].lower() in ("1", "true", "yes")
    if "effects" in q:
        params["effects"] = [e for e in q["effects"].split(",") if e]
    if (limit := _int(q, "limit")) is not None:
        params["limit"] = limit
    return params


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


def read_contents(text_uri: str, result: dict, mime: str) -> dict:
    if mime == "text/plain":
        text = (
            result.get("render")
            if "render" in result
            else result.get("raw", result.get("raw_base64", ""))
        )
    else:
        text = orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
    return {
        "contents": [
            {"uri": text_uri, "mimeType": mime, "text": bound_text(text, TEXT_LIMIT, text_uri)}
        ],
        "structuredContent": result,
    }


def subscription_channel(p: uri.ShoalUri, text: str) -> str:
    """Kernel channel behind a subscribable URI (docs/protocol.md, "Resources"), or -32002."""
    ident = p.ident or ""
    if p.kind == uri.EVENTS:
        return ident
    if p.kind in (uri.TASK, uri.TASK_OUT):
        return uri.task_channel(int(ident))
    if p.kind == uri.PTY:
        num = ident.removeprefix("pty:")
        if num.isdigit():
            return uri.pty_channel(int(num))
    raise unknown(text)


def listing_entry(
    entry_uri: str, name: str, description: str, mime: str = "application/json"
) -> dict:
    return {"uri": entry_uri, "name": name, "description": description, "mimeType": mime}
