"""egress.query: the egress proxy's journal (issue 27), newest first; egress.check:
``shoal doctor``'s end-to-end test of the path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....protocol.params import EGRESS_CHECK, EGRESS_QUERY
from ...net import doctor
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


@method("egress.query", EGRESS_QUERY)
def egress_query(call: Call, params: dict) -> dict:
    """Connection attempts (host, port, allowed, why, bytes each way, the exec's journal
    row); a principal without ``journal_read = all`` sees only its own."""
    kernel = call.kernel
    if kernel.egress is None:
        return {"rows": [], "proxy": False}
    principal = params.get("principal")
    if not kernel.journal_read_all(call.who.principal):
        principal = call.who.principal
    rows = kernel.egress.log.query(
        exec_id=params.get("exec_id"), principal=principal, limit=params.get("limit", 50)
    )
    return {"rows": rows, "proxy": True}


@method("egress.check", EGRESS_CHECK)
def egress_check(call: Call, params: dict) -> dict:
    """A namespace bridged to a channel of its own: an allowed stand-in answers, another
    host is refused, a direct connect finds no route (net/doctor.py)."""
    kernel = call.kernel
    if kernel.egress is None:
        why = kernel.confinement.status()["reason"] or "no namespaces for sandboxed trees"
        return {"proxy": False, "ok": False, "detail": why}
    return {"proxy": True, **doctor.check(kernel.egress)}
