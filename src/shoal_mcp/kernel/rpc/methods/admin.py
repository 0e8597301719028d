"""kernel.status: what `shoal kernel status` shows."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

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
        "connections": kernel.connection_count(),
        "uid": os.geteuid(),
    }
