"""store.gc: prune stored outputs (``kernel/store/gc.py``); for approvers only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....protocol.errors import ErrorCode, RpcError
from ....protocol.params import STORE_GC
from ...store.gc import GarbageCollector
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


@method("store.gc", STORE_GC, blocking=True)
def store_gc(call: Call, params: dict) -> dict:
    kernel = call.kernel
    if not kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(
            ErrorCode.DENIED, "store.gc is for approvers (the local user)", {"method": "store.gc"}
        )
    live = kernel.live_sessions(besides=call.conn)
    collector = GarbageCollector(kernel.db, kernel.cas, kernel.values.outputs)
    plan = collector.plan(live, params.get("max_age_s"), params.get("max_bytes"))
    dry_run = params.get("dry_run", True)
    if not dry_run:
        collector.apply(plan)
    return {**plan.report(dry_run), "live_sessions": sorted(live)}
