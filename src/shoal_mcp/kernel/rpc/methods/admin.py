"""kernel.status (`shoal kernel status`), store.verify (`shoal doctor --verify`) and
kernel.reload (`shoal kernel reload`)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ....protocol.errors import ErrorCode, RpcError
from ....protocol.params import NONE
from ...admin.config_file import ConfigError
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


@method("kernel.status")
def kernel_status(call: Call, params: dict) -> dict:
    kernel = call.kernel
    status = {
        **kernel.info(),
        "socket": str(kernel.config.socket),
        "uptime_s": round(time.time() - kernel.started, 3),
    }
    if not kernel.guard.for_principal(call.who.principal).approver:
        return status  # operators' view only: other sessions and paths are not an agent's business
    return {
        **status,
        "state_dir": str(kernel.config.state_dir),
        "sessions": kernel.sessions.names(),
        # Sandboxed principals' own cwd/env changes, which only they see (session.adopt).
        "overlays": kernel.sessions.overlays(),
        "tasks_running": kernel.tasks.running_total(),
        "ptys": len(kernel.ptys.list(None)),
        "ptys_reaped": kernel.ptys_reaped(),
        "execs_on_loop": kernel.execs_on_loop(),
        "quick_on_loop": kernel.quick_on_loop(),  # quick calls the owner loop answered
        "connections": kernel.connection_count(),
        "cpu_held_s": {p: round(s, 3) for p, s in call.cpu.held().items()} if call.cpu else {},
        "cpu_debt_s": {p: round(s, 3) for p, s in call.cpu.debt().items()} if call.cpu else {},
        "warm": kernel.warm.stats(),
        "uid": os.geteuid(),
        "config": str(kernel.config.config_path) if kernel.config.config_path else None,
        "policy": str(kernel.config.policy_path) if kernel.config.policy_path else None,
        "require_token": kernel.config.require_token,
        "flags": kernel.config.flags,  # what `shoal kernel restart` passes on
        "package": kernel.package_state(fresh=True),
    }


@method("store.verify", blocking=True)
def store_verify(call: Call, params: dict) -> dict:
    """Every stored output's length and blake3 hash, and the database's quick_check
    (``shoal doctor --verify``); approvers only: it reads every principal's blobs."""
    if not call.kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(ErrorCode.DENIED, "store.verify is for approvers")
    return call.kernel.verify_store()


def _approver_only(call: Call, what: str) -> None:
    if not call.kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(ErrorCode.DENIED, f"{what} is for approvers")


@method("kernel.reload", NONE, blocking=True)
def kernel_reload(call: Call, params: dict) -> dict:
    """kernel.toml and the policy read again and applied; a bad file is refused (-32602,
    data: file, key, why) and the running settings stay."""
    _approver_only(call, "kernel.reload")
    try:
        return call.kernel.reload()
    except ConfigError as exc:
        raise RpcError(
            ErrorCode.INVALID_PARAMS,
            f"refused, nothing changed: {exc}",
            {"file": str(exc.path), "key": exc.key, "why": exc.why},
        ) from None
