"""The params schema of every kernel method (docs/protocol.md, "Kernel methods").

The kernel registers each method with its schema from here and validates every call
against it; the MCP tools' ``inputSchema`` are derived from the same dicts (picked
properties, model-oriented descriptions), so a limit is stated once. Treat every
schema as read-only: derive copies, never edit one in place.

Sizes the kernel clamps rather than refuses (a raw page's ``length``, a PTY read's
``scrollback``) carry no ``maximum``: asking for more is answered with less, and a
``next`` where there is more.
"""

from __future__ import annotations

from .limits import (
    EVENT_RING,
    FIND_ALL_SESSIONS,
    FIND_CURSOR_MAX_CHARS,
    JOURNAL_MAX_ROWS,
    MATCH_MAX_CONTEXT,
    MATCH_MAX_RESULTS,
    MATCH_REGEX_MAX_CHARS,
    PATH_MAX_CHARS,
    PTY_MAX_ARGS,
    PTY_MAX_DIM,
    PTY_MAX_INPUT_ITEMS,
    PTY_MIN_DIM,
    REF_MAX_CHARS,
    SRC_MAX_CHARS,
    VALUE_HARD_CAP,
    WAIT_MAX_MS,
)
from .schema import closed

# -- property schemas ---------------------------------------------------------------------

STR = {"type": "string"}
NONEMPTY = {"type": "string", "minLength": 1}
BOOL = {"type": "boolean"}
TIMEOUT_MS = {"type": "integer", "minimum": 0, "maximum": WAIT_MAX_MS}
REF = {"type": "string", "minLength": 1, "maxLength": REF_MAX_CHARS}
SRC = {"type": "string", "maxLength": SRC_MAX_CHARS, "description": "bash source"}
POSITION = {"type": "string", "enum": ["stmt", "value"]}
PLAN_REF = {"type": "string", "minLength": 1, "maxLength": 200}
CURSOR = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "description": "continue a list where the previous reply stopped (its `cursor`)",
}
EFFECT_KINDS = {"type": "array", "items": {"type": "string", "maxLength": 32}, "maxItems": 16}
TASK_ID = {"type": ["string", "integer"], "description": "task:N or N"}
CALL_ID = {
    "type": ["string", "integer"],
    "description": "id of an in-flight exec request on this connection",
}
CHANNEL = {"type": "string", "minLength": 1, "maxLength": 256}
SEQ = {"type": "integer", "minimum": -1}
SESSION_NAME = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "pattern": "^[A-Za-z0-9_.:@-]+$",
}
SLICE = {
    "type": ["array", "string"],
    "description": "[a, b] (either may be null) or 'a..b'",
    "items": {"type": ["integer", "null"]},
    "minItems": 2,
    "maxItems": 2,
}
OFFSET = {"type": "integer", "minimum": 0}
LENGTH = {"type": "integer", "minimum": 1}  # clamped to what encodes under the hard cap
ELIDE = {
    "type": "object",
    "description": "Bounds for the returned value; anything larger comes back as a ref.",
    "properties": {
        "max_bytes": {"type": "integer", "minimum": 256, "maximum": VALUE_HARD_CAP},
        "max_items": {"type": "integer", "minimum": 1, "maximum": 100000},
        "max_rows": {"type": "integer", "minimum": 1, "maximum": 100000},
        "max_bytes_raw": {"type": "integer", "minimum": 1, "maximum": VALUE_HARD_CAP},
        "preview_items": {"type": "integer", "minimum": 0, "maximum": 100},
        "preview_chars": {"type": "integer", "minimum": 0, "maximum": 4096},
        "render_head": {"type": "integer", "minimum": 0, "maximum": 1000},
    },
    "additionalProperties": False,
}
REGEX = {"type": "string", "maxLength": MATCH_REGEX_MAX_CHARS}
MATCH = {
    "anyOf": [
        REGEX,
        closed(
            {
                "regex": REGEX,
                "context": {"type": "integer", "minimum": 0, "maximum": MATCH_MAX_CONTEXT},
                "max": {"type": "integer", "minimum": 1, "maximum": MATCH_MAX_RESULTS},
                "ignore_case": BOOL,
                "invert": BOOL,
                "from_line": {"type": "integer", "minimum": 1},
            },
            ("regex",),
        ),
    ],
    "description": "regex (a string), or {regex, context?, max?, ignore_case?, invert?, from_line?}",
}
PTY_ID = {"type": "string", "minLength": 1, "maxLength": 64}
PTY_DIM = {"type": "integer", "minimum": PTY_MIN_DIM, "maximum": PTY_MAX_DIM}
PTY_INPUT = {  # each item is checked (and named, input[2].key) by the kernel's key encoder
    "anyOf": [
        {"type": "string"},
        {"type": "object"},
        {"type": "array", "maxItems": PTY_MAX_INPUT_ITEMS},
    ]
}

# -- method params ------------------------------------------------------------------------

NONE = closed()
"""Methods without params (kernel.status, store.verify, ping, session.cwd/env/reef, pty.list)."""

