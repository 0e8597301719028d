"""``shoal gc``: prune stored outputs by age and total size (a dry run unless --delete)."""

from __future__ import annotations

import re

import click

from ..protocol.limits import GC_DEFAULT_MAX_AGE_S
from .common import Ctx, pass_ctx
from .output import emit_json

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZES = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if not match:
        raise click.BadParameter(f"{text!r}: use a number with s, m, h, d or w (e.g. 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_size(text: str) -> int:
    """``500``, ``100K``, ``500M``, ``2G`` (binary units) → bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)i?b?\s*", text.lower())
    if not match:
        raise click.BadParameter(f"{text!r}: use a number with K, M, G or T (e.g. 500M)")
    return int(float(match.group(1)) * _SIZES[match.group(2)])


@click.command("gc")
@click.option("--older-than", help="prune outputs older than this (e.g. 7d, 12h); default 30d")
@click.option("--max-size", help="then prune the oldest until the rest fits (e.g. 500M, 2G)")
@click.option("--delete", is_flag=True, help="really delete (default: a dry run that reports)")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def gc_cmd(
    ctx: Ctx, older_than: str | None, max_size: str | None, delete: bool, as_json: bool
) -> None:
    """Free disk: prune stored outputs by age and by total size.

    A dry run by default: it says what would go. Outputs of live sessions (a client is
    attached now) and outputs still referenced by kept values are never deleted; a
    pruned out:N keeps its number and says it was removed, and leaves $SHOAL_OUT. The
    journal is kept; long journal texts no journal row refers to any more are deleted.
    """
    params: dict = {"dry_run": not delete}
    if older_than is not None:
        params["max_age_s"] = parse_duration(older_than)
    if max_size is not None:
        params["max_bytes"] = parse_size(max_size)
    if older_than is None and max_size is None:
        params["max_age_s"] = GC_DEFAULT_MAX_AGE_S
    report = ctx.call("store.gc", params)
    if as_json:
        emit_json(report)
        return
    verb = "would free" if report["dry_run"] else "freed"
    click.echo(
        f"{verb} {_human(report['bytes_freed'])} ({report['blobs']} blobs) from "
        f"{report['values']} outputs; {_human(report['bytes_after'])} stored after"
    )
    also = []
    if report.get("shoal_out_entries"):
        also.append(f"{report['shoal_out_entries']} $SHOAL_OUT entries of pruned outputs")
    if report.get("journal_texts"):
        also.append(f"{report['journal_texts']} journal texts no journal row refers to")
    if also:
        click.echo(f"{'would remove' if report['dry_run'] else 'removed'} {' and '.join(also)}")
    if report["kept_live_values"]:
        live = ", ".join(report["live_sessions"])
        click.echo(f"kept {report['kept_live_values']} outputs of live sessions ({live})")
    if report["dry_run"] and (report["values"] or also):
        click.echo("dry run: nothing was deleted; add --delete to do it")


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
