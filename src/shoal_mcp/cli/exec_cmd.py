"""``shoal exec``: run a command in the kernel and behave like the command itself.

- The exit status is the command's (128+N for signal N); shoal's own failures exit 125
  and Ctrl-C 130 (docs/configuration.md, "Exit status").
- The command's stdout goes to stdout and its stderr to stderr.
- On a terminal, output is streamed as the command produces it (following the kernel's
  growing spool) up to ``LIVE_MAX_BYTES``; elsewhere the bounded preview an agent sees
  is written, with hints in CLI syntax, unless ``--full`` asks for every byte.
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

import click

from ..client import KernelLost
from ..protocol.errors import RpcError
from ..protocol.limits import KiB
from ..protocol.plain import dumps, to_plain
from ..protocol.uri import task_uri
from .common import (
    EXIT_INTERRUPTED,
    EXIT_SHOAL_ERROR,
    Ctx,
    command_exit_codes,
    pass_ctx,
    unreachable,
)
from .output import style
from .streams import (
    binary,
    cli_hints,
    copy_raw,
    get_command,
    page_bytes,
    stderr_bytes,
    stdout_bytes,
)

LIVE_MAX_BYTES = 256 * KiB
"""Live streaming on a terminal stops after this much (the rest stays stored)."""
LIVE_POLL_S = 0.1
LIVE_TAIL_LINES = 10
"""Lines of stdout shown at the end when live streaming stopped early."""
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPIN_INTERVAL_S = 0.1
SPIN_AFTER_S = 0.5  # no spinner for quick commands
CANCEL_WAIT_S = 10.0
STATUS_MAX = 255


@click.command("exec")
@click.argument("src")
@click.option("--json", "as_json", is_flag=True, help="print the kernel's result as plain JSON")
@click.option("--wire", is_flag=True, help="with --json: the tagged wire form instead")
@click.option("--background", is_flag=True, help="run as a task and return at once")
@click.option("--full", is_flag=True, help="write all of stdout and stderr, not a preview")
@pass_ctx
def exec_cmd(ctx: Ctx, src: str, as_json: bool, wire: bool, background: bool, full: bool) -> None:
    """Run SRC (bash) in this directory's session; exit with its status.

    The command's stdout goes to stdout, its stderr to stderr. On a terminal the output
    streams live; otherwise the bounded preview is written (``--full``: everything).
    Ctrl-C cancels the command. Exit: the command's status, 128+N for signal N, 125 when
    shoal could not run it, 130 on Ctrl-C.
    """
    command_exit_codes()
    client = ctx.client()
    msg_id, fut = client.start_call(
        "exec", {"src": src, "position": "value", "background": background}
    )
    live = not (as_json or background or full) and sys.stdout.isatty()
    follower = LiveFollower(client, msg_id) if live else None
    try:
        result = follower.run(fut) if follower else _wait_with_spinner(client, msg_id, fut)
    except KeyboardInterrupt:
        _cancel(client, msg_id, fut)
    except RpcError as exc:
        ctx.fail(exc)
    except KernelLost as exc:
        unreachable(exc)
    if background:
        click.echo(f"{result['task']}  {result['uri']}")
        return
    value = result.get("value", {})
    if as_json:
        click.echo(dumps(result if wire else {**result, "value": to_plain(value)}))
    elif follower is not None:
        follower.finish(result)
    elif full:
        _write_full(client.call, result["ref"])
    else:
        write_preview(client.call, result)
    if not as_json and sys.stderr.isatty():
        footer = f"── {result['ref']}  exit {value.get('status')}  {result['elapsed_ms']:.0f} ms"
        click.echo(style(footer, dim=True), err=True)
    sys.exit(exit_status(value))


def exit_status(outcome: dict) -> int:
    """The command's exit status as a process exit code (signals are 128+N already)."""
    status = outcome.get("status")
    if not isinstance(status, int):
        return EXIT_SHOAL_ERROR
    if outcome.get("ok") is False and status == 0:
        return 1
    return min(max(status, 0), STATUS_MAX)


def _cancel(client: Any, msg_id: int, fut: Any) -> None:
    try:
        client.call("task.cancel", {"call": msg_id}, timeout=5)
    except (RpcError, KernelLost):
        pass
    click.echo(style("\ncancelled", fg="yellow"), err=True)
    try:
        fut.result(timeout=CANCEL_WAIT_S)
    except (RpcError, KernelLost, TimeoutError):
        pass
    sys.exit(EXIT_INTERRUPTED)


