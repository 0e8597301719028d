"""``shoal journal`` (what ran, filtered, followed) and ``shoal events tail``."""

from __future__ import annotations

import threading
import time

import click
import orjson

from ..protocol.display import escape_controls
from ..protocol.errors import RpcError
from .common import Ctx, fail, pass_ctx
from .gc_cmd import parse_duration
from .output import emit_json, table, when


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
