"""Starting the egress proxy with the kernel (``app.py``), when sandboxed trees can be
given network namespaces of their own; otherwise none runs and the Landlock TCP port
rules stay the fallback (docs/security.md, "Network")."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..access.confine import Confinement
from ..owner.loop import OwnerLoop
from .log import EgressLog
from .proxy import Attribution, EgressProxy
from .resolve import Resolver, map_from_env

log = logging.getLogger(__name__)


def start_egress(
    state: Path, db: Any, confinement: Confinement, attribute: Attribution, loop: OwnerLoop
) -> EgressProxy | None:
    """The kernel's proxy, installed in ``confinement`` and run on ``loop``; None where
    it has no use."""
    if not (confinement.enforcing and confinement.support.view):
        return None
    try:
        fixed = map_from_env()
    except ValueError as e:
        log.warning("%s; resolving every name through DNS", e)
        fixed = {}
    if fixed:
        log.warning("egress: test/development resolver map in force: %s", fixed)
    proxy = EgressProxy(str(state / "egress"), EgressLog(db), attribute, Resolver(fixed), loop)
    confinement.egress = proxy
    return proxy
