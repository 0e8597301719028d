"""MCP tool results: bounded text, a link, structured metadata (docs/protocol.md, Tools).

Shaped by the session's ``Revision``: a ``resource_link`` and ``structuredContent`` only
where the revision defines them (older sessions find the URI in the text). No byte of
output is sent twice in one result: when the text carries a render or a raw page,
``structuredContent`` carries what describes it (ref, uri, path, offsets, counts, next,
an outcome's status), not the same bytes again. Binary raw pages travel as an embedded
``blob`` with a real mimeType, never as base64 in text.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..protocol import uri
from ..protocol.errors import RpcError
from ..protocol.framing import bound_text
from ..protocol.limits import TEXT_LIMIT
from .mime import BINARY, mime_for_uri
from .versions import LATEST, Revision

# Members of a kernel result that carry output bytes (shown in the text instead).
TEXT_MEMBERS = ("render", "raw", "raw_base64")
# Members of an outcome value its render shows: stdout always, stderr's tail on failure.
RENDERED_OUTCOME_MEMBERS = ("out",)
# Members of a search across runs its render shows (the lines found, their runs' heads).
RENDERED_FIND_MEMBERS = ("hits", "runs")


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def resource_link(link: str, name: str | None = None) -> dict:
    return {
        "type": "resource_link",
        "uri": link,
        "name": name or link,
        "mimeType": mime_for_uri(link),
    }


def result_uri(result: dict) -> str | None:
    for key in ("uri", "result_uri"):
        if isinstance(result.get(key), str):
            return result[key]
    return None


def _trailer(structured: dict, link: str | None) -> str:
    """``[out:3 · shoal://out/3]`` plus a raw page's position: where this came from."""
    parts = [p for p in (structured.get("ref"), link) if isinstance(p, str)]
    if isinstance(structured.get("offset"), int) and isinstance(structured.get("total"), int):
        start = structured["offset"]
        parts.append(
            f"bytes {start}..{start + structured.get('length', 0)} of {structured['total']}"
        )
    if isinstance(structured.get("next"), str):
        parts.append(f"next: {structured['next']}")
    return f"[{' · '.join(parts)}]" if parts else ""


def _with_trailer(body: str, trailer: str) -> str:
    body = body.rstrip("\n")
    if not trailer:
        return body
    return f"{body}\n\n{trailer}" if body else trailer


def _metadata(structured: dict) -> dict:
    """``structured`` without the bytes its text block carries."""
    meta = {k: v for k, v in structured.items() if k not in TEXT_MEMBERS}
    if "render" in structured and structured.get("ref") == uri.OUTPUTS_REF:
        meta = {k: v for k, v in meta.items() if k not in RENDERED_FIND_MEMBERS}
    value = meta.get("value")
    if "render" in structured and "value" in meta:
        if isinstance(value, dict) and value.get("$") == "outcome":
            failed = value.get("ok") is False
            meta["value"] = {
                k: v
                for k, v in value.items()
                if k not in RENDERED_OUTCOME_MEMBERS and not (failed and k == "err")
            }
        else:
            del meta["value"]  # the render is this value
    return meta


def _page_uri(structured: dict, link: str | None) -> str:
    """The URI that reads exactly this raw page back."""
    if link is None:
        return uri.SCHEME
    query: dict[str, object] = {}
    if isinstance(structured.get("path"), str):
        query["path"] = structured["path"]
    query.update(format="raw", offset=structured.get("offset", 0))
    if isinstance(structured.get("length"), int):
        query["length"] = structured["length"]
    try:
        return uri.with_query(link, **query)
    except uri.BadName:
        return link


def tool_result(result: Any, rev: Revision = LATEST) -> dict:
    """Kernel success → ``{content, structuredContent?, isError: false}`` for ``rev``."""
    structured = result if isinstance(result, dict) else {"result": result}
    link = result_uri(structured)
    name = structured.get("ref") or structured.get("task") or structured.get("plan_ref")
    trailer = _trailer(structured, link)
    blob: dict | None = None
    if isinstance(structured.get("raw_base64"), str):
        text = trailer or "binary page"
        blob = {
            "type": "resource",
            "resource": {
                "uri": _page_uri(structured, link),
                "mimeType": BINARY,
                "blob": structured["raw_base64"],
            },
        }
    elif isinstance(structured.get("render"), str):
        text = _with_trailer(structured["render"], trailer)
    elif isinstance(structured.get("raw"), str):
        text = _with_trailer(structured["raw"], trailer)
    else:
        text = _pretty(structured)  # the spec's advice: structured JSON also as text
    content: list[dict] = [{"type": "text", "text": bound_text(text, TEXT_LIMIT, link)}]
    if blob is not None:
        content.append(blob)
    if link and rev.resource_link:
        content.append(resource_link(link, name))
    out: dict[str, Any] = {"content": content, "isError": False}
    if rev.structured_content:
        out["structuredContent"] = _metadata(structured)
    return out


def error_result(exc: RpcError, rev: Revision = LATEST) -> dict:
    """Kernel error → a normal result with ``isError: true`` (the model can read it)."""
    lines = [f"error {exc.code}: {exc.message}"]
    data = exc.data if isinstance(exc.data, dict) else {}
    if isinstance(data.get("render"), str) and data["render"]:
        lines.append(data["render"])
    elif isinstance(data.get("stderr_tail"), str) and data["stderr_tail"]:
        lines.append(data["stderr_tail"])
    rest = {k: v for k, v in data.items() if k not in ("render", "stderr_tail")}
    if rest:
        lines.append(_pretty(rest))
    elif exc.data is not None and not isinstance(exc.data, dict):
        lines.append(_pretty(exc.data))
    link = data.get("uri") if isinstance(data.get("uri"), str) else None
    content: list[dict] = [{"type": "text", "text": bound_text("\n".join(lines), TEXT_LIMIT, link)}]
    if link and rev.resource_link:
        content.append(resource_link(link, data.get("ref") or data.get("plan_ref")))
    out: dict[str, Any] = {"content": content, "isError": True}
    if rev.structured_content:
        error: dict[str, Any] = {"code": exc.code, "message": exc.message}
        if exc.data is not None:
            error["data"] = rest if isinstance(exc.data, dict) else exc.data
        out["structuredContent"] = {"error": error}
    return out
