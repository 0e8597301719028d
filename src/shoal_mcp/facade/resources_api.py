"""resources/list, templates/list and read over the kernel link."""

from __future__ import annotations

from ..client import KernelLost
from ..protocol import uri
from ..protocol.errors import ErrorCode, RpcError
from .kernel_link import KernelLink
from .resources import (
    ROOTS,
    TEMPLATES,
    kernel_read,
    listing_entry,
    parse_uri,
    read_contents,
    unknown,
)

# Kernel "no such thing" errors become MCP's resource-not-found.
NOT_FOUND_CODES = {
    ErrorCode.UNKNOWN_REF,
    ErrorCode.UNKNOWN_TASK,
    ErrorCode.UNKNOWN_PLAN,
    ErrorCode.UNKNOWN_PTY,
}


class ResourceApi:
    def __init__(self, link: KernelLink) -> None:
        self.link = link

    def list(self, params: dict) -> dict:
        entries = [listing_entry(root, name, desc) for root, name, desc in ROOTS]
        try:
            for task in self.link.call("task.list", {}).get("tasks", []):
                entries.append(
                    listing_entry(task["uri"], task["task"], f"{task['state']}: {task['src'][:80]}")
                )
            for plan in self.link.call("plan.list", {}).get("plans", []):
                entries.append(
                    listing_entry(
                        plan["uri"], plan["plan_ref"], f"{plan['state']}: {plan['src'][:80]}"
                    )
                )
            for pty in self.link.call("pty.list", {}).get("ptys", []):
                num = uri.ref_number(pty["pty_id"], uri.PTY)
                entries.append(
                    listing_entry(
                        uri.pty_uri(num), pty["pty_id"], f"pty running {pty.get('cmd', '')}"
                    )
                )
        except (RpcError, KernelLost):
            pass  # the static roots are still useful without a kernel
        return {"resources": entries}

    @staticmethod
    def templates() -> dict:
        return {
            "resourceTemplates": [
                {
                    "uriTemplate": t,
                    "name": name,
                    "description": desc,
                    "mimeType": "application/json",
                }
                for t, name, desc in TEMPLATES
            ]
        }

    def read(self, params: dict) -> dict:
        text = params.get("uri")
        if not isinstance(text, str):
            raise RpcError(
                ErrorCode.INVALID_PARAMS, "invalid params: uri: required string", {"field": "uri"}
            )
        parsed = parse_uri(text)
        method, kparams, mime = kernel_read(parsed, text)
        try:
            result = self.link.call(method, kparams)
        except RpcError as exc:
            if exc.code in NOT_FOUND_CODES:
                raise unknown(text) from None
            raise
        return read_contents(text, result, mime)
