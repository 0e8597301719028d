"""session.attach / cwd / env / reef, ping and parse."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....protocol.discovery import project_session
from ....protocol.limits import DEFAULT_SESSION
from ....protocol.params import PARSE, SESSION_ATTACH
from ...access.identity import Principal
from ...effects import analyzer
from ...exec.reef import reef
from ...values.elision import ElideOptions
from ..registry import method

if TYPE_CHECKING:
    from ..server import Call


@method("ping")
def ping(call: Call, params: dict) -> dict:
    reply: dict = {"pong": True, "kernel": call.kernel.info()}
    who = call.conn.who
    if who is not None and call.cpu is not None:
        # Never held itself (CPU_UNMETERED_METHODS): a client whose calls wait learns it
        # is throttled, by how long, rather than taking the kernel for stalled.
        wait = call.cpu.debt().get(who.principal, 0.0)
        if wait > 0:
            reply["throttled_s"] = round(wait, 3)
    return reply


@method("session.attach", SESSION_ATTACH)
def attach(call: Call, params: dict) -> dict:
    kernel = call.kernel
    # No session named: the session of the client's working directory (its project),
    # created there; a raw client that says neither gets the default one.
    name = params.get("session") or (
        project_session(params["cwd"]) if params.get("cwd") else DEFAULT_SESSION
    )
    principal = kernel.guard.authenticate(params.get("token"))
    session = kernel.sessions.get_or_create(name, params.get("cwd"))
    # Counted and taken as one step, so parallel attaches cannot overshoot the budget.
    with kernel.guard.quota_lock(principal, "max_connections"):
        was = call.conn.who
        kernel.check_connection_budget(principal, was is not None and was.principal == principal)
        call.conn.who = Principal(name, principal)
    call.conn.client = params.get("client", {})
    kernel.attached.add(call.conn)
    kernel.exec.warm_up(call.conn.who)  # the first exec finds its supervisor started
    cwd, _ = session.snapshot()
    return {
        "session": name,
        "principal": principal,
        "caps": kernel.guard.caps(principal),
        "cwd": cwd,
        "env_hash": session.env_hash(),
        "elide_defaults": ElideOptions().as_dict(),
        "channels": ["journal", "session.transcript", "approval", "task.N", "pty.N", "user.*"],
        "kernel": kernel.info(),
    }


@method("session.cwd")
def cwd(call: Call, params: dict) -> dict:
    session = call.kernel.sessions.get_or_create(call.who.session)
    return {"session": session.name, "cwd": session.snapshot()[0]}


@method("session.env")
def env(call: Call, params: dict) -> dict:
    session = call.kernel.sessions.get_or_create(call.who.session)
    _, env_vars = session.snapshot()
    readable = call.kernel.guard.for_principal(call.who.principal).env_readable
    values = {k: v for k, v in env_vars.items() if readable(k)}
    return {
        "session": session.name,
        "names": sorted(env_vars),
        "values": values,
        "env_hash": session.env_hash(),
    }


@method("session.reef", blocking=True)
def session_reef(call: Call, params: dict) -> dict:
    session = call.kernel.sessions.get_or_create(call.who.session)
    cwd_now, env_vars = session.snapshot()
    guard = call.kernel.guard
    # Version probes run programs from the session's PATH: confined like the principal's
    # exec, or not at all when its policy wants a sandbox this kernel cannot give.
    spec = guard.sandbox_spec(call.who.principal)
    wants_box = guard.for_principal(call.who.principal).sandboxed
    return reef(cwd_now, env_vars, sandbox=spec, probe=spec is not None or not wants_box)


@method("parse", PARSE)
def parse(call: Call, params: dict) -> dict:
    return analyzer.parse_summary(params["src"])
