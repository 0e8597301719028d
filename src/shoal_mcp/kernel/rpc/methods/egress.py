"""egress.query: the egress proxy's journal (issue 27), newest first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....protocol.params import EGRESS_QUERY
from ..registry import method

if TYPE_CHECKING:
    from ..server import Call


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
