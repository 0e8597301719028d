"""Day-to-day commands: exec, get, tasks, journal, events, plans/approve/deny."""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import NoReturn

import click
import orjson

from ..protocol.display import escape_controls
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.plain import dumps, to_plain
from .common import (
    EXIT_KERNEL_ERROR,
    EXIT_SHOAL_ERROR,
    EXIT_STILL_RUNNING,
    Ctx,
    command_exit_codes,
    fail,
    pass_ctx,
)
from .exec_cmd import exit_status, write_preview
from .gc_cmd import parse_duration
from .output import emit_json, state_colour, style, table, when
from .streams import cli_hints, copy_raw, lines_to_slice, next_page, stdout_bytes


@click.command("get")
@click.argument("ref")
@click.option("--path", "path", default=None, help="selector, e.g. .out.lines[-3..] or .err")
@click.option(
    "--lines",
    "line_range",
    default=None,
    help="A..B: lines A to B of stdout (of --path's text), from 1, inclusive; -1 is the last",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "render", "raw"]),
    default="render",
    show_default=True,
    help="render: text for people; json: plain JSON; raw: the bytes themselves, all of them",
)
@click.option("--wire", is_flag=True, help="json: the kernel's tagged wire form, not plain JSON")
@click.option(
    "--match", "regex", default=None, help="REGEX: the matching lines, numbered (grep-like)"
)
@click.option("-i", "--ignore-case", is_flag=True, help="match: ignore case")
@click.option("-v", "--invert", is_flag=True, help="match: the lines that do not match")
@click.option("-C", "--context", type=int, default=0, help="match: lines of context around each")
@click.option("--from-line", type=int, default=None, help="match: start at this line (from 1)")
@click.option("--max", "max_matches", type=int, default=None, help="match: at most N matches")
@click.option("--offset", type=int, default=None, help="raw: byte offset")
@click.option("--length", type=int, default=None, help="raw: at most N bytes (default: to the end)")
@pass_ctx
def get_cmd(
    ctx: Ctx,
    ref: str,
    path: str | None,
    line_range: str | None,
    fmt: str,
    wire: bool,
    regex: str | None,
    ignore_case: bool,
    invert: bool,
    context: int,
    from_line: int | None,
    max_matches: int | None,
    offset: int | None,
    length: int | None,
) -> None:
    """Fetch a stored value (out:N, task:N, shoal://…) or a part of it.

    Lines are numbered from 1 here as in every preview and match result (``--lines
    11..20`` is what a preview calls "lines 11-20"). ``--lines`` and ``--format raw``
    write all that was asked, paging through the kernel; ``--length`` bounds raw.
    """
    if line_range is not None:
        base = path if path else (".out" if _is_outcome_ref(ref) else "")
        try:
            path = f"{base}.lines[{lines_to_slice(line_range)}]"
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    if fmt == "raw":
        raw_path = path if path else (".out" if _is_outcome_ref(ref) else "")
        try:
            copy_raw(ctx.client().call, ref, raw_path, stdout_bytes(), offset or 0, length)
        except RpcError as exc:
            _fail_removed(ctx, ref, exc)
        return
    params: dict = {"ref": ref, "format": fmt}
    if path:
        params["path"] = path
    if regex is not None:
        params["match"] = {
            "regex": regex,
            "ignore_case": ignore_case,
            "invert": invert,
            "context": context,
            **({"from_line": from_line} if from_line else {}),
            **({"max": max_matches} if max_matches else {}),
        }
    if offset is not None:
        params["offset"] = offset
    if length is not None:
        params["length"] = length
    try:
        result = ctx.client().call("value.get", params)
    except RpcError as exc:
        _fail_removed(ctx, ref, exc)
    if fmt == "render" or regex is not None:
        _check_removed(result.get("render", ""))
        if line_range is not None and regex is None:
            _write_pages(ctx, result["render"])
        else:
            text = cli_hints(result["render"])
            click.echo(text, nl=not text.endswith("\n"))
    else:
        _check_removed_value(result.get("value"))
        click.echo(dumps(result["value"] if wire else to_plain(result["value"])))
    _say_where(ref, result)


