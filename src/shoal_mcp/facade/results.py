"""MCP tool results: bounded text, a resource_link, structured content (docs/protocol.md, Tools)."""

from __future__ import annotations

from typing import Any

import orjson

from ..protocol import uri
from ..protocol.errors import RpcError
from ..protocol.framing import bound_text
from ..protocol.limits import TEXT_LIMIT


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def _link(link: str, name: str | None = None) -> dict:
    try:
        kind = uri.parse_uri(link).kind
    except uri.BadName:
        kind = None
    mime = "application/json" if kind in (uri.TASK, uri.PLAN) else "text/plain"
    return {"type": "resource_link", "uri": link, "name": name or link, "mimeType": mime}


def result_uri(result: dict) -> str | None:
    for key in ("uri", "result_uri"):
        if isinstance(result.get(key), str):
            return result[key]
    return None


def tool_result(result: Any) -> dict:
    """Kernel success → ``{content, structuredContent, isError: false}``."""
    structured = result if isinstance(result, dict) else {"result": result}
    link = result_uri(structured)
    text = structured.get("render") if isinstance(structured.get("render"), str) else None
    if text is None:
        text = _pretty(structured)
    elif "ref" in structured and link:
        body = text.rstrip("\n")
        text = (
            f"{body}\n\n[{structured['ref']} · {link}]"
            if body
            else f"[{structured['ref']} · {link}]"
        )
    content: list[dict] = [{"type": "text", "text": bound_text(text, TEXT_LIMIT, link)}]
    if link:
        content.append(
            _link(
                link, structured.get("ref") or structured.get("task") or structured.get("plan_ref")
            )
        )
    return {"content": content, "structuredContent": structured, "isError": False}


def error_result(exc: RpcError) -> dict:
    """Kernel error → a normal result with ``isError: true`` (the model can read it)."""
    error: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.data is not None:
        error["data"] = exc.data
    lines = [f"error {exc.code}: {exc.message}"]
    data = exc.data or {}
    if isinstance(data.get("render"), str) and data["render"]:
        lines.append(data["render"])
    elif isinstance(data.get("stderr_tail"), str) and data["stderr_tail"]:
        lines.append(data["stderr_tail"])
    rest = {k: v for k, v in data.items() if k not in ("render", "stderr_tail")}
    if rest:
        lines.append(_pretty(rest))
    link = data.get("uri") if isinstance(data.get("uri"), str) else None
    content: list[dict] = [{"type": "text", "text": bound_text("\n".join(lines), TEXT_LIMIT, link)}]
    if link:
        content.append(_link(link, data.get("ref") or data.get("plan_ref")))
    return {"content": content, "structuredContent": {"error": error}, "isError": True}
