"""The 13 MCP tools: model-oriented descriptions over the kernel's own params.

Each tool is data: a name, title, description and annotations, the kernel method its
arguments go to, and its arguments. Every argument is a kernel param (of that method,
or of another one such as ``wait_ms`` → ``task.await``'s ``timeout_ms``): its schema is
the kernel's from ``protocol.params``, with the tool's description laid over it, so a
limit is stated once and a tool can never accept what the kernel refuses, or the other
way round. Arguments are validated with the same validator the kernel uses, so a bad
argument is a -32602 naming the field. The tools are listed in docs/protocol.md, "Tools".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocol.limits import (
    PTY_DEFAULT_COLS,
    PTY_DEFAULT_ROWS,
    PTY_MAX_DIM,
    PTY_MIN_DIM,
    PTY_SCROLLBACK_LINES,
)
from ..protocol.params import PARAMS
from ..protocol.schema import closed
from .versions import LATEST, Revision


@dataclass(frozen=True, slots=True)
class Arg:
    """A tool argument: which kernel param it is, and how the tool describes it."""

    description: str | None = None  # None: the kernel's own description, if any
    method: str | None = None  # the kernel method it belongs to, when not the tool's
    param: str | None = None  # its name there, when it differs


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    method: str  # the kernel method the arguments go to
    args: dict[str, Arg | str]  # in listing order; a str is just a description
    annotations: dict = field(default_factory=dict)
    required: tuple[str, ...] | None = None  # None: those the kernel requires
    defaults: dict = field(default_factory=dict)  # kernel params the arguments may override
    fixed: dict = field(default_factory=dict)  # kernel params the arguments cannot set
    cancels_task: bool = False  # an in-flight call owns a kernel task (exec/apply)
    task_support: bool = False  # 2025-11-25: may be called as a task (runs as a kernel task)
    schema: dict = field(init=False)  # what tools/list advertises: one type per property
    accepts: dict = field(init=False)  # what is validated: the kernel's own (wider) forms

    def __post_init__(self) -> None:
        object.__setattr__(self, "accepts", self._derive_schema(advertised=False))
        object.__setattr__(self, "schema", self._derive_schema(advertised=True))

    def arg(self, name: str) -> Arg:
        arg = self.args[name]
        return Arg(arg) if isinstance(arg, str) else arg

    def source(self, name: str) -> tuple[str, str]:
        """(kernel method, param) that argument ``name`` is."""
        arg = self.arg(name)
        return arg.method or self.method, arg.param or name

    def _derive_schema(self, advertised: bool) -> dict:
        properties = {}
        for name in self.args:
            method, param = self.source(name)
            prop = dict(PARAMS[method]["properties"][param])
            if advertised and not isinstance(prop.get("type"), str):
                kept = {k: prop[k] for k in ("description",) if k in prop}
                prop = {**SINGLE_TYPED[(method, param)], **kept}
            if (description := self.arg(name).description) is not None:
                prop["description"] = description
            properties[name] = prop
        required = self.required
        if required is None:
            kernel_required = PARAMS[self.method].get("required", ())
            required = tuple(
                n
                for n in self.args
                if self.source(n) in {(self.method, r) for r in kernel_required}
            )
        return closed(properties, required)

    def to_kernel(self, args: dict) -> tuple[str, dict]:
        """(kernel method, params) for validated arguments, under their kernel names."""
        params = {self.source(name)[1]: value for name, value in args.items()}
        return self.method, {**self.defaults, **params, **self.fixed}

    def listing(self, rev: Revision = LATEST) -> dict:
        """This tool in ``tools/list``, with the fields ``rev`` defines."""
        out: dict[str, Any] = {"name": self.name}
        if rev.titles:
            out["title"] = self.title
        out["description"] = self.description
        out["inputSchema"] = self.schema
        if self.annotations and rev.tool_annotations:
            out["annotations"] = {"title": self.title, **self.annotations}
        if rev.tasks:
            out["execution"] = {"taskSupport": "optional" if self.task_support else "forbidden"}
        return out


# Properties whose kernel schema allows several JSON types are advertised with one (some
# clients send a value of a type-less property as a string; single-type schema dialects
# reject type arrays). The kernel's wider forms are still accepted.
SINGLE_TYPED: dict[tuple[str, str], dict] = {
    ("value.get", "slice"): {"type": "string"},
    # the object form (a bare regex string is also accepted)
    ("value.get", "match"): next(
        f for f in PARAMS["value.get"]["properties"]["match"]["anyOf"] if f["type"] == "object"
    ),
    ("task.cancel", "task"): {"type": "string"},
    ("pty.send", "input"): {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "key": {"type": "string"},
                "bytes": {"type": "string"},
            },
            "additionalProperties": False,
        },
    },
}

REF_DESC = (
    "A ref: out:N, task:N, plan:<hex>, a shoal:// URI from an earlier result, or outputs "
    "(with match: search every stored output of this session)."
)
PATH_DESC = (
    "Selector into the value: .field, [i], [a..b] (half-open, negative counts from the end), "
    '["key"]; on text: .lines (list of lines) and .json (parse). Examples: .out.lines[-20..], '
    ".out.json.items[0].name, .err"
)
SLICE_DESC = (
    "'a..b' (half-open; either end may be left out; negative counts from the end), applied "
    "after path: list items, string code points or bytes."
)
MATCH_DESC = (
    'Search instead of paging: a regex (e.g. "FAILED|Error") or {regex, context (lines around), '
    "ignore_case, invert, max, from_line}. Returns matching lines with 1-based line numbers, the "
    "exact total, and the call for more. Searches stdout of an exec result unless path selects "
    "another text (.err, .out.lines[a..b])."
)
PTY_ID_DESC = "pty:N from shoal_pty_open"
KEY_INPUT_DESC = (
    "What to type, in order: [{text: 'ls -l'}, {key: 'Enter'}]. Items: {text}, {key} (Enter, Tab, "
    "Escape, Backspace, Delete, Space, Up, Down, Left, Right, Home, End, PageUp, PageDown, F1-F12, "
    "Ctrl-A..Ctrl-Z), {bytes: base64}. A plain string is also accepted."
)

TOOLS: list[Tool] = [
    Tool(
        "shoal_exec",
        "Run bash",
        "Run bash source in this session's shell (cwd and exported env persist across calls). "
        "Output of any size is stored; you get a bounded preview: the first and last lines plus a ref "
        "(out:N) and a shoal:// URI. Drill in with shoal_get (match to find lines, path "
        ".out.lines[-50..] for pages) instead of re-running; $SHOAL_OUT/N/out and /err are earlier "
        'outputs as read-only files (grep -c ERROR "$SHOAL_OUT/3/out"). Long jobs: background:true returns task:N at once; timeout_ms is a '
        "wait budget (the command keeps running as a task). Failed commands return their outcome "
        "(status, stderr) unless position is 'stmt'.",
        "exec",
        {
            "command": Arg("bash source, run with bash --noprofile --norc -c", param="src"),
            "mode": "plan = analyse only, run nothing",
            "position": "value (default): failures are values; stmt: failures are errors",
            "background": "return task:N immediately",
            "timeout_ms": "wait budget; never kills",
            "elide": Arg(),
        },
        {"destructiveHint": True, "openWorldHint": True},
        defaults={"position": "value"},
        cancels_task=True,
        task_support=True,
    ),
    Tool(
        "shoal_plan",
        "Plan a command",
        "Analyse bash without running it: the effects it would have (processes, files read/written/"
        "deleted, network, env), how reversible it is, and the policy verdict. Returns a plan_ref to "
        "pass to shoal_apply (or shoal_cap_request when approval is needed).",
        "exec",
        {"command": Arg("bash source to analyse", param="src")},
        {"readOnlyHint": True},
        fixed={"mode": "plan", "position": "value"},
    ),
    Tool(
        "shoal_apply",
        "Apply a plan",
        "Run exactly the source stored in a plan you made, once it is allowed or approved. Returns "
        "what shoal_exec returns.",
        "plan.apply",
        {"plan_ref": "plan:<hex> from shoal_plan"},
        {"destructiveHint": True, "openWorldHint": True},
        fixed={"position": "value"},
        cancels_task=True,
    ),
    Tool(  # run by ToolRunner.get: refs to tasks and plans go to task.*/plan.get
        "shoal_get",
        "Get a stored value",
        "Read a stored result without re-running anything. ref: out:N, task:N (wait_ms waits), "
        "plan:<hex>, or any shoal:// URI from a hint (its query counts).\n"
        '- Find lines: match:"FAILED|error" gives matching lines with line numbers and the exact '
        "total (context:N for lines around, ignore_case, invert). Prefer it to paging.\n"
        "- Pages: path .out.lines[1000..2000] returns those lines as text, up to 64 KiB, and names "
        "the next page; previews name the exact call for what they leave out.\n"
        "- JSON: path .out.json.items[3].name; a large JSON output's preview shows its keys, types "
        "and these paths.\n"
        "- format raw: exact bytes in pages (offset/length, follow next). In shoal_exec, "
        "$SHOAL_OUT/N/out and /err are earlier outputs as files (grep, jq, diff them).\n"
        '- Which run printed X? ref "outputs" with match searches every stored output, newest '
        "first: hits with out:N, line and the run's command and exit status (filters: since, "
        "until, ok, stream, session; cursor continues).",
        "value.get",
        {
            "ref": REF_DESC,
            "path": PATH_DESC,
            "slice": SLICE_DESC,
            "format": "json (default, tagged values), render (text), raw (paged bytes)",
            "offset": "raw: byte offset",
            "length": "raw: page size in bytes; larger asks get what fits the 64 KiB bound (follow next)",
            "elide": Arg(),
            "match": MATCH_DESC,
            "since": 'ref "outputs": outputs stored at or after this unix time',
            "until": 'ref "outputs": outputs stored at or before this unix time',
            "ok": 'ref "outputs": only runs that succeeded (true) or failed (false)',
            "stream": 'ref "outputs": search only stdout (out) or stderr (err)',
            "session": 'ref "outputs": another session of yours, or "all" (default: this one)',
            "cursor": 'ref "outputs": the cursor of the previous reply, to continue',
            "wait_ms": Arg(
                "for task:N, wait up to this long for it to finish",
                method="task.await",
                param="timeout_ms",
            ),
        },
        {"readOnlyHint": True},
    ),
    Tool(
        "shoal_journal",
        "Read the journal",
        "What was run: newest first, one row per exec/plan/apply with time, duration, cwd, source, "
        "status and output refs. Filter by time (unix seconds), principal, first command word "
        "(head), ok, or effect kinds.",
        "journal.query",
        {
            "since": "unix time, inclusive",
            "until": "unix time, inclusive",
            "principal": "who ran it, e.g. uid:1000 or a token's principal",
            "ok": "true: only what succeeded; false: only failures",
            "effects": "effect kinds, e.g. fs_delete",
            "head": "first command word, e.g. git",
            "limit": "most rows to return, newest first",
        },
        {"readOnlyHint": True},
    ),
    Tool(
        "shoal_cancel",
        "Cancel a task",
        "Stop a running task (SIGTERM to its process group, SIGKILL after a grace period).",
        "task.cancel",
        {"task": "task:N"},
        {"destructiveHint": True},
        required=("task",),  # the kernel's other form (call: an exec in flight) is not a tool's
    ),
    Tool(
        "shoal_cap_request",
        "Request approval",
        "Ask a human to approve a plan whose verdict is 'ask'. You cannot approve your own plan; poll "
        "shoal_get plan:<hex> (state) and call shoal_apply once approved.",
        "cap.request",
        {"plan_ref": "plan:<hex> from shoal_plan", "effects": "effect kinds you need"},
    ),
    Tool(
        "shoal_pty_open",
        "Open a terminal",
        "Start an interactive program (REPL, TUI, ssh, debugger) on a pseudoterminal. Returns pty:N. "
        "Type with shoal_pty_send, look with shoal_pty_read (the rendered screen).",
        "pty.open",
        {
            "cmd": "program, e.g. python3 or bash",
            "args": "its arguments",
            "cols": f"width in columns (default {PTY_DEFAULT_COLS})",
            "rows": f"height in rows (default {PTY_DEFAULT_ROWS})",
            "env": "extra environment variables for the program",
        },
        {"openWorldHint": True},
    ),
    Tool(
        "shoal_pty_send",
        "Type into a terminal",
        "Send keystrokes to a PTY. Text is typed as is; add {key:'Enter'} to submit.",
        "pty.send",
        {"pty_id": PTY_ID_DESC, "input": KEY_INPUT_DESC},
    ),
    Tool(
        "shoal_pty_read",
        "Read a terminal screen",
        "The rendered screen (rows, right-trimmed), cursor, whether it changed since your last read, and "
        "whether the program is alive (exit status when not). scrollback: lines above the screen.",
        "pty.read",
        {
            "pty_id": PTY_ID_DESC,
            "scrollback": f"lines above the screen to include (at most {PTY_SCROLLBACK_LINES} are kept)",
        },
        {"readOnlyHint": True},
    ),
    Tool(
        "shoal_pty_resize",
        "Resize a terminal",
        f"Change a PTY's size ({PTY_MIN_DIM}..{PTY_MAX_DIM} each); the program receives SIGWINCH.",
        "pty.resize",
        {"pty_id": PTY_ID_DESC, "cols": "width in columns", "rows": "height in rows"},
    ),
    Tool(
        "shoal_pty_close",
        "Close a terminal",
        "End a PTY's program (SIGHUP, then SIGKILL) and free it.",
        "pty.close",
        {"pty_id": PTY_ID_DESC},
        {"destructiveHint": True},
    ),
    Tool(
        "shoal_pty_list",
        "List terminals",
        "Your open PTYs with their programs and sizes.",
        "pty.list",
        {},
        {"readOnlyHint": True},
    ),
]

TOOLS_BY_NAME = {t.name: t for t in TOOLS}
