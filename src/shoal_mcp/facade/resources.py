"""MCP resources: one routing table for templates, reads and subscriptions.

Each ``Route`` is one kind of ``shoal://`` URI (the kinds of ``protocol.uri``): the
template it is listed under, its name, description and mimeType, the kernel call that
reads it and the kernel channel a subscription to it follows. ``resources/templates/
list``, ``resources/read`` and ``resources/subscribe`` all look the URI up here, so a
new kind of resource is one new row. Parsing is ``protocol.uri``'s: URIs arrive raw or
percent-encoded and both parse to the same route. Unknown resources are -32002. The
URIs are listed in docs/protocol.md, "Resource templates".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..client import KernelLost
from ..protocol import uri
from ..protocol.errors import MCP_UNKNOWN_RESOURCE, ErrorCode, RpcError, invalid_params
from ..protocol.framing import bound_text
from ..protocol.limits import MCP_LIST_PENDING_PLANS, MCP_LIST_RECENT_TASKS, TEXT_LIMIT
from .kernel_link import KernelLink
from .mime import BINARY, JSON, TEXT, mime_for
from .paging import page
from .versions import LATEST, Revision

PAGE_META = "shoal.dev/page"
"""``_meta`` key of a text or blob read: what describes the page (next, total...)."""

KernelRead = tuple[str, dict[str, Any]]
"""(kernel method, params) that reads a resource."""


# -- query parameters -----------------------------------------------------------------


def _int(q: dict[str, str], key: str) -> int | None:
    if key not in q:
        return None
    try:
        return int(q[key])
    except ValueError:
        raise invalid_params(key, "not an integer") from None


def _ints(q: dict[str, str], *keys: str) -> dict[str, int]:
    return {key: v for key in keys if (v := _int(q, key)) is not None}


def _value_get(ref: str, q: dict[str, str]) -> KernelRead:
    params: dict[str, Any] = {"ref": ref, **_ints(q, "offset", "length")}
    if q.get("path"):
        params["path"] = q["path"]
    try:  # the one reading of a value URI's query (slice, format, match…) is protocol.uri's
        params.update(uri.value_params(q))
    except uri.BadName as exc:
        raise invalid_params("uri", str(exc)) from None
    params.setdefault("format", "json")
    return "value.get", params


def _find_outputs(q: dict[str, str]) -> KernelRead:
    """``shoal://outputs?match=…``: a search across every stored output (value.get)."""
    try:
        params: dict[str, Any] = {"ref": uri.OUTPUTS_REF, **uri.value_params(q)}
    except uri.BadName as exc:
        raise invalid_params("uri", str(exc)) from None
    if "match" not in params:
        raise invalid_params("uri", "shoal://outputs needs ?match=PATTERN")
    return "value.get", params


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
    return {**params, **_ints(q, "limit")}


# -- readers and channels, one per kind -------------------------------------------------


def _num(p: uri.ShoalUri) -> int:
    return int(p.ident or "")  # the grammar guarantees digits for out/task kinds


def _read_task_err(p: uri.ShoalUri) -> KernelRead:
    q = p.query
    return _value_get(uri.task_uri(_num(p)), {**q, "path": ".err" + q.get("path", "")})


def _read_pty(p: uri.ShoalUri) -> KernelRead:
    ident = p.ident or ""
    return "pty.read", {"pty_id": uri.pty_ref(int(ident)) if ident.isdigit() else ident}


def _task_channel(p: uri.ShoalUri) -> str | None:
    return uri.task_channel(_num(p))


def _pty_channel(p: uri.ShoalUri) -> str | None:
    num = (p.ident or "").removeprefix("pty:")
    return uri.pty_channel(int(num)) if num.isdigit() else None


@dataclass(frozen=True, slots=True)
class Route:
    kind: str  # a uri.* kind
    template: str | None  # RFC 6570 template listed by templates/list; None: not listed
    name: str
    description: str
    read: Callable[[uri.ShoalUri], KernelRead]
    channel: Callable[[uri.ShoalUri], str | None] | None = None  # None: not subscribable

    def listing(self) -> dict:
        out = {"uriTemplate": self.template, "name": self.name, "description": self.description}
        # MCP: a template states a mimeType only when every resource it matches has it;
        # with a format variable, render/raw reads are text.
        if self.template is not None and "format" not in self.template:
            out["mimeType"] = mime_for(self.kind, None)
        return out

    def content_mime(self, params: dict) -> str:
        """What a read of this route with kernel ``params`` returns (text raw pages: TEXT)."""
        return mime_for(self.kind, params.get("format"))