def _write_pages(ctx: Ctx, render: str) -> None:
    """A ``--lines`` render and every next page the kernel names, to the end."""
    while True:
        text, following = next_page(render)
        click.echo(text, nl=not text.endswith("\n"))
        if following is None:
            return
        render = ctx.call("value.get", {**following, "format": "render"})["render"]


def _tombstone(ctx: Ctx, ref: str) -> dict | None:
    """The record ``shoal gc`` left in place of ``ref``'s value, if it was pruned."""
    try:
        value = ctx.client().call("value.get", {"ref": ref, "format": "json"}).get("value")
    except RpcError:
        return None
    return value if isinstance(value, dict) and value.get("$") == "error" else None


def _fail_removed(ctx: Ctx, ref: str, exc: RpcError) -> NoReturn:
    """A selection that failed on a pruned output says it was pruned, not "no field"."""
    removed = _tombstone(ctx, ref) if exc.code == ErrorCode.BAD_SELECTION else None
    if removed is not None:
        _removed(removed)
    ctx.fail(exc)


def _check_removed(render: str) -> None:
    if render.startswith("{") and '"$": "error"' in render[:40]:
        try:
            value = orjson.loads(render)
        except orjson.JSONDecodeError:
            return
        _check_removed_value(value)


def _check_removed_value(value: object) -> None:
    if isinstance(value, dict) and value.get("$") == "error":
        _removed(value)


def _removed(value: dict) -> NoReturn:
    message = value.get("msg") or value.get("message") or "the value is an error"
    hint = value.get("hint")
    click.echo(
        f"shoal: error {value.get('code')}: {message}" + (f" ({hint})" if hint else ""), err=True
    )
    sys.exit(EXIT_KERNEL_ERROR)


def _is_outcome_ref(ref: str) -> bool:
    return bool(re.fullmatch(r"(out|task):\d+|shoal://(out|task)/\d+", ref.strip()))


def _say_where(ref: str, result: dict) -> None:
    """``task:5`` shows ``out:6``: say so, since ``out:5`` is another command."""
    shown = result.get("ref")
    if shown and ref.strip().startswith("task:") and shown != ref.strip():
        click.echo(style(f"── {ref.strip()}'s result is {shown}", dim=True), err=True)


# -- tasks -----------------------------------------------------------------------------


@click.group("tasks", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def tasks_group(click_ctx: click.Context, as_json: bool) -> None:
    """List this session's tasks (subcommands: show, cancel, wait)."""
    if click_ctx.invoked_subcommand is not None:
        return
    tasks = click_ctx.obj.call_paged("task.list", {}, "tasks")
    if as_json:
        emit_json(tasks)
        return
    table(
        [
            [
                t["task"],
                state_colour(t["state"]),
                when(t["started"]),
                t.get("out_bytes"),
                t.get("result_ref"),
                t["src"],
            ]
            for t in tasks
        ],
        ["TASK", "STATE", "STARTED", "OUT", "RESULT", "SRC"],
    )


@tasks_group.command("show")
@click.argument("task")
@pass_ctx
def tasks_show(ctx: Ctx, task: str) -> None:
    """Show one task's record."""
    emit_json(ctx.call("task.get", {"task": task}))


@tasks_group.command("cancel")
@click.argument("task")
@pass_ctx
def tasks_cancel(ctx: Ctx, task: str) -> None:
    """Cancel a running task (SIGTERM, then SIGKILL)."""
    result = ctx.call("task.cancel", {"task": task})
    click.echo(f"{result['task']}: {state_colour(result['state'])}")


@tasks_group.command("wait")
@click.argument("task")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="seconds")
@pass_ctx
def tasks_wait(ctx: Ctx, task: str, timeout: float) -> None:
    """Wait for a task and print its output; exit with its status like `shoal exec`
    (124 when it is still running at the timeout, 125 when shoal failed)."""
    command_exit_codes()
    record = ctx.call("task.await", {"task": task, "timeout_ms": int(timeout * 1000)})
    if not record.get("done"):
        click.echo(f"{record['task']} still {record['state']}", err=True)
        sys.exit(EXIT_STILL_RUNNING)
    if "result_ref" not in record:
        click.echo(f"{record['task']} {record['state']}: {record.get('error')}", err=True)
        sys.exit(EXIT_SHOAL_ERROR)
    result = ctx.call("value.get", {"ref": record["result_ref"], "format": "json"})
    write_preview(ctx.call, {"ref": record["result_ref"], "value": result["value"]})
    click.echo(
        style(f"── {record['task']} {record['state']}: result {record['result_ref']}", dim=True),
        err=True,
    )
    sys.exit(exit_status(result["value"]))


