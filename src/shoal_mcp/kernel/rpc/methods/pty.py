"""pty.open / send / read / resize / close / list (docs/protocol.md, PTYs)."""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from ....protocol.errors import invalid_params
from ....protocol.params import PTY_CLOSE, PTY_OPEN, PTY_READ, PTY_RESIZE, PTY_SEND
from ...access.identity import owner_key
from ..registry import method

if TYPE_CHECKING:
    from ..server import Call

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    with kernel.guard.quota_lock(who.principal, "max_ptys"):  # check and open as one step
        kernel.guard.check_quota(who.principal, "max_ptys", kernel.pty_count(who.principal))
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
    return call.kernel.ptys.send(params["pty_id"], params["input"], owner_key(call.who))


@method("pty.read", PTY_READ)
def pty_read(call: Call, params: dict) -> dict:
    return call.kernel.ptys.read(
        params["pty_id"], call.conn.id, owner_key(call.who), params.get("scrollback", 0)
    )


@method("pty.resize", PTY_RESIZE)
def pty_resize(call: Call, params: dict) -> dict:
    return call.kernel.ptys.resize(
        params["pty_id"], params["cols"], params["rows"], owner_key(call.who)
    )


@method("pty.close", PTY_CLOSE, blocking=True)
def pty_close(call: Call, params: dict) -> dict:
    return call.kernel.ptys.close(params["pty_id"], owner_key(call.who))


@method("pty.list")
def pty_list(call: Call, params: dict) -> dict:
    return {"ptys": call.kernel.ptys.list(owner_key(call.who))}
