"""``shoal``: the human CLI over the same kernel the agents use."""

from __future__ import annotations

import os
import sys

import click
import orjson

from . import __version__
from .client import KernelClient, KernelLost, connect
from .constants import ErrorCode
from .errors import RpcError
from .framing import BACKEND


def _client(ctx: click.Context) -> KernelClient:
    opts = ctx.obj
    client = connect(opts["socket"], opts["state_dir"])
    params = {"session": opts["session"], "client": {"kind": "cli", "tty": sys.stdout.isatty()},
              "cwd": os.getcwd()}
    token = os.environ.get("SHOAL_TOKEN")
    if token:
        params["token"] = token
    client.call("session.attach", params)
    return client


def _emit_json(data: object) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@click.group()
@click.option("--socket", envvar="SHOAL_SOCKET", help="kernel socket path")
@click.option("--state-dir", envvar="SHOAL_STATE_DIR", help="kernel state directory")
@click.option("--session", envvar="SHOAL_SESSION", default="default", show_default=True)
@click.version_option(__version__, message=f"shoal %(version)s (framing: {BACKEND})")
@click.pass_context
def main(ctx: click.Context, socket: str | None, state_dir: str | None, session: str) -> None:
    """shoal: a shell for AI agents that cannot flood their context."""
    ctx.obj = {"socket": socket, "state_dir": state_dir, "session": session}


@main.command("exec")
@click.argument("src")
@click.option("--json", "as_json", is_flag=True, help="print the whole kernel result as JSON")
@click.option("--background", is_flag=True, help="run as a task and return at once")
@click.pass_context
def exec_cmd(ctx: click.Context, src: str, as_json: bool, background: bool) -> None:
    """Run SRC (bash) and print what an agent would see: the bounded render and the ref."""
    client = _client(ctx)
    try:
        result = client.call("exec", {"src": src, "position": "value", "background": background})
    except RpcError as exc:
        _fail(exc)
    if as_json:
        _emit_json(result)
        return
    if "task" in result:
        click.echo(f"{result['task']}  ({result['uri']})")
        return
    click.echo(result.get("render", ""))
    value = result.get("value", {})
    status = value.get("status")
    click.echo(f"── {result['ref']}  {result['uri']}  exit {status}  {result['elapsed_ms']:.0f} ms", err=True)
    ctx.exit(0 if value.get("ok", True) else 1)


@main.command("get")
@click.argument("ref")
@click.option("--path", "path", default=None, help="selector, e.g. .out.lines[-3..]")
@click.option("--format", "fmt", type=click.Choice(["json", "render", "raw"]), default="render")
@click.pass_context
def get_cmd(ctx: click.Context, ref: str, path: str | None, fmt: str) -> None:
    """Fetch a stored value (out:N, task:N, shoal://…) or a part of it."""
    client = _client(ctx)
    params: dict = {"ref": ref, "format": fmt}
    if path:
        params["path"] = path
    try:
        result = client.call("value.get", params)
    except RpcError as exc:
        _fail(exc)
    if fmt == "render":
        click.echo(result["render"])
    elif fmt == "raw":
        click.echo(result.get("raw", result.get("raw_base64", "")), nl=False)
        if "next" in result:
            click.echo(f"\n── more: {result['next']}", err=True)
    else:
        _emit_json(result["value"])


def _fail(exc: RpcError) -> None:
    click.echo(f"error {exc.code}: {exc.message}", err=True)
    if exc.data:
        click.echo(orjson.dumps(exc.data, option=orjson.OPT_INDENT_2).decode(), err=True)
    sys.exit(1 if exc.code == ErrorCode.RAISED else 2)


def run() -> None:
    try:
        main()
    except KernelLost as exc:
        click.echo(f"shoal: {exc}", err=True)
        sys.exit(3)
