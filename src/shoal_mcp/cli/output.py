"""Terminal output for the CLI: colour and tables on a TTY, plain text otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import click
import orjson

from ..protocol.display import escape_controls


def is_tty() -> bool:
    return sys.stdout.isatty()


def style(text: str, **kwargs: Any) -> str:
    return click.style(text, **kwargs) if is_tty() else text


def emit_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    max_width: int = 60,
    min_widths: Sequence[int] | None = None,
    header: bool = True,
) -> list[int]:
    """Aligned columns; headers bold on a TTY; cells cut to ``max_width``; each column
    at least ``min_widths`` wide. Returns the widths used (a follow-up call passes them
    as ``min_widths`` with ``header=False`` to append aligned rows)."""
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max(len(h), (min_widths or [0] * len(headers))[i]) for i, h in enumerate(headers)]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    if header:
        click.echo(
            "  ".join(
                style(h.ljust(w), bold=True) for h, w in zip(headers, widths, strict=True)
            ).rstrip()
        )
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return widths


def _cell(value: Any, max_width: int) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    else:
        text = escape_controls(str(value))  # a \r or ESC must not redraw the table
    return text if len(text) <= max_width else text[: max_width - 1] + "…"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def state_colour(state: str) -> str:
    colours = {
        "completed": "green",
        "failed": "red",
        "cancelled": "yellow",
        "running": "cyan",
        "suspended": "magenta",
        "approved": "green",
        "denied": "red",
        "requested": "yellow",
    }
    return style(state, fg=colours.get(state))
