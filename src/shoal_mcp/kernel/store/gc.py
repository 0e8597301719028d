"""``store.gc``: prune stored outputs by age and by total size (docs/configuration.md,
"Cleanup"; docs/decisions.md, "Garbage collection").

What goes: ``out:N`` values older than the age limit, then the oldest further ones
until the blobs still referenced fit the size limit. What stays, whatever the limits:
every value of a *live* session (one a client is attached to now), and every blob that
a kept value still references (outputs are deduplicated by hash, so one blob can back
an old and a new ``out:N``). A pruned ``out:N`` keeps its number, as a tombstone that
says when it was removed, so numbers are never reused. The journal is history and is
kept. A dry run (the default of ``shoal gc``) reports what would go and changes nothing.

Two things follow the pruned outputs: their ``$SHOAL_OUT/<n>`` entries (hard links or
copies of the blobs; a link would keep a deleted blob's bytes on disk and readable),
and long journal texts no journal row refers to any more (``journal_texts``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from ...protocol.errors import ErrorCode
from ..config.limits import GC_ORPHAN_GRACE_S, GC_SAMPLE_REFS
from .cas import ContentStore
from .db import Database

TOMBSTONE_TAG = "error"

TEXT_REFS = """SELECT json_extract(d.value, '$.hash') FROM journal, json_each(journal.outputs) d
    WHERE json_valid(journal.outputs) AND json_extract(d.value, '$.kind') IN ('src', 'effects')"""
"""The ``journal_texts`` hashes the journal refers to (``store_once`` descriptors)."""
ORPHAN_TEXTS = f"SELECT hash, len FROM journal_texts WHERE hash NOT IN ({TEXT_REFS})"


class OutputDirs(Protocol):
    """``$SHOAL_OUT`` as gc sees it (``kernel.values.outputs.SharedOutputs``)."""

    def session_dir(self, principal: str, session: str) -> Path: ...

    def remove(self, principal: str, session: str, numbers: list[int]) -> int: ...


@dataclass
class GcPlan:
    """The outcome of a gc pass (or what a dry run would do)."""

    victims: list[tuple[str, int]] = field(default_factory=list)  # (session, n)
    blobs: dict[str, int] = field(default_factory=dict)  # hash -> size, to delete
    kept_live: int = 0
    bytes_before: int = 0
    # $SHOAL_OUT entries of pruned (or earlier pruned) outputs: (principal, session) -> ns
    shoal_out: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    texts: dict[str, int] = field(default_factory=dict)  # journal_texts hash -> chars

    def report(self, dry_run: bool) -> dict[str, Any]:
        freed = sum(self.blobs.values())
        return {
            "dry_run": dry_run,
            "values": len(self.victims),
            "refs": [f"{s}:out:{n}" for s, n in self.victims[:GC_SAMPLE_REFS]],
            "blobs": len(self.blobs),
            "bytes_freed": freed,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_before - freed,
            "kept_live_values": self.kept_live,
            "shoal_out_entries": sum(len(ns) for ns in self.shoal_out.values()),
            "journal_texts": len(self.texts),
            "journal_text_chars": sum(self.texts.values()),
        }


def value_references(db: Database) -> Iterator[tuple[str, str]]:
    """``(session:out:N, hash)`` for every blob a stored value (not a tombstone) references."""
    for r in db.query("SELECT session, n, value FROM transcript ORDER BY session, n"):
        value = orjson.loads(r["value"])
        if isinstance(value, dict) and value.get("gc_removed"):
            continue
        for digest in blob_hashes(value):
            yield f"{r['session']}:out:{r['n']}", digest


def blob_hashes(value: Any) -> Iterator[str]:
    """Every ``{"$": "blob", "hash": H}`` inside a stored value."""
    if isinstance(value, dict):
        if value.get("$") == "blob" and isinstance(value.get("hash"), str):
            yield value["hash"]
            return
        for item in value.values():
            yield from blob_hashes(item)
    elif isinstance(value, list):
        for item in value:
            yield from blob_hashes(item)


class GarbageCollector:
    def __init__(self, db: Database, cas: ContentStore, outputs: OutputDirs | None = None) -> None:
        self.db = db
        self.cas = cas
        self.outputs = outputs

    def plan(
        self, live_sessions: set[str], max_age_s: float | None, max_bytes: int | None
    ) -> GcPlan:
        now = time.time()
        sizes = {r["hash"]: int(r["size"]) for r in self.db.query("SELECT hash, size FROM blobs")}
        rows = []
        kept: set[tuple[str, int]] = set()  # values alive after this pass
        owners: set[tuple[str, str]] = set()  # (principal, session) with values
        # Storing order (rowid), not ts: a wall clock stepped back must not make the
        # newest outputs look oldest (issue 31). Age (max_age_s) still reads ts.
        query = "SELECT session, n, ts, value, principal FROM transcript ORDER BY rowid"
        for r in self.db.query(query):
            owners.add((r["principal"], r["session"]))
            value = orjson.loads(r["value"])
            if isinstance(value, dict) and value.get("gc_removed"):
                continue  # already a tombstone
            rows.append((r["session"], int(r["n"]), float(r["ts"]), set(blob_hashes(value))))
            kept.add((r["session"], int(r["n"])))
        plan = GcPlan(bytes_before=sum(sizes.values()))
        refs: dict[str, int] = {}  # hash -> kept values referencing it
        for _, _, _, hashes in rows:
            for h in hashes:
                refs[h] = refs.get(h, 0) + 1
        kept_bytes = sum(sizes.get(h, 0) for h in refs)
        for session, n, ts, hashes in rows:  # oldest first
            if session in live_sessions:
                plan.kept_live += 1
                continue
            too_old = max_age_s is not None and ts < now - max_age_s
            too_big = max_bytes is not None and kept_bytes > max_bytes
            if not (too_old or too_big):
                continue
            plan.victims.append((session, n))
            for h in hashes:
                refs[h] -= 1
                if refs[h] == 0:
                    plan.blobs[h] = sizes.get(h, 0)
                    kept_bytes -= sizes.get(h, 0)
        for h, size in sizes.items():  # blobs no value references (a crash mid-finalize)
            if h not in refs and self._orphan_settled(h, now):
                plan.blobs[h] = size
        kept.difference_update(plan.victims)
        plan.shoal_out = self._stale_entries(owners, kept)
        plan.texts = {r["hash"]: int(r["len"]) for r in self.db.query(ORPHAN_TEXTS)}
        return plan

    def _stale_entries(
        self, owners: set[tuple[str, str]], kept: set[tuple[str, int]]
    ) -> dict[tuple[str, str], list[int]]:
        """``$SHOAL_OUT/<n>`` entries whose ``out:N`` is pruned (now or by an earlier gc)."""
        stale: dict[tuple[str, str], list[int]] = {}
        if self.outputs is None:
            return stale
        for principal, session in sorted(owners):
            target = self.outputs.session_dir(principal, session)
            try:
                names = [p.name for p in target.iterdir()]
            except (FileNotFoundError, NotADirectoryError):
                continue
            ns = sorted(int(x) for x in names if x.isdigit() and (session, int(x)) not in kept)
            if ns:
                stale[(principal, session)] = ns
        return stale

    def _orphan_settled(self, digest: str, now: float) -> bool:
        # A blob is ingested just before its out:N row is written: only old orphans go.
        try:
            return self.cas.path_of(digest).stat().st_mtime < now - GC_ORPHAN_GRACE_S
        except FileNotFoundError:
            return True

    def apply(self, plan: GcPlan) -> None:
        """Tombstone the victims, then delete the blobs nothing references any more."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self.db.transaction() as conn:
            for session, n in plan.victims:
                tomb = {
                    "$": TOMBSTONE_TAG,
                    "code": int(ErrorCode.UNKNOWN_REF),
                    "msg": f"out:{n} was removed by shoal gc at {stamp}",
                    "hint": "outputs past the retention are pruned; the journal keeps the command",
                    "gc_removed": stamp,
                }
                conn.execute(
                    "UPDATE transcript SET value = ? WHERE session = ? AND n = ?",
                    (orjson.dumps(tomb).decode(), session, n),
                )
        self._remove_entries(plan)
        for digest in list(plan.blobs):
            # Judged again at the moment of deletion, under the store's generation lock:
            # an exec finalizing now pins its blobs before it looks for them, so a value
            # stored meanwhile that shares this output keeps it.
            if not self.cas.delete_unreferenced(digest, self._still_referenced):
                del plan.blobs[digest]
        with self.db.transaction() as conn:  # one statement: a journal row and its text
            # are inserted in one transaction, so a text being recorded is never seen alone
            gone = {r["hash"] for r in conn.execute(ORPHAN_TEXTS)}
            conn.execute(f"DELETE FROM journal_texts WHERE hash NOT IN ({TEXT_REFS})")
        plan.texts = {h: c for h, c in plan.texts.items() if h in gone}

    def _remove_entries(self, plan: GcPlan) -> None:
        """Delete the planned ``$SHOAL_OUT`` entries whose value is a tombstone now."""
        if self.outputs is None:
            return
        for (principal, session), ns in plan.shoal_out.items():
            pruned = [n for n in ns if self._is_tombstone(session, n)]
            self.outputs.remove(principal, session, pruned)
            plan.shoal_out[(principal, session)] = pruned

    def _is_tombstone(self, session: str, n: int) -> bool:
        rows = self.db.query(
            "SELECT value FROM transcript WHERE session = ? AND n = ?", (session, n)
        )
        if not rows:
            return True  # no value at all: nothing may be shown under that number
        value = orjson.loads(rows[0]["value"])
        return isinstance(value, dict) and bool(value.get("gc_removed"))

    def _still_referenced(self, digest: str) -> bool:
        rows = self.db.query(
            "SELECT 1 FROM transcript WHERE value LIKE ? LIMIT 1", (f'%"hash":"{digest}"%',)
        )
        return bool(rows)