ROUTES: tuple[Route, ...] = (
    Route(
        uri.OUT,
        "shoal://out/{n}{?path,slice,format,offset,length,match,context,max,ignore_case,invert,from_line}",
        "transcript value",
        "Value out:N of this session; path selects.",
        lambda p: _value_get(uri.out_ref(_num(p)), p.query),
    ),
    Route(
        uri.VAL,
        "shoal://val/{hash}{?offset,length}",
        "blob",
        "Raw bytes of a stored blob, paged.",
        lambda p: ("blob.get", {"hash": p.ident, **_ints(p.query, "offset", "length")}),
    ),
    Route(
        uri.TASK,
        "shoal://task/{id}",
        "task",
        "A task record (state, result ref).",
        lambda p: ("task.get", {"task": uri.task_ref(_num(p))}),
        _task_channel,
    ),
    Route(
        uri.TASK_OUT,
        "shoal://task/{id}/out{?path,slice,format,offset,length,match,context,max,ignore_case,invert,from_line}",
        "task output",
        "A task's stdout, live while it runs.",
        lambda p: _value_get(uri.task_uri(_num(p), "out"), p.query),
        _task_channel,
    ),
    Route(
        uri.TASK_ERR,
        None,
        "task errors",
        "A task's stderr, live while it runs.",
        _read_task_err,
    ),
    Route(
        uri.PLAN,
        "shoal://plan/{ref}",
        "plan",
        "A stored plan: effects, verdict, state.",
        lambda p: ("plan.get", {"plan_ref": p.ident}),
    ),
    Route(
        uri.SESSION,
        "shoal://session/{view}",
        "session view",
        "cwd, env or reef.",
        lambda p: (f"session.{p.ident}", {}),
    ),
    Route(
        uri.PTY,
        "shoal://pty/{id}",
        "pty screen",
        "The rendered screen of a PTY.",
        _read_pty,
        _pty_channel,
    ),
    Route(uri.PTYS, None, "ptys", "Open PTYs of this session.", lambda p: ("pty.list", {})),
    Route(uri.JOBS, None, "jobs", "Tasks of this session.", lambda p: ("task.list", {})),
    Route(
        uri.JOURNAL,
        "shoal://journal{?since,until,head,principal,ok,effects,limit}",
        "journal query",
        "Filtered journal rows.",
        lambda p: ("journal.query", _journal_params(p.query)),
    ),
    Route(
        uri.OUTPUTS,
        "shoal://outputs{?match,ignore_case,context,max,since,until,ok,stream,session,cursor}",
        "find across runs",
        "Lines matching a pattern in every stored output of this session, newest first.",
        lambda p: _find_outputs(p.query),
    ),
    Route(
        uri.EVENTS,
        "shoal://events/{channel}{?since,limit}",
        "event channel",
        "Recent events of a channel.",
        lambda p: ("events.read", {"channel": p.ident, **_ints(p.query, "since", "limit")}),
        lambda p: p.ident,
    ),
)
ROUTES_BY_KIND = {r.kind: r for r in ROUTES}
TEMPLATES = tuple(r for r in ROUTES if r.template is not None)

# Concrete resources always listed by resources/list (before the session's tasks,
# plans and PTYs): (uri, name, description).
ROOTS = (
    ("shoal://journal", "journal", "What ran in this kernel, newest first (journal.query)."),
    ("shoal://jobs", "jobs", "Background and detached tasks of this session."),
    ("shoal://session/cwd", "session cwd", "The session's live working directory."),
    ("shoal://session/env", "session env", "Environment variable names (values per policy)."),
    ("shoal://session/reef", "session reef", "Active project root and the tools it uses."),
    ("shoal://pty", "ptys", "Open pseudoterminals of this session."),
)

# Kernel "no such thing" errors become MCP's resource-not-found.
NOT_FOUND_CODES = frozenset(
    {ErrorCode.UNKNOWN_REF, ErrorCode.UNKNOWN_TASK, ErrorCode.UNKNOWN_PLAN, ErrorCode.UNKNOWN_PTY}
)


def unknown(text: str) -> RpcError:
    return RpcError(MCP_UNKNOWN_RESOURCE, f"resource not found: {text[:200]}", {"uri": text[:200]})


def route(text: str) -> tuple[Route, uri.ShoalUri]:
    """The route and parsed form of a resource URI, or MCP's resource-not-found."""
    try:
        parsed = uri.parse_uri(text)
    except uri.BadName:
        raise unknown(str(text)) from None
    found = ROUTES_BY_KIND.get(parsed.kind)
    if found is None:
        raise unknown(text)
    return found, parsed


def not_subscribable(text: str) -> RpcError:
    return RpcError(
        ErrorCode.INVALID_PARAMS,
        f"invalid params: uri: not subscribable: {text[:200]} (subscribable: shoal://task/{{id}}, "
        "shoal://task/{id}/out, shoal://pty/{id}, shoal://events/{channel})",
        {"field": "uri", "reason": "not subscribable", "uri": text[:200]},
    )


