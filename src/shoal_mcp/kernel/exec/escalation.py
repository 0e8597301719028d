"""Denials that say what to ask for, and approvals that grant exactly that (issue 26).

* After a sandboxed exec failed, :meth:`Escalation.denied` reads the end of its stderr
  (``access/denials.py``); when the sandbox refused something it stores a plan for
  the same source whose ``requested`` targets are what was refused, so the reply can
  name the one call that asks for them (``shoal_cap_request`` with that plan).
* :meth:`Escalation.for_apply` turns an approved plan into the extra grants of its one
  ``plan.apply`` (``access/widen.py``); a plan approved for the session adds them to
  the session's grants for that principal (:meth:`Escalation.session_grants`), until
  revoked (``grants.revoke``) or the kernel restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..access import denials, widen
from ..access.identity import Principal
from ..access.plans import Plan, PlanStore, plan_ref
from ..access.widen import Widening
from ..config.limits import STDERR_DENIALS_BYTES
from ..effects import analyzer
from ..owner.tables import TABLES

if TYPE_CHECKING:
    from ..access.guard import Guard


_KINDS = ("write", "read", "net")


@dataclass(frozen=True)
class RunGrants:
    """How one run's sandbox differs from its principal's usual one: an approval's
    extra grants, or an approved unconfined run."""

    extra: Widening | None = None
    unconfined: bool = False


class Escalation:
    def __init__(self, guard: Guard, plans: PlanStore) -> None:
        self.guard = guard
        self.plans = plans
        # (session, principal) -> what approvals granted it for the session
        self._granted: dict[tuple[str, str], Widening] = {}

    # -- session grants -----------------------------------------------------------------

    def session_grants(self, who: Principal) -> Widening:
        with TABLES:
            return self._granted.get((who.session, who.principal), Widening())

    def grant_for_session(self, who: Principal, extra: Widening) -> None:
        with TABLES:
            had = self._granted.get((who.session, who.principal), Widening())
            self._granted[(who.session, who.principal)] = Widening(
                tuple(sorted({*had.write, *extra.write})),
                tuple(sorted({*had.read, *extra.read})),
                net=tuple(sorted({*had.net, *extra.net})),
            )

    def listed(self) -> list[dict]:
        with TABLES:
            return [
                {
                    "session": s,
                    "principal": p,
                    "write": list(w.write),
                    "read": list(w.read),
                    "net": list(w.net),
                }
                for (s, p), w in sorted(self._granted.items())
                if not w.empty
            ]

    def revoke(self, session: str, principal: str, target: str | None) -> int:
        """Take back ``principal``'s session grants (one ``target`` path, or all); how
        many paths went."""
        with TABLES:
            had = self._granted.get((session, principal))
            if had is None:
                return 0
            if target is None:
                del self._granted[(session, principal)]
                return len(had.write) + len(had.read) + len(had.net)
            kept = Widening(
                tuple(p for p in had.write if p != target),
                tuple(p for p in had.read if p != target),
                net=tuple(h for h in had.net if h != target),
            )
            self._granted[(session, principal)] = kept
            return sum(len(had.__dict__[k]) - len(kept.__dict__[k]) for k in _KINDS)

    def _proxy_refusals(self, exec_id: int | None) -> list[dict]:
        """What the egress proxy refused this exec (net/log.py), as denials."""
        egress = self.guard.confinement.egress
        if egress is None or exec_id is None:
            return []
        out = []
        for a in egress.log.refused(exec_id):
            entry = {"access": "connect", "host": a.host, "port": a.port, "source": "proxy"}
            out.append({**entry, "why": a.why})
        return out

    # -- applying an approved plan --------------------------------------------------------

    def for_apply(
        self, who: Principal, plan: Plan, project: tuple[str, ...], *, approved: bool
    ) -> Widening | None:
        """The extra grants of this apply of ``plan`` (``approved``: a human approved it);
        None when nothing widens: not approved, or the principal is not confined."""
        if not approved or not self.guard.isolated(who.principal):
            return None
        policy = self.guard.for_principal(who.principal, project)
        extra = widen.widening(
            plan.targets(),
            plan.approved_targets,
            writable=lambda p: policy.grants("fs_write", p),
            hidden=self.hidden(who, project),
            forbidden=self.guard.confinement.forbidden,
        )
        if plan.scope == "session" and not extra.empty:
            self.grant_for_session(who, extra)
        return extra

    def hidden(self, who: Principal, project: tuple[str, ...]) -> tuple[str, ...]:
        """What the principal's view hides (secrets, the kernel's dirs)."""
        return self._view_list(who, project, "hide")

    def writable(self, who: Principal, project: tuple[str, ...]) -> Callable[[str], bool]:
        """Whether the principal's sandbox lets it write a path: its grants, minus what
        the view keeps read-only whatever they say (the trusted base, git hooks)."""
        policy = self.guard.for_principal(who.principal, project)
        protected = self._view_list(who, project, "protect")
        return lambda p: (
            policy.grants("fs_write", p)
            and not any(p == q or p.startswith(q.rstrip("/") + "/") for q in protected)
        )

    def _view_list(self, who: Principal, project: tuple[str, ...], key: str) -> tuple[str, ...]:
        spec = self.guard.sandbox_spec(who.principal, project=project)
        view = spec.view if spec is not None else None
        return tuple(view[key]) if view else ()

    # -- after a failed sandboxed exec ----------------------------------------------------

    def explain(
        self,
        who: Principal,
        src: str,
        judged: tuple[analyzer.Analysis, str, str],
        home: str,
        err_tail: bytes,
        project: tuple[str, ...],
        store: Callable[[Plan], Plan],
        exec_id: int | None = None,
    ) -> dict:
        """The reply's ``sandbox_denied`` and ``ask`` for a failed run whose source is
        ``judged`` (its analysis, the session's cwd and env hash now, which an apply
        of the plan is checked against); empty when the sandbox refused nothing.
        ``exec_id``: its journal row, which the egress proxy's refusals name."""
        analysis, cwd, env_hash = judged
        found, plan = self.denied(
            who,
            exec_id=exec_id,
            src=src,
            cwd=cwd,
            env_hash=env_hash,
            effects=analysis.effects,
            reversibility=analysis.reversibility,
            err_tail=err_tail,
            home=home,
            project=project,
        )
        if plan is None:
            return {}
        plan = store(plan)
        call = f'shoal_cap_request {{"plan_ref": "{plan.ref}"}}'
        return {
            "sandbox_denied": found,
            "ask": {
                "plan_ref": plan.ref,
                "uri": plan.uri,
                "hint": f"to do it, ask the human: {call}, then shoal_apply once approved",
            },
        }

    def denied(
        self,
        who: Principal,
        *,
        src: str,
        cwd: str,
        env_hash: str,
        effects: list[dict],
        reversibility: str,
        err_tail: bytes,
        home: str,
        project: tuple[str, ...],
        exec_id: int | None = None,
    ) -> tuple[list[dict], Plan | None]:
        """What the sandbox refused this run, and a stored plan asking for it."""
        if not self.guard.isolated(who.principal):
            return [], None
        policy = self.guard.for_principal(who.principal, project)
        proxied = self.guard.confinement.routes_network()
        found = self._proxy_refusals(exec_id) + denials.find(
            err_tail[-STDERR_DENIALS_BYTES:].decode("utf-8", "replace"),
            cwd=cwd,
            home=home,
            writable=self.writable(who, project),
            hidden=self.hidden(who, project),
            predicted=effects,
            own_network=proxied or not policy.net_grants,
        )
        found = _dedupe_hosts(found)
        if not found:
            return [], None
        requested = [_as_effect(d) for d in found]
        ref = plan_ref(who.session, who.principal, src, [*effects, *requested], cwd, env_hash)
        plan = Plan(
            ref,
            who.session,
            who.principal,
            src,
            cwd,
            effects,
            reversibility,
            "ask",
            ["the sandbox refused: " + ", ".join(_label(d) for d in found)],
            env_hash=env_hash,
            requested=requested,
        )
        return found, plan


def _dedupe_hosts(found: list[dict]) -> list[dict]:
    """One entry per refused host: the proxy's (first, with its port and reason) wins
    over what the program's error message said about the same host."""
    seen: set[str] = set()
    out = []
    for d in found:
        if d["access"] == "connect":
            if d["host"] in seen:
                continue
            seen.add(d["host"])
        out.append(d)
    return out


def _as_effect(denial: dict) -> dict:
    if denial["access"] == "connect":
        port = denial.get("port")
        return {"kind": "net_connect", "target": f"{denial['host']}:{port or '*'}"}
    return {
        "kind": "fs_read" if denial["access"] == "read" else "fs_write",
        "target": denial["path"],
    }


def _label(denial: dict) -> str:
    where = denial.get("path") or denial.get("host")
    return f"{denial['access']} {where}"
