"""Validate MCP messages against a revision's published JSON schema (tests/mcp_schemas).

The published schemas leave objects open (no ``additionalProperties``), so a field a
revision does not define would pass. ``RevisionSchema`` closes every named definition
that does not say otherwise: a ``structuredContent`` in a 2024-11-05 result, or a
``title`` on its tools, is then an error, as strict clients treat it.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parent.parent / "mcp_schemas"
REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28")
MODERN = "2026-07-28"
TASKS_EXTENSION = "ext-tasks"
"""The io.modelcontextprotocol/tasks extension's own schema (2026-07-28 tasks)."""
# Answers to these, in a 2026-07-28 exchange, are the tasks extension's types.
EXTENSION_RESULT_OF = {"tasks/get": "GetTaskResult", "tasks/cancel": "CancelTaskResult"}

# The result definition each method's answer must satisfy.
RESULT_OF = {
    "initialize": "InitializeResult",
    "ping": "EmptyResult",
    "tools/list": "ListToolsResult",
    "tools/call": "CallToolResult",
    "resources/list": "ListResourcesResult",
    "resources/templates/list": "ListResourceTemplatesResult",
    "resources/read": "ReadResourceResult",
    "resources/subscribe": "EmptyResult",
    "resources/unsubscribe": "EmptyResult",
    "logging/setLevel": "EmptyResult",
    "tasks/get": "GetTaskResult",
    "tasks/result": "CallToolResult",
    "tasks/list": "ListTasksResult",
    "tasks/cancel": "CancelTaskResult",
    "server/discover": "DiscoverResult",
    "subscriptions/listen": "SubscriptionsListenResult",
}
NOTIFICATION_OF = {
    "notifications/progress": "ProgressNotification",
    "notifications/message": "LoggingMessageNotification",
    "notifications/resources/updated": "ResourceUpdatedNotification",
    "notifications/tasks/status": "TaskStatusNotification",
    "notifications/subscriptions/acknowledged": "SubscriptionsAcknowledgedNotification",
    "notifications/resources/list_changed": "ResourceListChangedNotification",
}
# Open on purpose in every revision: results may carry _meta and future fields.
LEFT_OPEN = {"Result", "EmptyResult", "GetTaskPayloadResult", "JSONRPCResponse"}


class RevisionSchema:
    def __init__(self, revision: str) -> None:
        self.revision = revision
        raw = json.loads((SCHEMAS / revision / "schema.json").read_text())
        self.defs_key = "$defs" if "$defs" in raw else "definitions"
        self.schema = self._closed(raw)
        self.cls = jsonschema.validators.validator_for(raw)

    def _closed(self, raw: dict) -> dict:
        schema = copy.deepcopy(raw)
        defs = schema[self.defs_key]
        # A definition composed with others (allOf) must stay open, or no instance passes.
        composed = {
            ref["$ref"].rsplit("/", 1)[1]
            for definition in defs.values()
            for ref in definition.get("allOf", ())
            if "$ref" in ref
        }
        for name, definition in defs.items():
            if (
                name not in LEFT_OPEN
                and name not in composed
                and definition.get("type") == "object"
                and "properties" in definition
                and "additionalProperties" not in definition
            ):
                definition["additionalProperties"] = False
        return schema

    def has(self, name: str) -> bool:
        return name in self.schema[self.defs_key]

    def errors(self, instance: Any, name: str) -> list[str]:
        """Every violation of definition ``name`` by ``instance`` (empty: it conforms)."""
        wrapper = {**self.schema, "$ref": f"#/{self.defs_key}/{name}"}
        validator = self.cls(wrapper)
        return [
            f"{name} at {'/'.join(map(str, e.absolute_path)) or '.'}: {e.message[:300]}"
            for e in validator.iter_errors(instance)
        ]

    def server_message_errors(self, message: Any, method_of: dict[Any, str]) -> list[str]:
        """Violations of one message the server sent; ``method_of`` maps request ids to
        the method they called (so a result is checked against that method's result)."""
        if isinstance(message, list):
            if not self.has("JSONRPCBatchResponse"):
                return [f"a batch answer, which {self.revision} does not define"]
            out = self.errors(message, "JSONRPCBatchResponse")
            for item in message:
                out += self.server_message_errors(item, method_of)
            return out
        if "method" in message and "id" in message:  # our request to the client
            out = self.errors(message, "JSONRPCRequest")
            if message["method"] != "elicitation/create" or not self.has("ElicitRequest"):
                return [*out, f"request {message['method']} not in {self.revision}"]
            props = self.schema[self.defs_key]["ElicitRequest"].get("properties", {})
            body = {k: v for k, v in message.items() if k in props}
            return out + self.errors(body, "ElicitRequest")
        if "method" in message:
            out = self.errors(message, "JSONRPCNotification")
            kind = NOTIFICATION_OF.get(message["method"])
            if kind is None or not self.has(kind):
                return [*out, f"notification {message['method']} not in {self.revision}"]
            # Before 2025-11-25 a notification's own definition has no "jsonrpc" member
            # (the JSONRPCNotification envelope, checked above, carries it).
            props = self.schema[self.defs_key][kind].get("properties", {})
            body = {k: v for k, v in message.items() if k != "jsonrpc" or k in props}
            return out + self.errors(body, kind)
        if "error" in message:
            name = "JSONRPCErrorResponse" if self.has("JSONRPCErrorResponse") else "JSONRPCError"
            return self.errors(message, name)
        method = method_of.get(message.get("id"))
        if method == "server/discover" and self.revision != MODERN:
            # a 2026-07-28 method, answered in its own shape whatever the session speaks
            return revision_schema(MODERN).server_message_errors(message, method_of)
        name = "JSONRPCResultResponse" if self.has("JSONRPCResultResponse") else "JSONRPCResponse"
        out = self.errors(message, name)
        result_type = message.get("result", {}).get("resultType")
        if self.revision == MODERN and (result_type == "task" or method in EXTENSION_RESULT_OF):
            kind = "CreateTaskResult" if result_type == "task" else EXTENSION_RESULT_OF[method]
            return out + revision_schema(TASKS_EXTENSION).errors(message["result"], kind)
        kind = RESULT_OF.get(method or "")
        if self.revision == MODERN and result_type == "input_required":
            kind = "InputRequiredResult"
        if method == "tools/call" and "task" in message.get("result", {}):
            kind = "CreateTaskResult"
        if kind is None:
            return [*out, f"answer to an unknown request {message.get('id')!r}"]
        if not self.has(kind):
            return [*out, f"{method} has no result type in {self.revision}"]
        return out + self.errors(message["result"], kind)


@cache
def revision_schema(revision: str) -> RevisionSchema:
    return RevisionSchema(revision)
