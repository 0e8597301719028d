"""Shared CLI plumbing: the context object, the attached kernel client, exit codes."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import click
import orjson

from ..client import KernelClient, connect
from ..client_transport import connect_remote, parse_host
from ..client_versions import version_mismatch
from ..protocol.discovery import live_record
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.paths import socket_path, state_dir

# Exit statuses (docs/configuration.md, "Exit status"). `shoal exec` and `shoal tasks
# wait` exit with the command's own status, so their own failures use codes a command
# rarely does, as env(1) and timeout(1) do.
EXIT_FAILED = 1
"""A listing or check found a failure (doctor, kernel status: not running)."""
EXIT_KERNEL_ERROR = 2
"""The kernel answered with an error (bad ref, denied, unknown task…)."""
EXIT_UNREACHABLE = 3
"""No kernel could be reached (not running and not started, stalled, untrusted)."""
EXIT_STILL_RUNNING = 124
"""`shoal tasks wait`: the task was still running when the wait ran out."""
EXIT_SHOAL_ERROR = 125
"""`shoal exec` / `shoal tasks wait`: shoal could not run or follow the command."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT)."""
SIGNAL_BASE = 128

COMMAND_EXIT = {"on": False}
"""Set by commands that exit with a command's status: their own errors exit 125."""


def command_exit_codes() -> None:
    COMMAND_EXIT["on"] = True


@dataclass
class Ctx:
    socket: str | None
    state_dir: str | None
    session: str | None
    host: str | None = None  # --host / SHOAL_HOST: the kernel of that host, over ssh
    remote_dir: str | None = None  # --remote-dir / SHOAL_REMOTE_DIR: the cwd there
    _client: KernelClient | None = field(default=None, repr=False)
    attach_info: dict = field(default_factory=dict)

    @property
    def socket_path(self) -> Path:
        """The socket in use: --socket/SHOAL_SOCKET, else the one of the state dir's live
        kernel, else the default path (docs/configuration.md, "Discovery")."""
        if self.socket:
            return socket_path(self.socket)
        record = live_record(self.state_path)
        return socket_path(record["socket"] if record else None)

    @property
    def state_path(self) -> Path:
        return state_dir(self.state_dir)

    def client(self, on_event=None) -> KernelClient:
        """A kernel client attached to the session (autostarting the kernel unless
        SHOAL_NO_AUTOSTART says not to)."""
        if self._client is None or on_event is not None:
            client = self._connect(on_event)
            params: dict = {"client": {"kind": "cli", "tty": sys.stdout.isatty()}}
            if not self.host:
                params["cwd"] = os.getcwd()
            elif self.remote_dir:  # a local path means nothing on another host
                params["cwd"] = self.remote_dir
            if self.session:
                params["session"] = self.session  # else: this directory's session
            token = os.environ.get("SHOAL_TOKEN")
            if token:
                params["token"] = token
            try:
                self.attach_info = client.call("session.attach", params)
            except RpcError as exc:
                self.fail(exc)
            mismatch = version_mismatch(self.attach_info.get("kernel"))
            if mismatch:
                click.echo(mismatch, err=True)
            if on_event is not None:
                return client
            self._client = client
        return self._client

    def _connect(self, on_event) -> KernelClient:
        if self.host:
            return connect_remote(parse_host(self.host), on_event)
        return connect(self.socket, self.state_dir, on_event=on_event)

    def call(self, method: str, params: dict | None = None):
        client = self.client()
        asked = time.monotonic()
        try:
            return client.call(method, params or {})
        except RpcError as exc:
            self.fail(exc)
        finally:
            say_if_throttled(client, asked)

    def fail(self, exc: RpcError) -> NoReturn:
        fail(exc, EXIT_SHOAL_ERROR if COMMAND_EXIT["on"] else None)

    def call_paged(self, method: str, params: dict, key: str, limit: int | None = None) -> list:
        """Every row of a list method, following its ``cursor`` while it says ``more``
        (kernel replies are bounded; docs/protocol.md, "Lists that page"); at most
        ``limit`` rows when given."""
        rows: list = []
        page = self.call(method, params)
        while True:
            rows.extend(page[key])
            if not page.get("more") or (limit is not None and len(rows) >= limit):
                return rows[:limit] if limit is not None else rows
            more = {**params, "cursor": page["cursor"]}
            if limit is not None and "limit" in params:
                more["limit"] = limit - len(rows)
            page = self.call(method, more)


pass_ctx = click.make_pass_decorator(Ctx)


def fail(exc: RpcError, code: int | None = None) -> NoReturn:
    click.echo(f"shoal: error {exc.code}: {exc.message}", err=True)
    if exc.data:
        click.echo(orjson.dumps(exc.data, option=orjson.OPT_INDENT_2).decode(), err=True)
    if code is None:
        code = EXIT_FAILED if exc.code == ErrorCode.RAISED else EXIT_KERNEL_ERROR
    sys.exit(code)


def unreachable(exc: Exception) -> NoReturn:
    click.echo(f"shoal: {exc}", err=True)
    sys.exit(EXIT_SHOAL_ERROR if COMMAND_EXIT["on"] else EXIT_UNREACHABLE)


def say_if_throttled(client: KernelClient, since: float) -> None:
    """Held for the principal's CPU budget is not stalled: say so on stderr when the
    kernel sent a ``throttled`` notice for this connection after ``since``."""
    if client.throttled_since(since):
        click.echo(
            f"shoal: throttled: the kernel held this call for this principal's CPU budget "
            f"(max_cpu_ms_per_s), about {client.throttled_for_s:.1f} s of debt at the last "
            "notice",
            err=True,
        )