def subscription_channel(text: str) -> str:
    """Kernel channel behind a subscribable URI (docs/protocol.md, "Resources").

    -32002 for a URI that names no resource; -32602 "not subscribable" for one that can
    be read but not followed.
    """
    found, parsed = route(text)
    if found.channel is None:
        raise not_subscribable(text)
    channel = found.channel(parsed)
    if channel is None:
        raise unknown(text)
    return channel


def read_contents(text_uri: str, result: dict, mime: str, rev: Revision = LATEST) -> dict:
    """``resources/read``'s answer: JSON as text, text pages as text, bytes as ``blob``.

    A text or blob read carries what describes the page (ref, offsets, total, next) in
    the result's ``_meta`` under ``PAGE_META``; a JSON read's text is the whole result.
    """
    meta: dict | None = None
    if mime == JSON or not any(k in result for k in ("render", "raw", "raw_base64", "base64")):
        item = {
            "uri": text_uri,
            "mimeType": JSON,
            "text": bound_text(
                orjson.dumps(result, option=orjson.OPT_INDENT_2).decode(), TEXT_LIMIT, text_uri
            ),
        }
    elif "raw_base64" in result or "base64" in result:
        item = {
            "uri": text_uri,
            "mimeType": BINARY,
            "blob": result.get("raw_base64", result.get("base64", "")),
        }
        meta = {k: v for k, v in result.items() if k not in ("raw_base64", "base64")}
    else:
        text = (result["render"] if "render" in result else result["raw"]) or ""
        item = {"uri": text_uri, "mimeType": TEXT, "text": bound_text(text, TEXT_LIMIT, text_uri)}
        meta = {k: v for k, v in result.items() if k not in ("render", "raw")}
    out: dict = {"contents": [item]}
    if meta is not None:
        out["_meta"] = {PAGE_META: meta}
    return out


def listing_entry(
    entry_uri: str, name: str, description: str, title: str | None, rev: Revision
) -> dict:
    entry = {"uri": entry_uri, "name": name, "description": description, "mimeType": JSON}
    if title is not None and rev.titles:
        entry["title"] = title
    return entry


def _number(ref: str) -> int:
    tail = ref.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _recent_tasks(tasks: list[dict]) -> list[dict]:
    """Running tasks, then the most recent finished ones (older ones stay readable)."""
    newest = sorted(tasks, key=lambda t: _number(str(t.get("task", ""))), reverse=True)
    running = [t for t in newest if t.get("state") in ("running", "suspended")]
    done = [t for t in newest if t.get("state") not in ("running", "suspended")]
    return running + done[:MCP_LIST_RECENT_TASKS]


def _pending_plans(plans: list[dict]) -> list[dict]:
    """Plans awaiting apply or approval, newest first (older ones stay readable by URI)."""
    pending = [p for p in plans if p.get("state") in ("pending", "requested", "approved")]
    pending.sort(key=lambda p: p.get("created") or 0, reverse=True)
    return pending[:MCP_LIST_PENDING_PLANS]


class ResourceApi:
    """``resources/list``, ``resources/templates/list`` and ``resources/read``."""

    def __init__(self, link: KernelLink) -> None:
        self.link = link

    def list(self, params: dict, rev: Revision = LATEST) -> dict:
        """Roots, running and recent tasks, pending plans, open PTYs; paginated."""
        entries = [listing_entry(root, name, desc, name, rev) for root, name, desc in ROOTS]
        try:
            for task in _recent_tasks(self.link.call("task.list", {}).get("tasks", [])):
                desc = f"{task['state']}: {task['src'][:80]}"
                entries.append(listing_entry(task["uri"], task["task"], desc, None, rev))
            for plan in _pending_plans(self.link.call("plan.list", {}).get("plans", [])):
                desc = f"{plan['state']}: {plan['src'][:80]}"
                entries.append(listing_entry(plan["uri"], plan["plan_ref"], desc, None, rev))
            for pty in self.link.call("pty.list", {}).get("ptys", []):
                num = uri.ref_number(pty["pty_id"], uri.PTY)
                desc = f"pty running {pty.get('cmd', '')}"
                entries.append(listing_entry(uri.pty_uri(num), pty["pty_id"], desc, None, rev))
        except (RpcError, KernelLost):
            pass  # the static roots are still useful without a kernel
        return page(params, "resources", "resources", entries)

    @staticmethod
    def templates(params: dict, rev: Revision = LATEST) -> dict:
        return page(params, "templates", "resourceTemplates", [r.listing() for r in TEMPLATES])

    def read(self, params: dict, rev: Revision = LATEST) -> dict:
        text = params.get("uri")
        if not isinstance(text, str):
            raise RpcError(
                ErrorCode.INVALID_PARAMS, "invalid params: uri: required string", {"field": "uri"}
            )
        found, parsed = route(text)
        method, kparams = found.read(parsed)
        try:
            result = self.link.call(method, kparams)
        except RpcError as exc:
            if exc.code in NOT_FOUND_CODES:
                raise unknown(text) from None
            raise
        return read_contents(text, result, found.content_mime(kparams), rev)
