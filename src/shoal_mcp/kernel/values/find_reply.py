"""The reply of a search across runs: its params read, hits grouped by run, the next call.

The engine is ``find``; this module turns ``value.get`` params into a ``FindQuery``
(refusing what only makes sense inside one output) and a ``FindOutcome`` into a reply
under the 64 KiB value bound whose render a model reads: a summary line, each run's
journal head (when, exit status, command) above its hits, and the exact call that
continues (docs/protocol.md, Find across runs).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ...protocol import uri
from ...protocol.display import escape_controls
from ...protocol.errors import invalid_params
from ...protocol.limits import FIND_ALL_SESSIONS, VALUE_HARD_CAP
from ...protocol.params import FIND_PARAMS
from ..access.identity import Principal
from ..config.limits import FIND_BUDGET_S, FIND_CMD_HEAD_CHARS, FIND_LINE_SHOWN
from .find import STREAMS, Cursor, FindOutcome, FindQuery, Run, RunHit
from .match import Matcher, MatchSpec
from .search import REPLY_RESERVE

NOT_ACROSS_RUNS = ("path", "slice", "offset", "length", "elide")
"""``value.get`` params that select inside one value: refused with ref ``outputs``."""
MATCH_LEAD_SHOWN = 32
"""Bytes shown before a match that lies past FIND_LINE_SHOWN in its line."""
CONTINUATION = 0xC0
"""UTF-8 continuation bytes are 0b10xxxxxx: ``b & CONTINUATION == 0x80``."""


def is_outputs_ref(ref: str) -> bool:
    ref = ref.strip()
    if ref == uri.OUTPUTS_REF:
        return True
    try:
        return ref.startswith(uri.SCHEME) and uri.parse_uri(ref).kind == uri.OUTPUTS
    except uri.BadName:
        return False


def refuse_find_params(params: dict) -> None:
    """A value ref given a filter of the search across runs: -32602 naming it."""
    for key in FIND_PARAMS:
        if key in params:
            raise invalid_params(key, 'only a search across runs takes it (ref "outputs")')


def find_query(who: Principal, params: dict, reads_all: bool) -> FindQuery:
    for key in NOT_ACROSS_RUNS:
        if key in params:
            raise invalid_params(key, 'selects inside one value; ref "outputs" searches them all')
    if params.get("format") == "raw":
        raise invalid_params("format", 'ref "outputs" answers hits, not raw bytes')
    if "match" not in params:
        raise invalid_params("match", 'required with ref "outputs" (the pattern to find)')
    spec = MatchSpec.from_param(params["match"])
    for key in ("invert", "from_line"):
        if getattr(spec, key) != getattr(MatchSpec(regex=""), key):
            raise invalid_params(f"match.{key}", "only inside one output (use cursor to go on)")
    session = params.get("session", who.session)
    stream = params.get("stream")
    return FindQuery(
        spec=spec,
        session=None if session == FIND_ALL_SESSIONS else session,
        principal=None if reads_all else who.principal,
        since=params.get("since"),
        until=params.get("until"),
        ok=params.get("ok"),
        streams=(stream,) if stream else STREAMS,
        cursor=Cursor.parse(params["cursor"], session == FIND_ALL_SESSIONS)
        if "cursor" in params
        else None,
    )


# -- the reply -------------------------------------------------------------------------


def _cut_utf8(data: bytes, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` moved onto UTF-8 code point boundaries of ``data``."""
    while 0 < start < len(data) and data[start] & CONTINUATION == 0x80:
        start += 1
    while start < end < len(data) and data[end] & CONTINUATION == 0x80:
        end -= 1
    return start, end


def _shown(data: bytes, at: int = 0) -> tuple[str, int]:
    """(text, bytes skipped at its start): ``data`` cut to FIND_LINE_SHOWN around ``at``."""
    start = 0 if at + MATCH_LEAD_SHOWN <= FIND_LINE_SHOWN else at - MATCH_LEAD_SHOWN
    start, end = _cut_utf8(data, start, start + FIND_LINE_SHOWN)
    text = data[start:end].decode("utf-8", "replace")
    return ("\u2026" if start else "") + text + ("\u2026" if end < len(data) else ""), start


def _where(run: Run, caller: str) -> dict:
    return {
        "ref": uri.out_ref(run.n),
        **({"session": run.session} if run.session != caller else {}),
    }


def _hit_wire(rh: RunHit, caller: str, matcher: Matcher) -> dict:
    hit = rh.hit
    at = matcher.in_line(hit.text, 0, len(hit.text), time.monotonic() + 1.0)
    text, skipped = _shown(hit.text, max(0, at))
    link = uri.out_uri(rh.run.n, path=".err" if rh.stream == "err" else None)
    out: dict[str, Any] = {**_where(rh.run, caller), "uri": link, "stream": rh.stream}
    out.update(line=hit.line + 1, text=text)
    if hit.col is not None or skipped:
        out["col"] = (hit.col or 1) + skipped
    if hit.before:
        out["before"] = [_shown(x)[0] for x in hit.before]
    if hit.after:
        out["after"] = [_shown(x)[0] for x in hit.after]
    return out


