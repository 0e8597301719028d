"""kernel.status: what `shoal kernel status` shows."""

from __future__ import annotations

import os
import time

from ..registry import method


@method("kernel.status")
def kernel_status(call, params):
    kernel = call.kernel
    return {
        **kernel.info(),
        "socket": str(kernel.config.socket),
        "state_dir": str(kernel.config.state_dir),
        "uptime_s": round(time.time() - kernel.started, 3),
        "sessions": kernel.sessions.names(),
        "tasks_running": kernel.tasks.running_total(),
        "ptys": len(kernel.ptys.list(None)),
        "connections": kernel.connection_count(),
        "uid": os.geteuid(),
    }
