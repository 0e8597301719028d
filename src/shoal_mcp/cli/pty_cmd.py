"""``shoal pty``: the kernel's terminals for a person (list, open, attach, send, read, close).

``attach`` mirrors a PTY on this terminal and types into it (``terminal.Mirror``): any
PTY the caller may see, an agent's included when the caller is an approver (the local
human by default), so both see one screen, as with ``tmux attach``. Ctrl-] detaches and
leaves the program running.
"""

from __future__ import annotations

import sys

import click

from ..client import KernelLost
from ..protocol.errors import ErrorCode, RpcError
from .common import Ctx, pass_ctx, unreachable
from .output import emit_json, style, table
from .terminal import DETACH_NAME, Mirror, stdio_fds, terminal_size


@click.group("pty")
def pty_group() -> None:
    """The kernel's terminals: list, open, attach (watch and type; Ctrl-] detaches),
    send, read, close."""


def visible_ptys(ctx: Ctx) -> list[dict]:
    """Every PTY this caller may address: all of them for an approver, else its own."""
    try:
        return ctx.client().call("pty.list", {"all": True})["ptys"]
    except RpcError as exc:
        if exc.code != ErrorCode.DENIED:
            ctx.fail(exc)
    return ctx.call("pty.list", {})["ptys"]


@pty_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def pty_list(ctx: Ctx, as_json: bool) -> None:
    """The PTYs you may see (every session's when you are an approver)."""
    ptys = visible_ptys(ctx)
    if as_json:
        emit_json(ptys)
        return
    table(
        [
            [
                p["pty_id"],
                p.get("session", ctx.attach_info.get("session")),
                p.get("principal", ctx.attach_info.get("principal")),
                "alive" if p["alive"] else f"exited {p.get('exit')}",
                f"{p['cols']}x{p['rows']}",
                p["cmd"],
            ]
            for p in ptys
        ],
        ["PTY", "SESSION", "PRINCIPAL", "STATE", "SIZE", "CMD"],
    )


@pty_group.command("open", context_settings={"ignore_unknown_options": True})
@click.argument("cmd")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--cols", type=int, default=None, help="width (default: this terminal's, else 80)")
@click.option("--rows", type=int, default=None, help="height (default: this terminal's, else 24)")
@click.option("--attach", "then_attach", is_flag=True, help="attach at once")
@pass_ctx
def pty_open(
    ctx: Ctx, cmd: str, args: tuple[str, ...], cols: int | None, rows: int | None, then_attach: bool
) -> None:
    """Start CMD [ARGS]... on a new PTY in this session; prints its id."""
    size = terminal_size(sys.stdout.fileno())
    params: dict = {"cmd": cmd, "args": list(args)}
    params["cols"] = cols or (size[0] if size else 80)
    params["rows"] = rows or (size[1] if size else 24)
    opened = ctx.call("pty.open", params)
    if then_attach:
        _attach(ctx, opened["pty_id"], resize=True)
        return
    click.echo(opened["pty_id"])


@pty_group.command("attach")
@click.argument("pty_id")
@click.option("--resize", is_flag=True, help="resize the PTY to this terminal (and follow it)")
@pass_ctx
def pty_attach(ctx: Ctx, pty_id: str, resize: bool) -> None:
    """Watch PTY_ID live and type into it; Ctrl-] detaches (the program keeps running).

    The program and whoever else drives it (an agent) see the same screen."""
    _attach(ctx, pty_id, resize)


def _attach(ctx: Ctx, pty_id: str, resize: bool) -> None:
    in_fd, out_fd = stdio_fds()
    client = ctx.client()
    try:
        click.echo(style(f"attached to {pty_id}; {DETACH_NAME} detaches", dim=True), err=True)
        final = Mirror(client.call, pty_id, in_fd, out_fd, follow_size=resize).run()
    except RpcError as exc:
        ctx.fail(exc)
    except KernelLost as exc:
        unreachable(exc)
    if final.get("detached"):
        click.echo(style(f"detached from {pty_id}; it keeps running", dim=True), err=True)
    else:
        click.echo(style(f"{pty_id} exited: {final.get('exit')}", dim=True), err=True)


@pty_group.command("send")
@click.argument("pty_id")
@click.argument("text", required=False, default="")
@click.option(
    "--key", "keys", multiple=True, help="a key after TEXT: Enter, Tab, Up, Ctrl-C… (repeatable)"
)
@pass_ctx
def pty_send(ctx: Ctx, pty_id: str, text: str, keys: tuple[str, ...]) -> None:
    """Type TEXT (then each --key) into PTY_ID."""
    items: list = [text] if text else []
    items += [{"key": k} for k in keys]
    if not items:
        raise click.UsageError("nothing to send: give TEXT and/or --key")
    result = ctx.call("pty.send", {"pty_id": pty_id, "input": items})
    if result.get("dropped"):
        click.echo(f"{result['dropped']} bytes dropped: the program is not reading", err=True)
        sys.exit(1)


@pty_group.command("read")
@click.argument("pty_id")
@click.option("--scrollback", type=int, default=0, help="also this many lines above the screen")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def pty_read(ctx: Ctx, pty_id: str, scrollback: int, as_json: bool) -> None:
    """Print PTY_ID's screen (and scrollback) as text."""
    screen = ctx.call("pty.read", {"pty_id": pty_id, "scrollback": scrollback})
    if as_json:
        emit_json(screen)
        return
    for row in [*screen.get("scrollback", []), *screen.get("screen", [])]:
        click.echo(row)
    if not screen.get("alive", True):
        click.echo(style(f"── {pty_id} exited: {screen.get('exit')}", dim=True), err=True)


@pty_group.command("close")
@click.argument("pty_id")
@pass_ctx
def pty_close(ctx: Ctx, pty_id: str) -> None:
    """End PTY_ID's program (SIGHUP, then SIGKILL) and forget the PTY."""
    result = ctx.call("pty.close", {"pty_id": pty_id})
    click.echo(f"{result['pty_id']} closed {result.get('exit') or ''}".rstrip())