def _head(run: Run, caller: str) -> dict:
    """The run's journal head: when it was stored, its exit status, its command's start."""
    first = run.cmd.strip().split("\n", 1)[0]
    cmd = first[:FIND_CMD_HEAD_CHARS]
    if len(cmd) < len(run.cmd.strip()):
        cmd += "\u2026"
    out = {**_where(run, caller), "uri": uri.out_uri(run.n), "ts": run.ts}
    out.update(status=run.status, ok=run.ok, cmd=cmd)
    return {k: v for k, v in out.items() if v is not None}


def find_reply(params: dict, query: FindQuery, found: FindOutcome, caller: str) -> dict:
    """``{ref, uri, hits, runs, total, searched, skipped, complete, truncated,
    cursor?, next?, next_call?, render}``."""
    matcher = Matcher(query.spec.regex.encode("utf-8", "surrogatepass"), query.spec.ignore_case)
    hits: list[dict] = []
    heads: dict[tuple[str, int], dict] = {}
    shown: list[RunHit] = []
    size, budget = 0, (VALUE_HARD_CAP - REPLY_RESERVE) // 2  # the render repeats them
    for rh in found.hits:
        wire = _hit_wire(rh, caller, matcher)
        key = (rh.run.session, rh.run.n)
        head = heads.get(key) or _head(rh.run, caller)
        size += len(orjson.dumps(wire)) + (0 if key in heads else len(orjson.dumps(head)))
        if size > budget and hits:
            break
        heads[key] = head
        hits.append(wire)
        shown.append(rh)
    base = _base_params(params)
    out: dict[str, Any] = {
        "ref": uri.OUTPUTS_REF,
        "uri": uri.build(uri.OUTPUTS, None, uri.outputs_query(base)),
        "session": FIND_ALL_SESSIONS if query.session is None else query.session,
        "hits": hits,
        "runs": list(heads.values()),
        "total": found.total,
        "searched": {"runs": found.runs, "blobs": found.blobs, "bytes": found.bytes},
        "skipped": {"pruned": found.pruned, "unreadable": found.unreadable},
        "complete": found.complete,
    }
    if found.cut_lines:
        out["cut_lines"] = found.cut_lines
    cursor = _next_cursor(found, shown)
    out["truncated"] = cursor is not None
    if cursor is not None:
        nxt = {**base, "cursor": cursor.encode(across_sessions=query.session is None)}
        out["cursor"] = nxt["cursor"]
        out["next"] = uri.build(uri.OUTPUTS, None, uri.outputs_query(nxt))
        out["next_call"] = nxt
    out["render"] = _render(out, query, caller)
    return out


def _next_cursor(found: FindOutcome, shown: list[RunHit]) -> Cursor | None:
    """After the last hit shown when more were counted; else where the budget stopped."""
    if found.total > len(shown) and shown:
        return shown[-1].after()
    return found.stopped_at


def _base_params(params: dict) -> dict:
    """The caller's search without its cursor: what the next call repeats."""
    keep = ("match", *(k for k in FIND_PARAMS if k != "cursor"))
    return {"ref": uri.OUTPUTS_REF, **{k: params[k] for k in keep if k in params}}


def _when(ts: float, today: str) -> str:
    """``HH:MM:SS`` for a run of today (local time), else ``YYYY-MM-DD HH:MM``."""
    day = time.strftime("%Y-%m-%d", time.localtime(ts))
    return time.strftime("%H:%M:%S" if day == today else "%Y-%m-%d %H:%M", time.localtime(ts))


def _render(reply: dict, query: FindQuery, caller: str) -> str:
    searched = reply["searched"]["runs"]
    where = "all sessions" if query.session is None else f"session {query.session}"
    total = reply["total"]
    head = (
        f"{total} {'hit' if total == 1 else 'hits'} for /{query.spec.regex}/ in {searched} "
        f"{'run' if searched == 1 else 'runs'} searched ({where}, newest first)"
    )
    skipped = reply["skipped"]
    notes = [f"{v} {k} skipped" for k, v in skipped.items() if v]
    if notes:
        head += "; " + ", ".join(notes)
    lines = [head]
    heads = {(h.get("session", caller), h["ref"]): h for h in reply["runs"]}
    current = None
    today = time.strftime("%Y-%m-%d")
    for hit in reply["hits"]:
        key = (hit.get("session", caller), hit["ref"])
        if key != current:
            current = key
            run = heads[key]
            status = f"exit {run['status']}" if "status" in run else "no exit status"
            name = f"{run['session']}:{run['ref']}" if "session" in run else run["ref"]
            lines.append(
                f"{name} {status} {_when(run['ts'], today)} $ {escape_controls(run['cmd'])}"
            )
        lines.extend(_hit_lines(hit))
    if not reply["complete"]:
        lines.append(
            f"(stopped after the {FIND_BUDGET_S:g} s budget: counts cover the runs searched)"
        )
    if reply["truncated"]:
        call = orjson.dumps(reply["next_call"]).decode()
        lines.append(f"\u2026 more: shoal_get {call}")
    return "\n".join(lines)


def _hit_lines(hit: dict) -> list[str]:
    n = hit["line"]
    tag = "err " if hit["stream"] == "err" else ""
    before = hit.get("before", [])
    out = [f"  {tag}{n - len(before) + i}-{t}" for i, t in enumerate(before)]
    col = f" [col {hit['col']}]" if "col" in hit else ""
    out.append(f"  {tag}{n}:{col}{hit['text']}")
    out += [f"  {tag}{n + 1 + i}-{t}" for i, t in enumerate(hit.get("after", []))]
    return out
