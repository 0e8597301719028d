"""Day-to-day commands: exec, get, tasks, journal, events, plans/approve/deny."""

from __future__ import annotations

import re
import sys
import threading

import click

from ..protocol.display import escape_controls
from ..protocol.errors import RpcError
from ..protocol.plain import dumps, to_plain
from .common import EXIT_SHOAL_ERROR, EXIT_STILL_RUNNING, Ctx, command_exit_codes, fail, pass_ctx
from .exec_cmd import exit_status, write_preview
from .output import emit_json, state_colour, style, table, when
from .streams import cli_hints, copy_raw, page_bytes, stdout_bytes


@click.command("get")
@click.argument("ref")
@click.option("--path", "path", default=None, help="selector, e.g. .out.lines[-3..] or .err")
@click.option(
    "--lines",
    "line_range",
    default=None,
    help="A..B: those lines of stdout (of --path's text when given); negative counts from the end",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "render", "raw"]),
    default="render",
    show_default=True,
    help="render: text for people; json: plain JSON; raw: the bytes themselves",
)
@click.option("--wire", is_flag=True, help="json: the kernel's tagged wire form, not plain JSON")
@click.option(
    "--match", "regex", default=None, help="REGEX: the matching lines, numbered (grep-like)"
)
@click.option("-i", "--ignore-case", is_flag=True, help="match: ignore case")
@click.option("-v", "--invert", is_flag=True, help="match: the lines that do not match")
@click.option("-C", "--context", type=int, default=0, help="match: lines of context around each")
@click.option("--offset", type=int, default=None, help="raw: byte offset")
@click.option(
    "--length", type=int, default=None, help="raw: bytes to write (default: one page, 48 KiB)"
)
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
    offset: int | None,
    length: int | None,
) -> None:
    """Fetch a stored value (out:N, task:N, shoal://…) or a part of it.

    ``--format raw --length N`` writes up to N bytes, paging through the kernel; without
    ``--length`` one page is written and the next one named on stderr.
    """
    if line_range is not None:
        base = path if path else (".out" if _is_outcome_ref(ref) else "")
        path = f"{base}.lines[{line_range}]"
    if fmt == "raw" and length is not None:
        copy_raw(ctx.call, ref, path or "", stdout_bytes(), offset or 0, max(0, length))
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
        }
    if offset is not None:
        params["offset"] = offset
    if length is not None:
        params["length"] = length
    result = ctx.call("value.get", params)
    if fmt == "render" or regex is not None:
        text = cli_hints(result["render"])
        click.echo(text, nl=not text.endswith("\n"))
    elif fmt == "raw":
        out = stdout_bytes()
        out.write(page_bytes(result))
        out.flush()
        if "next" in result:
            more = f"--offset {result['offset'] + result['length']}"
            click.echo(style(f"── more: the same with {more}", dim=True), err=True)
    else:
        click.echo(dumps(result["value"] if wire else to_plain(result["value"])))
    _say_where(ref, result)


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


@click.command("journal")
@click.option("--since", type=float, help="unix time")
@click.option("--until", type=float, help="unix time")
@click.option("--principal")
@click.option("--head", help="first command word")
@click.option("--ok/--failed", "ok", default=None)
@click.option("--effect", "effects", multiple=True, help="effect kind (repeatable)")
@click.option(
    "-n", "--limit", "limit", type=int, default=20, show_default=True, help="the newest N rows"
)
@click.option("--follow", "-f", is_flag=True, help="keep printing new rows")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def journal_cmd(
    ctx: Ctx, since, until, principal, head, ok, effects, limit, follow, as_json
) -> None:
    """What ran: the newest N rows (-n), printed oldest first like a log (the newest
    last, where --follow appends), with filters."""
    params = {
        k: v
        for k, v in {
            "since": since,
            "until": until,
            "principal": principal,
            "head": head,
            "ok": ok,
            "limit": limit,
        }.items()
        if v is not None
    }
    if effects:
        params["effects"] = list(effects)
    rows = ctx.call_paged("journal.query", params, "rows", limit)
    _print_rows(list(reversed(rows)), as_json)
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
                _print_rows(new, as_json, header=False)
    except KeyboardInterrupt:
        return


