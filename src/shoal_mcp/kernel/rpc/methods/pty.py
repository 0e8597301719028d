"""pty.open / send / read / resize / close / list (docs/protocol.md, PTYs).

A PTY belongs to the session and principal that opened it. An approver (the human at
the machine by default) may also address every other PTY by its id and list them all
(``pty.list {"all": true}``): ``shoal pty attach`` watches and types into the terminal
an agent drives."""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from ....protocol.errors import ErrorCode, RpcError, invalid_params
from ....protocol.params import PTY_CLOSE, PTY_LIST, PTY_OPEN, PTY_READ, PTY_RESIZE, PTY_SEND
from ...access.identity import owner_key
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _owner(call: Call, pty_id: object) -> str | None:
    """The owner key ``pty_id`` is looked up under: the caller's own, or any (None) for an
    approver naming a PTY that is not its own."""
    own = owner_key(call.who)
    if not call.kernel.guard.for_principal(call.who.principal).approver:
        return own
    mine = {p["pty_id"] for p in call.kernel.ptys.list(own)}
    return own if pty_id in mine else None


@method("pty.open", PTY_OPEN, blocking=True)
def pty_open(call: Call, params: dict) -> dict:
    kernel = call.kernel
    who = call.who
    argv = [params["cmd"], *params.get("args", [])]
    variables = params.get("env", {})
    for name, value in variables.items():
        if not ENV_NAME.fullmatch(name):
            raise invalid_params(f"env.{name[:64]}", "must be a shell variable name")
        if "\x00" in value:
            raise invalid_params(f"env.{name}", "must not contain NUL characters")
    # Spawning a PTY is policy-gated like exec, and its env like `NAME=value cmd` (env_write):
    # LD_PRELOAD, PATH or BASH_ENV must not slip past the grants.
    assignments = [f"{k}={shlex.quote(v)}" for k, v in variables.items()]
    kernel.exec.gate(who, " ".join([*assignments, shlex.join(argv)]))
    owner = owner_key(who)
    # A slot of max_ptys is held from the check until the PTY is in the table.
    with kernel.guard.reserved(who.principal, "max_ptys", lambda: kernel.pty_count(who.principal)):
        session = kernel.sessions.get_or_create(who.session)
        cwd, env = session.snapshot(call.who.principal)
        env.update(variables)
        sandbox = kernel.guard.sandbox_spec(
            who.principal, project=kernel.exec.project_of(who)
        )  # None: unconfined
        if sandbox is not None:  # only the env it may read, no secrets (as for exec)
            policy = kernel.guard.for_principal(who.principal)
            env = {**policy.confined_env(env), **variables}
        return kernel.ptys.open(
            cmd=params["cmd"],
            args=params.get("args"),
            cols=params.get("cols", 80),
            rows=params.get("rows", 24),
            env=env,
            cwd=cwd,
            owner=owner,
            sandbox=sandbox,
        )


@method("pty.send", PTY_SEND, blocking=True)
def pty_send(call: Call, params: dict) -> dict:
    return call.kernel.ptys.send(params["pty_id"], params["input"], _owner(call, params["pty_id"]))


@method("pty.read", PTY_READ)
def pty_read(call: Call, params: dict) -> dict:
    return call.kernel.ptys.read(
        params["pty_id"], call.conn.id, _owner(call, params["pty_id"]), params.get("scrollback", 0)
    )


@method("pty.resize", PTY_RESIZE)
def pty_resize(call: Call, params: dict) -> dict:
    return call.kernel.ptys.resize(
        params["pty_id"], params["cols"], params["rows"], _owner(call, params["pty_id"])
    )


@method("pty.close", PTY_CLOSE, blocking=True)
def pty_close(call: Call, params: dict) -> dict:
    return call.kernel.ptys.close(params["pty_id"], _owner(call, params["pty_id"]))


@method("pty.list", PTY_LIST)
def pty_list(call: Call, params: dict) -> dict:
    if not params.get("all"):
        return {"ptys": call.kernel.ptys.list(owner_key(call.who))}
    if not call.kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(ErrorCode.DENIED, "pty.list all is for approvers")
    rows = []
    for item in call.kernel.ptys.list(None):
        session, _, principal = str(item.pop("owner", "")).partition("\x00")
        rows.append({**item, "session": session, "principal": principal})
    return {"ptys": rows}
