"""``shoal grep PATTERN``: which run printed it? A search across every stored output.

The kernel's ``value.get {ref: "outputs", match, …}`` (docs/protocol.md, Find across
runs); hits come newest first under each run's head (when, exit status, command). The
exit status is grep's: 0 when something matched, 1 when nothing did, 2 on an error.
"""

from __future__ import annotations

import re
import shlex
import time

import click

from ..protocol.limits import FIND_ALL_SESSIONS
from ..protocol.plain import dumps
from .common import EXIT_FAILED, Ctx, pass_ctx
from .output import style

AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
AGO_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _when(text: str | None, option: str) -> float | None:
    """Unix seconds from ``1733300000`` or an age such as ``90s``, ``15m``, ``2h``, ``3d``."""
    if text is None:
        return None
    if m := AGO.fullmatch(text.strip()):
        return time.time() - float(m.group(1)) * AGO_SECONDS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        raise click.BadParameter(
            "a unix time or an age such as 90s, 15m, 2h, 3d", param_hint=option
        ) from None


@click.command("grep")
@click.argument("pattern")
@click.option("-i", "--ignore-case", is_flag=True, help="ignore case (ASCII)")
@click.option("-C", "--context", type=click.IntRange(0), default=0, help="lines around each hit")
@click.option("-m", "--max", "max_hits", type=click.IntRange(1), default=None, help="hits shown")
@click.option("--since", default=None, help="stored at or after: unix time or an age (2h, 3d)")
@click.option("--until", default=None, help="stored at or before: unix time or an age")
@click.option("--ok/--failed", "ok", default=None, help="only runs that succeeded / failed")
@click.option("--stream", type=click.Choice(["out", "err"]), default=None, help="one stream only")
@click.option("--all-sessions", is_flag=True, help="every session (yours, or all per policy)")
@click.option("--cursor", default=None, help="continue where the previous search stopped")
@click.option("--json", "as_json", is_flag=True, help="the kernel's reply as JSON")
@pass_ctx
def grep_cmd(
    ctx: Ctx,
    pattern: str,
    ignore_case: bool,
    context: int,
    max_hits: int | None,
    since: str | None,
    until: str | None,
    ok: bool | None,
    stream: str | None,
    all_sessions: bool,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Find PATTERN (a regex; a plain word is a fast literal search) in every stored
    output of this session, newest first: which run printed it, on which line."""
    match: dict = {"regex": pattern}
    if ignore_case:
        match["ignore_case"] = True
    if context:
        match["context"] = context
    if max_hits is not None:
        match["max"] = max_hits
    params: dict = {"ref": "outputs", "match": match}
    filters = {
        "since": _when(since, "--since"),
        "until": _when(until, "--until"),
        "ok": ok,
        "stream": stream,
        "session": FIND_ALL_SESSIONS if all_sessions else None,
        "cursor": cursor,
    }
    params.update({k: v for k, v in filters.items() if v is not None})
    result = ctx.call("value.get", params)
    if as_json:
        click.echo(dumps(result))
    else:
        for line in result["render"].split("\n"):
            if not line.startswith("\u2026 more: shoal_get "):  # said below in CLI syntax
                click.echo(line)
        if result.get("cursor"):
            click.echo(style(f"\u2500\u2500 more: {_next_command(params, result)}", dim=True))
    if not result["total"]:
        raise SystemExit(EXIT_FAILED)


def _next_command(params: dict, result: dict) -> str:
    """The ``shoal grep`` that continues: this search with the reply's cursor."""
    match = params["match"]
    words = ["shoal", "grep", match["regex"]]
    if match.get("ignore_case"):
        words.append("-i")
    if match.get("context"):
        words += ["-C", str(match["context"])]
    if match.get("max"):
        words += ["-m", str(match["max"])]
    for key in ("since", "until"):
        if key in params:
            words += [f"--{key}", repr(params[key])]
    if "ok" in params:
        words.append("--ok" if params["ok"] else "--failed")
    if "stream" in params:
        words += ["--stream", params["stream"]]
    if "session" in params:
        words.append("--all-sessions")
    words += ["--cursor", result["cursor"]]
    return shlex.join(words)