def write_preview(call: Any, result: dict) -> None:
    """The bounded preview: each stream inline when small, else its render (head, tail
    and the `shoal get` that fetches the rest)."""
    value = result.get("value", {})
    for stream, out in (("out", stdout_bytes()), ("err", stderr_bytes())):
        part = value.get(stream)
        if isinstance(part, dict) and part.get("$") in ("str", "bytes"):
            data = page_bytes(
                {"raw": part["v"]} if part["$"] == "str" else {"raw_base64": part["v"]}
            )
        elif isinstance(part, dict) and part.get("$") == "ref":
            render = call(
                "value.get", {"ref": result["ref"], "path": f".{stream}", "format": "render"}
            )
            text = cli_hints(render["render"])
            data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "surrogateescape")
        else:
            continue
        out.write(data)
        out.flush()


def _write_full(call: Any, ref: str) -> None:
    copy_raw(call, ref, ".out", stdout_bytes())
    copy_raw(call, ref, ".err", stderr_bytes())


class LiveFollower:
    """Follows a running foreground exec's spools and writes them as they grow."""

    def __init__(self, client: Any, msg_id: int) -> None:
        self.client = client
        self.msg_id = msg_id
        self.task_id: int | None = None
        self.offsets = {"out": 0, "err": 0}
        self.shown = 0

    def run(self, fut: Any) -> dict:
        while True:
            try:
                return fut.result(timeout=LIVE_POLL_S)
            except TimeoutError:
                pass
            self._poll()

    def _poll(self) -> None:
        if self.task_id is None:
            try:
                record = self.client.call("task.get", {"call": self.msg_id})
            except RpcError:
                return  # already finished
            if "task" not in record:
                return  # in flight but not spawned yet ("starting"): the next poll
            self.task_id = int(str(record["task"]).rpartition(":")[2])
        for stream in ("out", "err"):
            try:
                self._copy(task_uri(self.task_id, stream), "", stream)
            except RpcError:
                return  # finished meanwhile: ``finish`` writes the rest from out:N

    def _copy(self, ref: str, path: str, stream: str) -> None:
        room = LIVE_MAX_BYTES - self.shown
        if room <= 0:
            return
        dest = stdout_bytes() if stream == "out" else stderr_bytes()
        before = self.offsets[stream]
        self.offsets[stream], _ = copy_raw(self.client.call, ref, path, dest, before, room)
        self.shown += self.offsets[stream] - before

    def finish(self, result: dict) -> None:
        """Write what was not streamed yet, from the stored ``out:N``."""
        ref = result["ref"]
        for stream in ("out", "err"):
            self._copy(ref, f".{stream}", stream)
        total = self.client.call(
            "value.get", {"ref": ref, "path": ".out", "format": "raw", "length": 1}
        )
        if total.get("total", 0) > self.offsets["out"]:
            click.echo(
                style(
                    f"… live output stopped after {LIVE_MAX_BYTES // KiB} KiB; the last "
                    f"{LIVE_TAIL_LINES} lines follow; all of it: "
                    f"{get_command(ref, '.out', None)} --format raw",
                    dim=True,
                ),
                err=True,
            )
            tail = self.client.call(
                "value.get",
                {"ref": ref, "path": f".out.lines[-{LIVE_TAIL_LINES}..]", "format": "render"},
            )
            click.echo(tail["render"])


def _wait_with_spinner(client: Any, msg_id: int, fut: Any) -> dict:
    if not sys.stderr.isatty():
        return client.wait(msg_id, fut, "exec", None)  # pings a silent kernel
    start = time.monotonic()
    shown = False
    frames = itertools.cycle(SPINNER)
    out_bytes = 0
    last_poll = 0.0
    err = binary(sys.stderr)
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
                    record = client.call("task.get", {"call": msg_id}, timeout=1)
                    out_bytes = record.get("out_bytes", 0)
                except (RpcError, KernelLost):
                    pass
            line = f"\r{next(frames)} {elapsed:5.1f} s  {out_bytes} bytes  (Ctrl-C cancels)"
            err.write(line.encode())
            err.flush()
            shown = True
    finally:
        if shown:
            err.write(b"\r\033[K")
            err.flush()