SESSION_ATTACH = closed(
    {
        "session": SESSION_NAME,
        "token": {"type": "string", "maxLength": 512},
        "client": closed({"kind": STR, "tty": BOOL, "name": STR, "version": STR}),
        "cwd": {"type": "string", "maxLength": 4096},
        "agent": {
            "type": "boolean",
            "description": "without a token: attach as the sandboxed agent principal",
        },
        "roots": {
            "type": "array",
            "maxItems": 64,
            "items": {"type": "string", "minLength": 1, "maxLength": 4096},
            "description": "the client's project directories (absolute): where the agent writes",
        },
    }
)
PARSE = closed({"src": SRC}, ("src",))

EXEC = closed(
    {
        "src": SRC,
        "mode": {"type": "string", "enum": ["run", "plan"]},
        "position": POSITION,
        "background": BOOL,
        "timeout_ms": TIMEOUT_MS,
        "elide": ELIDE,
        # A FIFO (of the kernel's user) the command reads as stdin: `shoal exec -i`.
        "stdin": {"type": "string", "minLength": 1, "maxLength": 4096},
    },
    ("src",),
)
EXPLAIN = closed({"src": SRC}, ("src",))
PLAN_GET = closed({"plan_ref": PLAN_REF}, ("plan_ref",))
PLAN_LIST = closed(
    {
        "state": {
            "type": "string",
            "enum": ["pending", "requested", "approved", "denied", "applied"],
        },
        "all": BOOL,
        "cursor": CURSOR,
    }
)
PLAN_APPLY = closed(
    {
        "plan_ref": PLAN_REF,
        "position": POSITION,
        "background": BOOL,
        "timeout_ms": TIMEOUT_MS,
        "elide": ELIDE,
    },
    ("plan_ref",),
)
CAP_REQUEST = closed({"plan_ref": PLAN_REF, "effects": EFFECT_KINDS}, ("plan_ref",))
CAP_DECIDE = closed(
    {
        "plan_ref": PLAN_REF,
        "approve": BOOL,
        "effects": EFFECT_KINDS,
        "targets": {
            "type": "array",
            "maxItems": 256,
            "items": {"type": "string", "minLength": 1, "maxLength": 4200},
            "description": "approve only these of the plan's targets (kind:target)",
        },
        "unconfined": {
            "type": "boolean",
            "description": "run it once without the sandbox (required for opaque plans)",
        },
        "scope": {
            "type": "string",
            "enum": ["once", "session"],
            "description": "session: its targets stay granted in the session until revoked",
        },
    },
    ("plan_ref", "approve"),
)
GRANTS_REVOKE = closed(
    {
        "principal": {"type": "string", "minLength": 1, "maxLength": 256},
        "target": {"type": "string", "minLength": 1, "maxLength": 4200},
    },
    ("principal",),
)
CAP_ASK = closed({"plan_ref": PLAN_REF}, ("plan_ref",))
CAP_ANSWER = closed(
    {
        "request_state": {"type": "string", "minLength": 1, "maxLength": 1000},
        "decision": {"type": "string", "enum": ["once", "session", "deny"]},
    },
    ("request_state", "decision"),
)

