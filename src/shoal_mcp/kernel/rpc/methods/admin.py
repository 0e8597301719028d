"""kernel.status (what `shoal kernel status` shows) and store.verify (`shoal doctor --verify`)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ....protocol.errors import ErrorCode, RpcError
from ..registry import method

if TYPE_CHECKING:
    from ..server import Call


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
        "tasks_running": kernel.tasks.running_total(),
        "ptys": len(kernel.ptys.list(None)),
        "ptys_reaped": kernel.ptys_reaped(),
        "connections": kernel.connection_count(),
        "cpu_held_s": {p: round(s, 3) for p, s in call.cpu.held().items()} if call.cpu else {},
        "cpu_debt_s": {p: round(s, 3) for p, s in call.cpu.debt().items()} if call.cpu else {},
        "warm": kernel.warm.stats(),
        "uid": os.geteuid(),
    }


@method("store.verify", blocking=True)
def store_verify(call: Call, params: dict) -> dict:
    """Every stored output's length and blake3 hash, and the database's quick_check
    (``shoal doctor --verify``); approvers only: it reads every principal's blobs."""
    if not call.kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(ErrorCode.DENIED, "store.verify is for approvers")
    return call.kernel.verify_store()