# -- journal and events -----------------------------------------------------------------------


def _time_arg(text: str | None) -> float | None:
    """``--since``/``--until``: a duration back from now (``5m``, ``2h``, ``7d``, as
    ``shoal gc`` takes) or a unix time (a number past a year of seconds)."""
    if text is None:
        return None
    try:
        number = float(text)
    except ValueError:
        return time.time() - parse_duration(text)
    return number if number > UNIX_TIME_FLOOR else time.time() - number


UNIX_TIME_FLOOR = 365 * 86400.0
"""A bare number above this is a unix time; below it, seconds back from now."""


@click.command("journal")
@click.option("--since", help="rows from this long ago (5m, 2h, 7d) or this unix time")
@click.option("--until", help="rows until this long ago (5m, 2h) or this unix time")
@click.option("--principal")
@click.option(
    "--session", "session_filter", help="only this session's rows (see the SESSION column)"
)
@click.option("--head", help="first command word")
@click.option("--ok/--failed", "ok", default=None)
@click.option("--effect", "effects", multiple=True, help="effect kind (repeatable)")
@click.option(
    "-n", "--limit", "limit", type=int, default=20, show_default=True, help="the newest N rows"
)
@click.option("--follow", "-f", is_flag=True, help="keep printing new rows")
@click.option("--json", "as_json", is_flag=True, help="a JSON array (with -f: one object a line)")
@pass_ctx
def journal_cmd(
    ctx: Ctx, since, until, principal, session_filter, head, ok, effects, limit, follow, as_json
) -> None:
    """What ran: the newest N rows (-n), printed oldest first like a log (the newest
    last, where --follow appends), with filters."""
    params = {
        k: v
        for k, v in {
            "since": _time_arg(since),
            "until": _time_arg(until),
            "principal": principal,
            "session": session_filter,
            "head": head,
            "ok": ok,
            "limit": limit,
        }.items()
        if v is not None
    }
    if effects:
        params["effects"] = list(effects)
    rows = list(reversed(ctx.call_paged("journal.query", params, "rows", limit)))
    if as_json and not follow:
        emit_json(rows)
        return
    widths = _print_rows(rows, as_json)
    if not follow:
        return
    last_id = max((r["id"] for r in rows), default=0)
    wake = threading.Event()
    ctx.client(on_event=lambda e: wake.set()).call("events.subscribe", {"channel": "journal"})
    try:
        while True:
            wake.wait(1.0)
            wake.clear()
            new = ctx.call("journal.query", {**params, "limit": 1000})["rows"]
            new = [r for r in reversed(new) if r["id"] > last_id]
            if new:
                last_id = new[-1]["id"]
                widths = _print_rows(new, as_json, widths)
    except KeyboardInterrupt:
        return


JOURNAL_HEADERS = ["ID", "TIME", "SESSION", "PRINCIPAL", "KIND", "EXIT", "DUR", "REF", "CWD", "SRC"]
JOURNAL_MIN_WIDTHS = [5, 19, 12, 9, 4, 4, 7, 8, 10, 0]
"""Columns at least this wide, so rows ``-f`` appends later line up with the first ones."""


def _print_rows(rows: list[dict], as_json: bool, widths: list[int] | None = None) -> list[int]:
    """Print rows (a header first when ``widths`` is None); the column widths used, which
    the next call (``--follow``) keeps so its rows stay aligned."""
    if as_json:
        for row in rows:
            click.echo(orjson.dumps(row).decode())  # one object a line: a stream
        return widths or []
    table_rows = [
        [
            r["id"],
            when(r["ts"]),
            r.get("session"),
            r["principal"],
            r.get("kind"),
            r.get("status"),
            f"{r.get('duration_ms', 0) or 0:.0f}ms",
            r.get("ref"),
            r.get("cwd"),
            # a long source is journaled by hash: its length first, then its head
            (f"[{r['src_len']} chars] " if "src_len" in r else "") + r["src"],
        ]
        for r in rows
    ]
    if widths is None:
        widths = table(table_rows, JOURNAL_HEADERS, min_widths=JOURNAL_MIN_WIDTHS)
        return widths
    table(table_rows, JOURNAL_HEADERS, min_widths=widths, header=False)
    return widths


