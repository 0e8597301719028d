"""Day-to-day commands: exec, get, tasks, journal, events, plans/approve/deny."""

from __future__ import annotations

import re
import sys
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
    pass_ctx,
)
from .exec_cmd import exit_status, write_preview
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
    """A render that is a pruned output's tombstone (tagged, or plain JSON since renders
    of records are plain) is an error, not output."""
    if render.startswith("{") and ('"$": "error"' in render[:40] or '"gc_removed"' in render):
        try:
            value = orjson.loads(render)
        except orjson.JSONDecodeError:
            return
        _check_removed_value(value)


def _check_removed_value(value: object) -> None:
    if isinstance(value, dict) and (value.get("$") == "error" or "gc_removed" in value):
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
    record = _await_with_progress(ctx, task, timeout)
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


WAIT_STEP_S = 1.0
"""On a terminal ``tasks wait`` awaits in steps this long, redrawing its progress line."""


def _await_with_progress(ctx: Ctx, task: str, timeout: float) -> dict:
    """``task.await`` up to ``timeout``; on a terminal in steps, with a progress line on
    stderr (elapsed, bytes so far) so a long wait is visibly alive."""
    if not sys.stderr.isatty():
        return ctx.call("task.await", {"task": task, "timeout_ms": int(timeout * 1000)})
    start = time.monotonic()
    err = sys.stderr
    try:
        while True:
            left = timeout - (time.monotonic() - start)
            step = max(0.0, min(WAIT_STEP_S, left))
            record = ctx.call("task.await", {"task": task, "timeout_ms": int(step * 1000)})
            if record.get("done") or left <= step:
                return record
            elapsed = time.monotonic() - start
            err.write(
                f"\rwaiting for {record.get('task', task)}: {elapsed:5.1f} s, "
                f"{record.get('out_bytes', 0)} bytes so far (Ctrl-C stops waiting)\033[K"
            )
            err.flush()
    finally:
        err.write("\r\033[K")
        err.flush()


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
    """Approve PLAN, its ref or a unique prefix of it (you must be an approver): its one
    apply may do exactly its targets."""
    params: dict = {"plan_ref": _plan_ref(ctx, plan), "approve": True}
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
        for host in g.get("net", ()):  # an older kernel lists no hosts
            click.echo(f"    net   {escape_controls(host)}")


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
