"""Day-to-day commands: exec, get, tasks, journal, events, plans/approve/deny."""

from __future__ import annotations

import itertools
import sys
import threading
import time

import click

from ..client import KernelLost
from ..protocol.errors import RpcError
from .common import Ctx, fail, pass_ctx
from .output import emit_json, state_colour, style, table, when

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPIN_INTERVAL_S = 0.1
SPIN_AFTER_S = 0.5  # no spinner for quick commands


@click.command("exec")
@click.argument("src")
@click.option("--json", "as_json", is_flag=True, help="print the whole kernel result as JSON")
@click.option("--background", is_flag=True, help="run as a task and return at once")
@pass_ctx
def exec_cmd(ctx: Ctx, src: str, as_json: bool, background: bool) -> None:
    """Run SRC (bash) and print what an agent would see: the bounded render and the ref.

    Long commands show a spinner with elapsed time and output bytes on a terminal;
    Ctrl-C cancels the command's task.
    """
    client = ctx.client()
    msg_id, fut = client.start_call(
        "exec", {"src": src, "position": "value", "background": background}
    )
    try:
        result = _wait_with_spinner(client, msg_id, fut)
    except KeyboardInterrupt:
        try:
            client.call("task.cancel", {"call": msg_id}, timeout=5)
        except (RpcError, KernelLost, TimeoutError):
            pass
        click.echo(style("\ncancelled", fg="yellow"), err=True)
        try:
            result = fut.result(timeout=10)
        except (RpcError, KernelLost, TimeoutError):
            sys.exit(130)
    except RpcError as exc:
        fail(exc)
    if as_json:
        emit_json(result)
        return
    if "task" in result:
        click.echo(f"{result['task']}  {result['uri']}")
        return
    render = result.get("render", "")
    click.echo(render, nl=not render.endswith("\n"))
    value = result.get("value", {})
    status = value.get("status")
    footer = f"── {result['ref']}  {result['uri']}  exit {status}  {result['elapsed_ms']:.0f} ms"
    click.echo(style(footer, dim=True), err=True)
    sys.exit(0 if value.get("ok", True) else 1)


def _wait_with_spinner(client, msg_id: int, fut):
    if not sys.stderr.isatty():
        return fut.result()
    start = time.monotonic()
    shown = False
    frames = itertools.cycle(SPINNER)
    out_bytes = 0
    last_poll = 0.0
    try:
        while True:
            try:
                return fut.result(timeout=SPIN_INTERVAL_S)
            except TimeoutError:
                pass
            elapsed = time.monotonic() - start
            if elapsed < SPIN_AFTER_S:
                continue
            if elapsed - last_poll > 1.0:
                last_poll = elapsed
                try:
                    out_bytes = client.call("task.get", {"call": msg_id}, timeout=1).get(
                        "out_bytes", 0
                    )
                except (RpcError, KernelLost, TimeoutError):
                    pass
            sys.stderr.write(
                f"\r{next(frames)} {elapsed:5.1f} s  {out_bytes} bytes  (Ctrl-C cancels)"
            )
            sys.stderr.flush()
            shown = True
    finally:
        if shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


@click.command("get")
@click.argument("ref")
@click.option("--path", "path", default=None, help="selector, e.g. .out.lines[-3..]")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "render", "raw"]),
    default="render",
    show_default=True,
)
@click.option("--offset", type=int, default=None, help="raw: byte offset")
@click.option("--length", type=int, default=None, help="raw: page size")
@pass_ctx
def get_cmd(
    ctx: Ctx, ref: str, path: str | None, fmt: str, offset: int | None, length: int | None
) -> None:
    """Fetch a stored value (out:N, task:N, shoal://…) or a part of it."""
    params: dict = {"ref": ref, "format": fmt}
    if path:
        params["path"] = path
    if offset is not None:
        params["offset"] = offset
    if length is not None:
        params["length"] = length
    result = ctx.call("value.get", params)
    if fmt == "render":
        click.echo(result["render"])
    elif fmt == "raw":
        click.echo(result.get("raw", result.get("raw_base64", "")), nl=False)
        if "next" in result:
            click.echo(style(f"\n── more: {result['next']}", dim=True), err=True)
    else:
        emit_json(result["value"])


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
            [t["task"], state_colour(t["state"]), when(t["started"]), t.get("out_bytes"), t["src"]]
            for t in tasks
        ],
        ["TASK", "STATE", "STARTED", "OUT", "SRC"],
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
    """Wait for a task to finish and print its result's render."""
    record = ctx.call("task.await", {"task": task, "timeout_ms": int(timeout * 1000)})
    if not record.get("done"):
        click.echo(f"{record['task']} still {record['state']}", err=True)
        sys.exit(4)
    if "result_ref" in record:
        click.echo(
            ctx.call("value.get", {"ref": record["result_ref"], "format": "render"})["render"]
        )
    click.echo(style(f"── {record['task']} {record['state']}", dim=True), err=True)


# -- journal and events -----------------------------------------------------------------------


@click.command("journal")
@click.option("--since", type=float, help="unix time")
@click.option("--until", type=float, help="unix time")
@click.option("--principal")
@click.option("--head", help="first command word")
@click.option("--ok/--failed", "ok", default=None)
@click.option("--effect", "effects", multiple=True, help="effect kind (repeatable)")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--follow", "-f", is_flag=True, help="keep printing new rows")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def journal_cmd(
    ctx: Ctx, since, until, principal, head, ok, effects, limit, follow, as_json
) -> None:
    """What ran: newest first, with filters."""
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
            click.echo("  ".join("-" if v is None else str(v) for v in cells))


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
    table(
        [
            [
                p["plan_ref"],
                state_colour(p["state"]),
                p["principal"],
                p["verdict"],
                ",".join(sorted({e["kind"] for e in p["effects"]})),
                p["src"],
            ]
            for p in plans
        ],
        ["PLAN", "STATE", "PRINCIPAL", "VERDICT", "EFFECTS", "SRC"],
        max_width=70,
    )


@click.command("approve")
@click.argument("plan")
@click.option(
    "--effects", help="comma-separated effect kinds to approve (default: all of the plan's)"
)
@pass_ctx
def approve_cmd(ctx: Ctx, plan: str, effects: str | None) -> None:
    """Approve PLAN (you must be an approver)."""
    params: dict = {"plan_ref": plan, "approve": True}
    if effects:
        params["effects"] = [e.strip() for e in effects.split(",") if e.strip()]
    result = ctx.call("cap.decide", params)
    click.echo(f"{result['plan_ref']}: {state_colour(result['state'])}")


@click.command("deny")
@click.argument("plan")
@pass_ctx
def deny_cmd(ctx: Ctx, plan: str) -> None:
    """Deny PLAN; it stays denied."""
    result = ctx.call("cap.decide", {"plan_ref": plan, "approve": False})
    click.echo(f"{result['plan_ref']}: {state_colour(result['state'])}")