def _print_rows(rows: list[dict], as_json: bool, header: bool = True) -> None:
    if as_json:
        for row in rows:
            emit_json(row)
        return
    table_rows = [
        [
            r["id"],
            when(r["ts"]),
            r["principal"],
            r.get("kind"),
            r.get("status"),
            f"{r.get('duration_ms', 0) or 0:.0f}ms",
            r.get("ref"),
            # a long source is journaled by hash: its length first, then its head
            (f"[{r['src_len']} chars] " if "src_len" in r else "") + r["src"],
        ]
        for r in rows
    ]
    if header:
        table(table_rows, ["ID", "TIME", "PRINCIPAL", "KIND", "EXIT", "DUR", "REF", "SRC"])
    else:
        for cells in table_rows:
            click.echo("  ".join("-" if v is None else escape_controls(str(v)) for v in cells))


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
            click.echo(f"{event.get('seq')}  {when(event.get('ts'))}  {event.get('payload')}")

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
        for e in p.get("requested", []):  # what the sandbox refused a run of it
            click.echo(f"    asks: {e['kind']}:{escape_controls(str(e.get('target', '')))}")
        if p.get("unconfined"):
            click.echo("    approved to run UNCONFINED, once")


@click.command("approve")
@click.argument("plan")
@click.option(
    "--effects", help="comma-separated effect kinds to approve (default: all of the plan's)"
)
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="KIND:TARGET",
    help="approve only this target (repeatable; as `shoal plans` lists them); the rest stay refused",
)
@click.option(
    "--session", "for_session", is_flag=True, help="keep the targets granted in the session"
)
@click.option(
    "--unconfined",
    is_flag=True,
    help="run it once WITHOUT the sandbox (the only way to approve an opaque plan)",
)
@pass_ctx
def approve_cmd(
    ctx: Ctx,
    plan: str,
    effects: str | None,
    only: tuple[str, ...],
    for_session: bool,
    unconfined: bool,
) -> None:
    """Approve PLAN (you must be an approver): its one apply may do exactly its targets."""
    params: dict = {"plan_ref": plan, "approve": True}
    if effects:
        params["effects"] = [e.strip() for e in effects.split(",") if e.strip()]
    if only:
        params["targets"] = list(only)
    if for_session:
        params["scope"] = "session"
    if unconfined:
        params["unconfined"] = True
    result = ctx.call("cap.decide", params)
    click.echo(f"{result['plan_ref']}: {state_colour(result['state'])}")


@click.command("grants")
@click.option("--revoke", "revoke", metavar="PRINCIPAL", help="take back its session grants")
@click.option("--target", metavar="PATH", help="with --revoke: only this path")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def grants_cmd(ctx: Ctx, revoke: str | None, target: str | None, as_json: bool) -> None:
    """Targets approved for a whole session (shoal approve --session); --revoke takes them back."""
    if revoke:
        params = {"principal": revoke, **({"target": target} if target else {})}
        done = ctx.call("grants.revoke", params)
        click.echo(f"{done['principal']}: {done['revoked']} grant(s) revoked in {done['session']}")
        return
    grants = ctx.call("grants.list", {})["grants"]
    if as_json:
        emit_json(grants)
        return
    for g in grants:
        click.echo(f"{g['session']}  {g['principal']}")
        for path in g["write"]:
            click.echo(f"    write {escape_controls(path)}")
        for path in g["read"]:
            click.echo(f"    read  {escape_controls(path)}")


@click.command("deny")
@click.argument("plan")
@pass_ctx
def deny_cmd(ctx: Ctx, plan: str) -> None:
    """Deny PLAN; it stays denied."""
    result = ctx.call("cap.decide", {"plan_ref": plan, "approve": False})
    click.echo(f"{result['plan_ref']}: {state_colour(result['state'])}")