@click.group("events")
def events_group() -> None:
    """Read event channels."""


@events_group.command("tail")
@click.argument("channel")
@click.option("--since", type=int, default=None, help="replay events after this seq")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def events_tail(ctx: Ctx, channel: str, since: int | None, as_json: bool) -> None:
    """Print events of CHANNEL as they arrive (Ctrl-C stops)."""

    def show(event: dict) -> None:
        if as_json:
            emit_json(event)
        else:
            payload = orjson.dumps(event.get("payload"), option=orjson.OPT_NON_STR_KEYS).decode()
            click.echo(f"{event.get('seq')}  {when(event.get('ts'))}  {escape_controls(payload)}")

    params: dict = {"channel": channel}
    if since is not None:
        params["since"] = since
    client = ctx.client(on_event=show)
    try:
        client.call("events.subscribe", params)
    except RpcError as exc:
        fail(exc)
    try:
        while not client.closed.wait(1.0):
            pass
    except KeyboardInterrupt:
        return


# -- plans and approvals -------------------------------------------------------------------------


@click.command("plans")
@click.option(
    "--all", "show_all", is_flag=True, help="every state, not only those awaiting a decision"
)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def plans_cmd(ctx: Ctx, show_all: bool, as_json: bool) -> None:
    """Plans awaiting approval (requested first)."""
    plans = ctx.call_paged("plan.list", {"all": True}, "plans")
    if not show_all:
        plans = [p for p in plans if p["state"] in ("requested", "pending")]
    plans.sort(key=lambda p: (p["state"] != "requested", p["created"]))
    if as_json:
        emit_json(plans)
        return
    # One block per plan, never a table cell: the whole source with its control
    # characters escaped by the kernel (src_display), and every effect with its target.
    for p in plans:
        click.echo(f"{p['plan_ref']}  {state_colour(p['state'])}  {p['principal']}  {p['verdict']}")
        click.echo(f"  cwd: {escape_controls(p['cwd'])}  env: {p.get('env_hash', '?')}")
        click.echo(f"  src: {p.get('src_display') or escape_controls(p['src'])}")
        for e in p["effects"]:
            click.echo(f"    {e['kind']} {escape_controls(str(e.get('target', '')))}")


@click.command("approve")
@click.argument("plan")
@click.option(
    "--effects", help="comma-separated effect kinds to approve (default: all of the plan's)"
)
@pass_ctx
def approve_cmd(ctx: Ctx, plan: str, effects: str | None) -> None:
    """Approve PLAN, its ref or a unique prefix of it (you must be an approver)."""
    params: dict = {"plan_ref": _plan_ref(ctx, plan), "approve": True}
    if effects:
        params["effects"] = [e.strip() for e in effects.split(",") if e.strip()]
    result = ctx.call("cap.decide", params)
    click.echo(f"{result['plan_ref']}: {state_colour(result['state'])}")


@click.command("deny")
@click.argument("plan")
@pass_ctx
def deny_cmd(ctx: Ctx, plan: str) -> None:
    """Deny PLAN (its ref or a unique prefix); it stays denied."""
    result = ctx.call("cap.decide", {"plan_ref": _plan_ref(ctx, plan), "approve": False})
    click.echo(f"{result['plan_ref']}: {state_colour(result['state'])}")


def _plan_ref(ctx: Ctx, given: str) -> str:
    """The full plan ref ``given`` names: itself, or the one plan whose ref starts with it
    (as git takes a short hash); an ambiguous or unknown prefix is an error."""
    given = given.strip()
    plans = ctx.call_paged("plan.list", {"all": True}, "plans")
    refs = [p["plan_ref"] for p in plans]
    if given in refs:
        return given
    matches = [r for r in refs if r.startswith(given) or r.rpartition(":")[2].startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise click.UsageError(f"{given!r} names {len(matches)} plans: {', '.join(matches[:5])}")
    return given  # unknown here: the kernel says so
