"""``shoal exec``: run a command in the kernel and behave like the command itself.

- The exit status is the command's (128+N for signal N); shoal's own failures exit 125
  and Ctrl-C 130 (docs/configuration.md, "Exit status").
- The command's stdout goes to stdout and its stderr to stderr.
- On a terminal, output is streamed as the command produces it (following the kernel's
  growing spool) up to ``LIVE_MAX_BYTES``; elsewhere the bounded preview an agent sees
  is written, with hints in CLI syntax, unless ``--full`` asks for every byte.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
import tempfile
import threading
import time
from typing import Any

import click

from ..client import KernelLost
from ..protocol.errors import RpcError
from ..protocol.framing import write_all
from ..protocol.limits import PTY_DEFAULT_COLS, PTY_DEFAULT_ROWS, KiB
from ..protocol.plain import dumps, to_plain
from ..protocol.uri import task_uri
from .common import (
    EXIT_INTERRUPTED,
    EXIT_SHOAL_ERROR,
    SIGNAL_BASE,
    Ctx,
    command_exit_codes,
    pass_ctx,
    say_if_throttled,
    unreachable,
)
from .output import style
from .streams import (
    binary,
    cli_hints,
    copy_raw,
    page_bytes,
    stderr_bytes,
    stdout_bytes,
)
from .terminal import Mirror, stdio_fds, terminal_size

FEED_CHUNK = 64 * KiB

LIVE_POLL_S = 0.05
"""How often a live view reads the growing spools: stdout and stderr interleave at this
grain (two pipes have no common order; ``-t`` gives the program one terminal)."""
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPIN_INTERVAL_S = 0.1
SPIN_AFTER_S = 0.5  # no spinner for quick commands
SILENT_AFTER_S = 2.0
"""A live view shows a progress line on stderr after this long without output."""
CANCEL_WAIT_S = 10.0
STATUS_MAX = 255


@click.command("exec")
@click.argument("src")
@click.option("--json", "as_json", is_flag=True, help="print the kernel's result as plain JSON")
@click.option("--wire", is_flag=True, help="with --json: the tagged wire form instead")
@click.option("--background", is_flag=True, help="run as a task and return at once")
@click.option("--full", is_flag=True, help="write all of stdout and stderr, not a preview")
@click.option(
    "--preview", is_flag=True, help="on a terminal too: the bounded preview an agent sees"
)
@click.option("-i", "--interactive", is_flag=True, help="pass this stdin to the command")
@click.option(
    "-t", "--tty", "use_tty", is_flag=True, help="run on a terminal (a kernel PTY), raw mode"
)
@pass_ctx
def exec_cmd(
    ctx: Ctx,
    src: str,
    as_json: bool,
    wire: bool,
    background: bool,
    full: bool,
    preview: bool,
    interactive: bool,
    use_tty: bool,
) -> None:
    """Run SRC (bash) in this directory's session; exit with its status.

    The command's stdout goes to stdout, its stderr to stderr, interleaved as produced.
    On a terminal the output streams live, all of it; otherwise (or with ``--preview``)
    the bounded preview is written (``--full``: everything). ``-i`` passes stdin;
    ``-t`` runs SRC on a terminal of the kernel's (Ctrl-C reaches it, Ctrl-] leaves).
    Exit: the command's status, 128+N for signal N, 125 when shoal could not run it, 130
    on Ctrl-C.
    """
    command_exit_codes()
    if use_tty:
        sys.exit(run_on_pty(ctx, src))
    client = ctx.client()
    params: dict = {"src": src, "position": "value", "background": background}
    feeder = StdinFeeder(client) if interactive else None
    if feeder is not None:
        params["stdin"] = feeder.path
    asked = time.monotonic()
    msg_id, fut = client.start_call("exec", params)
    if feeder is not None:
        feeder.start(msg_id, fut)
    live = not (as_json or background or full or preview) and sys.stdout.isatty()
    follower = LiveFollower(client, msg_id) if live else None
    try:
        result = follower.run(fut) if follower else _wait_with_spinner(client, msg_id, fut)
    except KeyboardInterrupt:
        _cancel(client, msg_id, fut)
    except RpcError as exc:
        ctx.fail(exc)
    except KernelLost as exc:
        unreachable(exc)
    finally:
        if feeder is not None:
            feeder.close()
        say_if_throttled(client, asked)
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
    if not as_json:
        unset_hint(client.call, src)
    if not as_json and sys.stderr.isatty():
        cwd = to_plain(value).get("cwd", "")
        footer = (
            f"── {result['ref']}  exit {value.get('status')}  {result['elapsed_ms']:.0f} ms  {cwd}"
        )
        click.echo(style(footer.rstrip(), dim=True), err=True)
    sys.exit(exit_status(value))


_VAR_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def unset_hint(call: Any, src: str) -> None:
    """``export X=1; shoal exec 'echo $X'``: the variable is this shell's, not the
    session's. Said when a variable SRC references is set here but absent from the
    session the command ran in (the kernel runs it, not this shell)."""
    names = {m.group(1) for m in _VAR_REF.finditer(src)} & set(os.environ)
    if not names:
        return
    try:
        session_names = set(call("session.env", {}).get("names", []))
    except (RpcError, KernelLost):
        return
    missing = sorted(names - session_names)
    if not missing:
        return
    listed = ", ".join("$" + n for n in missing)
    click.echo(
        style(
            f"note: {listed} is set in this shell but not in the shoal session (the kernel "
            f"runs the command, not this shell); set it there first: "
            f"shoal exec 'export {missing[0]}=VALUE'",
            fg="yellow",
        ),
        err=True,
    )


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
    """Follows a running foreground exec's spools and writes them as they grow: all of
    them, stdout and stderr each to its own descriptor in the order they were read, and a
    progress line on stderr while the command is silent."""

    def __init__(self, client: Any, msg_id: int) -> None:
        self.client = client
        self.msg_id = msg_id
        self.task_id: int | None = None
        self.offsets = {"out": 0, "err": 0}
        self.progress = Progress()

    def run(self, fut: Any) -> dict:
        try:
            while True:
                try:
                    return fut.result(timeout=LIVE_POLL_S)
                except TimeoutError:
                    pass
                self._poll()
                self.progress.tick(sum(self.offsets.values()))
        finally:
            self.progress.clear()

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
        dest = stdout_bytes() if stream == "out" else stderr_bytes()
        before = self.offsets[stream]
        page = self.client.call(
            "value.get",
            {"ref": ref, "path": path, "format": "raw", "offset": before, "length": 1},
        )
        if page.get("total", 0) <= before:
            return
        self.progress.clear()
        tracked = _LastByte(dest)
        self.offsets[stream], _ = copy_raw(self.client.call, ref, path, tracked, before)
        self.progress.wrote(tracked.last)

    def finish(self, result: dict) -> None:
        """Write what was not streamed yet, from the stored ``out:N``."""
        ref = result["ref"]
        for stream in ("out", "err"):
            self._copy(ref, f".{stream}", stream)


class _LastByte:
    """A byte stream that remembers the last byte written through it."""

    def __init__(self, dest: Any) -> None:
        self.dest = dest
        self.last = b""

    def write(self, data: bytes) -> int:
        if data:
            self.last = bytes(data[-1:])
        return self.dest.write(data)

    def flush(self) -> None:
        self.dest.flush()


class Progress:
    """A progress line on a terminal's stderr while a live command prints nothing:
    elapsed time and bytes so far. Only after a complete line (it never splits one) and
    erased before the next output."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.start = time.monotonic()
        self.last_output = self.start
        self.shown = False
        self.at_line_start = True
        self.frames = itertools.cycle(SPINNER)

    def wrote(self, last: bytes) -> None:
        self.last_output = time.monotonic()
        if last:
            self.at_line_start = last == b"\n"

    def tick(self, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or not self.at_line_start or now - self.last_output < SILENT_AFTER_S:
            return
        err = binary(sys.stderr)
        err.write(
            f"\r{next(self.frames)} {now - self.start:6.1f} s  {total} bytes so far, "
            "silent now  (Ctrl-C cancels)\033[K".encode()
        )
        err.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            err = binary(sys.stderr)
            err.write(b"\r\033[K")
            err.flush()
            self.shown = False


class StdinFeeder:
    """``-i``: this process's stdin copied into a FIFO the command reads as its stdin.

    The FIFO (in a private temporary directory) is opened here read-write first, so the
    kernel's open never waits and bytes written before the command starts are kept; this
    side's descriptor is closed at the end of stdin once the command has started (the
    kernel then holds the read end), so the command sees end-of-file exactly then.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.dir = tempfile.mkdtemp(prefix="shoal-stdin-")
        self.path = os.path.join(self.dir, "stdin")
        os.mkfifo(self.path, 0o600)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        self.thread: threading.Thread | None = None

    def start(self, msg_id: int, fut: Any) -> None:
        self.thread = threading.Thread(target=self._pump, args=(msg_id, fut), daemon=True)
        self.thread.start()

    def _pump(self, msg_id: int, fut: Any) -> None:
        source = sys.stdin.fileno()
        try:
            while True:
                data = os.read(source, FEED_CHUNK)
                if not data:
                    break
                write_all(self.fd, data)
        except OSError:
            pass  # stdin or the FIFO closed under us: nothing more to pass
        self._wait_started(msg_id, fut)
        self.close()

    def _wait_started(self, msg_id: int, fut: Any) -> None:
        while not fut.done():
            try:
                record = self.client.call("task.get", {"call": msg_id})
            except (RpcError, KernelLost):
                return  # finished (or gone): nobody reads the FIFO any more
            if "task" in record:
                return
            time.sleep(LIVE_POLL_S)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)


def run_on_pty(ctx: Ctx, src: str) -> int:
    """``-t``: SRC on a kernel PTY sized like this terminal, mirrored here in raw mode;
    the PTY is closed when the program exits or the user leaves (Ctrl-]). Its status."""
    in_fd, out_fd = stdio_fds()
    cols, rows = terminal_size(out_fd) or (PTY_DEFAULT_COLS, PTY_DEFAULT_ROWS)
    opened = ctx.call("pty.open", {"cmd": "bash", "args": ["-c", src], "cols": cols, "rows": rows})
    pty_id = opened["pty_id"]
    client = ctx.client()
    final: dict = {}
    try:
        final = Mirror(client.call, pty_id, in_fd, out_fd, follow_size=True).run()
    except RpcError as exc:
        ctx.fail(exc)
    except KernelLost as exc:
        unreachable(exc)
    finally:
        with contextlib.suppress(RpcError, KernelLost):
            client.call("pty.close", {"pty_id": pty_id})
    if final.get("detached"):
        click.echo(style(f"left {pty_id}; it was closed", fg="yellow"), err=True)
        return EXIT_INTERRUPTED
    end = final.get("exit", {})
    if "signal" in end:
        return SIGNAL_BASE + int(end["signal"])
    return min(max(int(end.get("status", EXIT_SHOAL_ERROR)), 0), STATUS_MAX)


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
            held = "  throttled (CPU budget)" if client.throttled_since(start) else ""
            line = f"\r{next(frames)} {elapsed:5.1f} s  {out_bytes} bytes{held}  (Ctrl-C cancels)"
            err.write(line.encode())
            err.flush()
            shown = True
    finally:
        if shown:
            err.write(b"\r\033[K")
            err.flush()
