"""The 13 MCP tools: closed schemas, model-oriented descriptions, kernel mapping.

The mapping is documented in docs/protocol.md, Tools.

Each tool is data (name, title, description, schema, annotations) plus a function that
turns validated arguments into kernel calls. Schemas are validated with the same
validator the kernel uses, so a bad argument is a -32602 naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..kernel.values.elision import ELIDE_SCHEMA
from ..protocol.limits import PTY_MAX_DIM, PTY_MIN_DIM

STR = {"type": "string"}
INT = {"type": "integer"}


def closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    schema: dict = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


REF_DESC = "A ref: out:N, task:N, plan:<hex>, or a shoal:// URI from an earlier result."
PATH_DESC = (
    "Selector into the value: .field, [i], [a..b] (half-open, negative counts from the end), "
    '["key"]; on text: .lines (list of lines) and .json (parse). Examples: .out.lines[-20..], '
    ".out.json.items[0].name, .err"
)
SLICE_SCHEMA = {
    "type": "array",
    "items": {"type": ["integer", "null"]},
    "minItems": 2,
    "maxItems": 2,
    "description": "[a, b] applied after path: list items, string code points or bytes; null = open end.",
}
DIM = {"type": "integer", "minimum": PTY_MIN_DIM, "maximum": PTY_MAX_DIM}
PTY_ID = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "description": "pty:N from shoal_pty_open",
}
KEY_INPUT = {
    "description": (
        "What to type: a string, {text}, {key} (Enter, Tab, Escape, Backspace, Delete, Space, Up, Down, "
        "Left, Right, Home, End, PageUp, PageDown, F1-F12, Ctrl-A..Ctrl-Z), {bytes: base64}, or an array of these."
    ),
    "anyOf": [
        {"type": "string"},
        {"type": "object"},
        {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
    ],
}


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    schema: dict
    annotations: dict = field(default_factory=dict)
    # (arguments) -> (kernel method, kernel params); shoal_get overrides with custom logic.
    to_kernel: Callable[[dict], tuple[str, dict]] | None = None
    cancels_task: bool = False  # an in-flight call owns a kernel task (exec/apply)

    def listing(self) -> dict:
        out = {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.schema,
        }
        if self.annotations:
            out["annotations"] = {"title": self.title, **self.annotations}
        return out


def _same(method: str, **fixed: Any) -> Callable[[dict], tuple[str, dict]]:
    return lambda args: (method, {**args, **fixed})


def _exec(args: dict) -> tuple[str, dict]:
    return "exec", {"position": "value", **args}


TOOLS: list[Tool] = [
    Tool(
        "shoal_exec",
        "Run bash",
        "Run bash source in this session's shell (cwd and exported env persist across calls). "
        "Output of any size is stored; you get a bounded preview: the first and last lines plus a ref "
        "(out:N) and a shoal:// URI. Drill in with shoal_get (e.g. path .out.lines[-50..]) instead of "
        "re-running with head/tail. Long jobs: background:true returns task:N at once; timeout_ms is a "
        "wait budget (the command keeps running as a task). Failed commands return their outcome "
        "(status, stderr) unless position is 'stmt'.",
        closed(
            {
                "src": {
                    "type": "string",
                    "description": "bash source, run with bash --noprofile --norc -c",
                },
                "mode": {
                    "type": "string",
                    "enum": ["run", "plan"],
                    "description": "plan = analyse only, run nothing",
                },
                "position": {
                    "type": "string",
                    "enum": ["value", "stmt"],
                    "description": "value (default): failures are values; stmt: failures are errors",
                },
                "background": {"type": "boolean", "description": "return task:N immediately"},
                "timeout_ms": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "wait budget; never kills",
                },
                "elide": ELIDE_SCHEMA,
            },
            ("src",),
        ),
        {"destructiveHint": True, "openWorldHint": True},
        _exec,
        cancels_task=True,
    ),
    Tool(
        "shoal_plan",
        "Plan a command",
        "Analyse bash without running it: the effects it would have (processes, files read/written/"
        "deleted, network, env), how reversible it is, and the policy verdict. Returns a plan_ref to "
        "pass to shoal_apply (or shoal_cap_request when approval is needed).",
        closed({"src": {"type": "string", "description": "bash source to analyse"}}, ("src",)),
        {"readOnlyHint": True},
        lambda args: ("exec", {"src": args["src"], "mode": "plan", "position": "value"}),
    ),
    Tool(
        "shoal_apply",
        "Apply a plan",
        "Run exactly the source stored in a plan you made, once it is allowed or approved. Returns "
        "what shoal_exec returns.",
        closed(
            {"plan_ref": {"type": "string", "description": "plan:<hex> from shoal_plan"}},
            ("plan_ref",),
        ),
        {"destructiveHint": True, "openWorldHint": True},
        lambda args: ("plan.apply", {**args, "position": "value"}),
        cancels_task=True,
    ),
    Tool(
        "shoal_get",
        "Get a stored value",
        "Fetch a stored result or part of it, bounded. ref is out:N, task:N (its record, or its result "
        "once finished; wait_ms waits for it), plan:<hex>, or a shoal:// URI. path selects inside "
        "(.out.lines[-20..], .err, .out.json.key, [3]); slice cuts the selection; format raw returns "
        "exact bytes in pages (offset/length, next).",
        closed(
            {
                "ref": {"type": "string", "description": REF_DESC},
                "path": {"type": "string", "description": PATH_DESC},
                "slice": SLICE_SCHEMA,
                "format": {
                    "type": "string",
                    "enum": ["json", "render", "raw"],
                    "description": "json (default, tagged values), render (text), raw (paged bytes)",
                },
                "offset": {"type": "integer", "minimum": 0, "description": "raw: byte offset"},
                "length": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 65536,
                    "description": "raw: page size",
                },
                "elide": ELIDE_SCHEMA,
                "wait_ms": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 600000,
                    "description": "for task:N, wait up to this long for it to finish",
                },
            },
            ("ref",),
        ),
        {"readOnlyHint": True},
    ),
    Tool(
        "shoal_journal",
        "Read the journal",
        "What was run: newest first, one row per exec/plan/apply with time, duration, cwd, source, "
        "status and output refs. Filter by time (unix seconds), principal, first command word "
        "(head), ok, or effect kinds.",
        closed(
            {
                "since": {"type": "number", "description": "unix time, inclusive"},
                "until": {"type": "number", "description": "unix time, inclusive"},
                "principal": STR,
                "ok": {"type": "boolean"},
                "effects": {
                    "type": "array",
                    "items": STR,
                    "description": "effect kinds, e.g. fs_delete",
                },
                "head": {"type": "string", "description": "first command word, e.g. git"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
            }
        ),
        {"readOnlyHint": True},
        _same("journal.query"),
    ),
    Tool(
        "shoal_cancel",
        "Cancel a task",
        "Stop a running task (SIGTERM to its process group, SIGKILL after a grace period).",
        closed({"task": {"type": "string", "description": "task:N"}}, ("task",)),
        {"destructiveHint": True},
        _same("task.cancel"),
    ),
    Tool(
        "shoal_cap_request",
        "Request approval",
        "Ask a human to approve a plan whose verdict is 'ask'. You cannot approve your own plan; poll "
        "shoal_get plan:<hex> (state) and call shoal_apply once approved.",
        closed(
            {
                "plan_ref": STR,
                "effects": {"type": "array", "items": STR, "description": "effect kinds you need"},
            },
            ("plan_ref",),
        ),
        {},
        _same("cap.request"),
    ),
    Tool(
        "shoal_pty_open",
        "Open a terminal",
        "Start an interactive program (REPL, TUI, ssh, debugger) on a pseudoterminal. Returns pty:N. "
        "Type with shoal_pty_send, look with shoal_pty_read (the rendered screen).",
        closed(
            {
                "cmd": {"type": "string", "description": "program, e.g. python3 or bash"},
                "args": {"type": "array", "items": STR},
                "cols": DIM,
                "rows": DIM,
                "env": {"type": "object", "additionalProperties": STR},
            },
            ("cmd",),
        ),
        {"openWorldHint": True},
        _same("pty.open"),
    ),
    Tool(
        "shoal_pty_send",
        "Type into a terminal",
        "Send keystrokes to a PTY. Text is typed as is; add {key:'Enter'} to submit.",
        closed({"pty_id": PTY_ID, "input": KEY_INPUT}, ("pty_id", "input")),
        {},
        _same("pty.send"),
    ),
    Tool(
        "shoal_pty_read",
        "Read a terminal screen",
        "The rendered screen (rows, right-trimmed), cursor, whether it changed since your last read, and "
        "whether the program is alive (exit status when not). scrollback: lines above the screen.",
        closed(
            {"pty_id": PTY_ID, "scrollback": {"type": "integer", "minimum": 0, "maximum": 10000}},
            ("pty_id",),
        ),
        {"readOnlyHint": True},
        _same("pty.read"),
    ),
    Tool(
        "shoal_pty_resize",
        "Resize a terminal",
        "Change a PTY's size (1..1000 each); the program receives SIGWINCH.",
        closed({"pty_id": PTY_ID, "cols": DIM, "rows": DIM}, ("pty_id", "cols", "rows")),
        {},
        _same("pty.resize"),
    ),
    Tool(
        "shoal_pty_close",
        "Close a terminal",
        "End a PTY's program (SIGHUP, then SIGKILL) and free it.",
        closed({"pty_id": PTY_ID}, ("pty_id",)),
        {"destructiveHint": True},
        _same("pty.close"),
    ),
    Tool(
        "shoal_pty_list",
        "List terminals",
        "Your open PTYs with their programs and sizes.",
        closed({}),
        {"readOnlyHint": True},
        _same("pty.list"),
    ),
]

TOOLS_BY_NAME = {t.name: t for t in TOOLS}