VALUE_GET = closed(
    {
        "ref": REF,
        "path": {"type": "string", "maxLength": PATH_MAX_CHARS},
        "slice": SLICE,
        "format": {"type": "string", "enum": ["json", "render", "raw"]},
        "elide": ELIDE,
        "offset": OFFSET,
        "length": LENGTH,
        "with_render": {"type": "boolean", "description": "json format: also return the render"},
        "match": MATCH,
        # Find across runs (ref "outputs", docs/protocol.md, Find): filters and cursor.
        "since": {"type": "number", "description": "outputs stored at or after this unix time"},
        "until": {"type": "number", "description": "outputs stored at or before this unix time"},
        "session": {
            **SESSION_NAME,
            "description": f"a session name, or {FIND_ALL_SESSIONS!r} (default: this session)",
        },
        "stream": {"type": "string", "enum": ["out", "err"]},
        "ok": {"type": "boolean", "description": "only succeeded (true) or failed (false) runs"},
        "cursor": {
            "type": "string",
            "minLength": 1,
            "maxLength": FIND_CURSOR_MAX_CHARS,
            "description": "continue a search across runs where its reply stopped",
        },
    },
    ("ref",),
)
FIND_PARAMS = ("since", "until", "session", "stream", "ok", "cursor")
"""``value.get`` params that only a search across runs (ref ``outputs``) takes."""
BLOB_GET = closed(
    {"hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "offset": OFFSET, "length": LENGTH},
    ("hash",),
)

TASK_LIST = closed(
    {
        "state": {
            "type": "string",
            "enum": ["running", "completed", "failed", "cancelled", "suspended"],
        },
        "cursor": CURSOR,
    }
)
TASK_GET = closed({"task": TASK_ID, "call": CALL_ID})
TASK_AWAIT = closed({"task": TASK_ID, "timeout_ms": TIMEOUT_MS}, ("task",))
TASK_CANCEL = closed({"task": TASK_ID, "call": CALL_ID})
TASK_STEER = closed({"task": TASK_ID}, ("task",))
"""task.suspend and task.resume."""

EVENTS_READ = closed(
    {
        "channel": CHANNEL,
        "since": SEQ,
        "limit": {"type": "integer", "minimum": 1, "maximum": EVENT_RING},
        "cursor": CURSOR,
    },
    ("channel",),
)
EVENTS_PUBLISH = closed({"channel": CHANNEL, "payload": {"type": "object"}}, ("channel",))
EVENTS_SUBSCRIBE = closed({"channel": CHANNEL, "since": SEQ}, ("channel",))
EVENTS_UNSUBSCRIBE = closed({"subscription": NONEMPTY}, ("subscription",))
JOURNAL_QUERY = closed(
    {
        "since": {"type": "number"},
        "until": {"type": "number"},
        "principal": {"type": "string", "maxLength": 256},
        "head": {"type": "string", "maxLength": 256},
        "ok": BOOL,
        "effects": {"type": "array", "items": {"type": "string", "maxLength": 64}, "maxItems": 16},
        "session": {"type": "string", "maxLength": 128},
        "limit": {"type": "integer", "minimum": 1, "maximum": JOURNAL_MAX_ROWS},
        "cursor": CURSOR,
    }
)

EGRESS_QUERY = closed(
    {
        "exec_id": {"type": "integer", "minimum": 1},
        "principal": {"type": "string", "maxLength": 256},
        "limit": {"type": "integer", "minimum": 1, "maximum": JOURNAL_MAX_ROWS},
    }
)

EGRESS_CHECK = NONE

PTY_OPEN = closed(
    {
        "cmd": NONEMPTY,
        "args": {"type": "array", "items": STR, "maxItems": PTY_MAX_ARGS},
        "cols": PTY_DIM,
        "rows": PTY_DIM,
        "env": {"type": "object", "additionalProperties": STR},
    },
    ("cmd",),
)
PTY_SEND = closed({"pty_id": PTY_ID, "input": PTY_INPUT}, ("pty_id", "input"))
PTY_READ = closed(
    {"pty_id": PTY_ID, "scrollback": {"type": "integer", "minimum": 0}},  # clamped by the kernel
    ("pty_id",),
)
PTY_RESIZE = closed(
    {"pty_id": PTY_ID, "cols": PTY_DIM, "rows": PTY_DIM}, ("pty_id", "cols", "rows")
)
PTY_CLOSE = closed({"pty_id": PTY_ID}, ("pty_id",))
PTY_LIST = closed({"all": BOOL})  # all: every principal's PTYs (approvers only)

STORE_GC = closed(
    {
        "max_age_s": {
            "type": "number",
            "minimum": 0,
            "description": "prune values older than this",
        },
        "max_bytes": {
            "type": "integer",
            "minimum": 0,
            "description": "then prune the oldest until the blobs kept fit this size",
        },
        "dry_run": {"type": "boolean", "description": "report only (default true)"},
    }
)

SESSION_ADOPT = closed(
    {
        "principal": {
            "type": "string",
            "minLength": 1,
            "maxLength": 256,
            "description": "whose own cwd/env changes in this session to apply for everyone",
        }
    },
    ("principal",),
)

PARAMS: dict[str, dict] = {
    "kernel.status": NONE,
    "store.verify": NONE,
    "kernel.reload": NONE,
    "ping": NONE,
    "session.attach": SESSION_ATTACH,
    "session.cwd": NONE,
    "session.env": NONE,
    "session.reef": NONE,
    "session.adopt": SESSION_ADOPT,
    "parse": PARSE,
    "exec": EXEC,
    "explain": EXPLAIN,
    "plan.get": PLAN_GET,
    "plan.list": PLAN_LIST,
    "plan.apply": PLAN_APPLY,
    "cap.request": CAP_REQUEST,
    "cap.decide": CAP_DECIDE,
    "cap.ask": CAP_ASK,
    "cap.answer": CAP_ANSWER,
    "grants.list": NONE,
    "grants.revoke": GRANTS_REVOKE,
    "value.get": VALUE_GET,
    "blob.get": BLOB_GET,
    "task.list": TASK_LIST,
    "task.get": TASK_GET,
    "task.await": TASK_AWAIT,
    "task.cancel": TASK_CANCEL,
    "task.suspend": TASK_STEER,
    "task.resume": TASK_STEER,
    "events.read": EVENTS_READ,
    "events.publish": EVENTS_PUBLISH,
    "events.subscribe": EVENTS_SUBSCRIBE,
    "events.unsubscribe": EVENTS_UNSUBSCRIBE,
    "journal.query": JOURNAL_QUERY,
    "egress.query": EGRESS_QUERY,
    "egress.check": EGRESS_CHECK,
    "pty.open": PTY_OPEN,
    "pty.send": PTY_SEND,
    "pty.read": PTY_READ,
    "pty.resize": PTY_RESIZE,
    "pty.close": PTY_CLOSE,
    "pty.list": PTY_LIST,
    "store.gc": STORE_GC,
}
"""Every kernel method's params schema, by method name."""
