"""MCP tool results: bounded text, a resource_link, structured content (docs/protocol.md, Tools)."""

from __future__ import annotations

from typing import Any

import orjson

from ..protocol.errors import RpcError
from ..protocol.framing import bound_text
from ..protocol.limits import TEXT_LIMIT


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def _link(uri: str, name: str | None = None) -> dict:
    mime = (
        "application/json"
        if uri.startswith(("shoal://task/", "shoal://plan/")) and "/out" not in uri
        else "text/plain"
    )
    return {"type": "resource_link", "uri": uri, "name": name or uri, "mimeType": mime}


def result_uri(result: dict) -> str | None:
    for key in ("uri", "result_uri"):
        if isinstance(result.get(key), str):
            return result[key]
    return None


def tool_result(result: Any) -> dict:
    """Kernel success → ``{content, structuredContent, isError: false}``."""
    structured = result if isinstance(result, dict) else {"result": result}
    uri = result_uri(structured)
    text = structured.get("render") if isinstance(structured.get("render"), str) else None
    if text is None:
        text = _pretty(structured)
    elif "ref" in structured and uri:
        body = text.rstrip("\n")
        text = (
            f"{body}\n\n[{structured['ref']} · {uri}]" if body else f"[{structured['ref']} · {uri}]"
        )
    content: list[dict] = [{"type": "text", "text": bound_text(text, TEXT_LIMIT, uri)}]
    if uri:
        content.append(
            _link(
                uri, structured.get("ref") or structured.get("task") or structured.get("plan_ref")
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
    uri = data.get("uri") if isinstance(data.get("uri"), str) else None
    content: list[dict] = [{"type": "text", "text": bound_text("\n".join(lines), TEXT_LIMIT, uri)}]
    if uri:
        content.append(_link(uri, data.get("ref") or data.get("plan_ref")))
    return {"content": content, "structuredContent": {"error": error}, "isError": True}
