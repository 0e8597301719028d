"""Reading shoal results: an MCP tool reply's structured content, tagged wire values,
and the ``RpcError`` a kernel call must raise."""

from __future__ import annotations

from typing import Any

import pytest

from shoal_mcp.protocol.errors import RpcError

CALL_TIMEOUT_S = 30.0


def structured(reply: dict) -> dict:
    """structuredContent of a successful ``tools/call`` reply (asserting it succeeded)."""
    assert "result" in reply, reply
    result = reply["result"]
    assert result.get("isError") is False, result
    return result["structuredContent"]


def wire_text(value: dict) -> str:
    """The text of a tagged ``str`` wire value (``{"$": "str", "v": ...}``)."""
    assert value.get("$") == "str", value
    return value["v"]


def out_text(result: dict) -> str:
    """The stdout string of a kernel exec result whose ``out`` came back inline."""
    return wire_text(result["value"]["out"])


def call_err(
    client: Any, method: str, params: dict | None = None, timeout: float = CALL_TIMEOUT_S
) -> RpcError:
    """Call ``method`` on a ``KernelClient`` and return the ``RpcError`` it must raise."""
    with pytest.raises(RpcError) as info:
        client.call(method, params or {}, timeout=timeout)
    return info.value


def shown(reply: dict) -> str:
    """The text a ``tools/call`` reply shows the model, without its ``[ref · uri]`` line.

    The render of an outcome is its stdout (its stderr tail too when it failed); the
    structured content then carries only what describes it (no output byte twice).
    """
    assert "result" in reply, reply
    text = reply["result"]["content"][0]["text"]
    body, sep, trailer = text.rpartition("\n\n[")
    if sep and trailer.endswith("]"):
        return body
    return "" if text.startswith("[") and text.endswith("]") else text
