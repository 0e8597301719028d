"""Who is calling: the (session, principal) pair every kernel service is keyed by."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, in which session."""

    session: str
    principal: str


def owner_key(who: Principal) -> str:
    """The opaque owner string PTYs are filed under."""
    return f"{who.session}\x00{who.principal}"
