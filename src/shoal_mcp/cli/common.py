"""Shared CLI plumbing: the context object and the attached kernel client."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import NoReturn

import click
import orjson

from ..client import KernelClient, connect
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.paths import socket_path, state_dir


@dataclass
class Ctx:
    socket: str | None
    state_dir: str | None
    session: str
    _client: KernelClient | None = field(default=None, repr=False)

    @property
    def socket_path(self):
        return socket_path(self.socket)

    @property
    def state_path(self):
        return state_dir(self.state_dir)

    def client(self, autostart: bool = True, on_event=None) -> KernelClient:
        """A kernel client attached to the session (autostarting the kernel)."""
        if self._client is None or on_event is not None:
            client = connect(self.socket, self.state_dir, autostart=autostart, on_event=on_event)
            params: dict = {
                "session": self.session,
                "client": {"kind": "cli", "tty": sys.stdout.isatty()},
                "cwd": os.getcwd(),
            }
            token = os.environ.get("SHOAL_TOKEN")
            if token:
                params["token"] = token
            try:
                client.call("session.attach", params)
            except RpcError as exc:
                fail(exc)
            if on_event is not None:
                return client
            self._client = client
        return self._client

    def call(self, method: str, params: dict | None = None, autostart: bool = True):
        try:
            return self.client(autostart).call(method, params or {})
        except RpcError as exc:
            fail(exc)

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


def fail(exc: RpcError) -> NoReturn:
    click.echo(f"error {exc.code}: {exc.message}", err=True)
    if exc.data:
        click.echo(orjson.dumps(exc.data, option=orjson.OPT_INDENT_2).decode(), err=True)
    sys.exit(1 if exc.code == ErrorCode.RAISED else 2)
