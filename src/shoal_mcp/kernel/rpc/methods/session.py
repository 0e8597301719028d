"""session.attach / cwd / env / reef, ping and parse."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ....protocol.discovery import project_root, project_session
from ....protocol.errors import ErrorCode, RpcError, invalid_params
from ....protocol.limits import AGENT_PRINCIPAL
from ....protocol.params import PARSE, SESSION_ADOPT, SESSION_ATTACH
from ...access.identity import Principal
from ...config.limits import DEFAULT_SESSION
from ...effects import analyzer
from ...exec.reef import reef
from ...owner.tables import TABLES
from ...values.elision import ElideOptions
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


@method("ping", on_loop=True)
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


def project_roots(params: dict) -> tuple[str, ...]:
    """The project an attaching client works in: its ``roots`` (absolute directories
    that exist), else the git work tree of its ``cwd`` (``discovery.project_root``);
    never ``/`` or the home directory, and no path with glob characters."""
    given = [r for r in params.get("roots", ()) if os.path.isabs(r) and os.path.isdir(r)]
    if not given and params.get("cwd"):
        top = project_root(params["cwd"])
        given = [top] if top else []
    return tuple(sorted({os.path.realpath(r) for r in given if not _GLOB_CHARS.intersection(r)}))


_GLOB_CHARS = frozenset("*?[]{}")


@method("session.attach", SESSION_ATTACH)
def attach(call: Call, params: dict) -> dict:
    kernel = call.kernel
    if params.get("cwd") and not os.path.isdir(params["cwd"]):
        # A local client's cwd exists (getcwd says so); a remote one's is named by its
        # user (--remote-dir) and may be a typo: never a session quietly in $HOME.
        raise invalid_params("cwd", f"{params['cwd']!r} is not a directory on this host")
    # No session named: the session of the client's working directory (its project),
    # created there; a raw client that says neither gets the default one.
    name = params.get("session") or (
        project_session(params["cwd"]) if params.get("cwd") else DEFAULT_SESSION
    )
    principal = kernel.guard.authenticate(params.get("token"))
    if params.get("agent") and "token" not in params:
        principal = AGENT_PRINCIPAL  # the downgrade an MCP client asks for: no secret
    session = kernel.sessions.get_or_create(name, params.get("cwd"))
    roots = project_roots(params)
    if roots:
        session.project = roots
    # Counted and taken as one step, so parallel attaches cannot overshoot the budget (a
    # leaf: the policy's budget and the server's connection table).
    with TABLES:
        was = call.conn.who
        kernel.check_connection_budget(principal, was is not None and was.principal == principal)
        call.conn.who = Principal(name, principal)
    call.conn.client = params.get("client", {})
    kernel.attached.add(call.conn)
    kernel.exec.warm_up(call.conn.who)  # the first exec finds its supervisor started
    cwd, _ = session.snapshot(principal)
    return {
        "session": name,
        "principal": principal,
        "caps": kernel.guard.caps(principal),
        "cwd": cwd,
        "env_hash": session.env_hash(principal),
        "elide_defaults": ElideOptions().as_dict(),
        "channels": ["journal", "session.transcript", "approval", "task.N", "pty.N", "user.*"],
        # package_changed: this kernel's files were replaced on disk since it started
        # (clients say `shoal kernel restart`, as for another version).
        "kernel": {**kernel.info(), "package_changed": kernel.package_state()["changed"]},
    }


@method("session.cwd")
def cwd(call: Call, params: dict) -> dict:
    session = call.kernel.sessions.get_or_create(call.who.session)
    return {"session": session.name, "cwd": session.snapshot(call.who.principal)[0]}


@method("session.env")
def env(call: Call, params: dict) -> dict:
    session = call.kernel.sessions.get_or_create(call.who.session)
    _, env_vars = session.snapshot(call.who.principal)
    readable = call.kernel.guard.for_principal(call.who.principal).env_readable
    values = {k: v for k, v in env_vars.items() if readable(k)}
    return {
        "session": session.name,
        "names": sorted(env_vars),
        "values": values,
        "env_hash": session.env_hash(call.who.principal),
    }


@method("session.reef", blocking=True)
def session_reef(call: Call, params: dict) -> dict:
    session = call.kernel.sessions.get_or_create(call.who.session)
    cwd_now, env_vars = session.snapshot(call.who.principal)
    guard = call.kernel.guard
    # Version probes run programs from the session's PATH: confined like the principal's
    # exec, or not at all when its policy wants a sandbox this kernel cannot give.
    spec = guard.sandbox_spec(call.who.principal, project=call.kernel.exec.project_of(call.who))
    wants_box = guard.for_principal(call.who.principal).sandboxed
    return reef(cwd_now, env_vars, sandbox=spec, probe=spec is not None or not wants_box)


@method("session.adopt", SESSION_ADOPT)
def adopt(call: Call, params: dict) -> dict:
    """Apply a sandboxed principal's own cwd/env changes in this session for everyone
    (``shoal session adopt``); approvers only: it is the human taking them over."""
    kernel = call.kernel
    if not kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(ErrorCode.DENIED, "session.adopt is for approvers")
    session = kernel.sessions.get_or_create(call.who.session)
    taken = kernel.sessions.take_over(session, params["principal"])
    if taken is None:
        raise invalid_params("principal", "has no changes of its own in this session")
    cwd, env = session.snapshot()
    return {
        "session": session.name,
        "principal": params["principal"],
        "cwd": cwd,
        "set": sorted(taken.set),
        "unset": sorted(taken.unset),
        "env_hash": session.env_hash(),
    }


@method("parse", PARSE)
def parse(call: Call, params: dict) -> dict:
    return analyzer.parse_summary(params["src"])
