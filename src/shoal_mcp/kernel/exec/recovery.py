"""After a crash: execs the journal still shows ``running`` become ``lost``.

A kernel that died (SIGKILL, power loss) leaves the ``running`` rows of the execs it was
waiting for. At the next start each becomes ``lost``: what its command had spooled is
kept as a partial output (``out:N`` with ``lost: true, partial: true``) and the row
points at it. Then leftover spool files of no row are removed. (docs/decisions.md,
Crash consistency)
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import orjson

from ...protocol import uri
from ...protocol.wiretext import text_node
from ..store.cas import INGEST_BLOCK, ContentStore, Placed
from ..store.db import Database
from ..store.journal import LOST, Journal, JournalEntry
from ..store.sessions import decode_cwd
from ..store.transcript import TranscriptStore

log = logging.getLogger(__name__)

COPY_BLOCK = INGEST_BLOCK

LOST_REASON = "the kernel stopped while this command ran (crash or kill); output is partial"


def recover_lost(
    db: Database, journal: Journal, cas: ContentStore, transcript: TranscriptStore
) -> int:
    """Mark every ``running`` row ``lost`` with its partial output; how many there were."""
    rows = journal.running_rows()
    for row in rows:
        try:
            _recover_one(db, journal, cas, transcript, row)
        except Exception:  # noqa: BLE001 - one bad row must not stop the kernel
            log.exception("recovering journal row %s", row["id"])
            journal.fail(row["id"], LOST_REASON + "; its output could not be recovered")
    return len(rows)


def _snapshot(path: Path) -> Path:
    """A copy of what ``path`` holds now, and ``path`` unlinked.

    The lost command may still be running (nothing contained it once its kernel died)
    and writing to its spool; a copy of the bytes present now is what gets stored, so the
    stored blob cannot grow afterwards.
    """
    size = os.stat(path).st_size
    copy = path.with_name(path.name + ".partial")
    with open(path, "rb") as src, open(copy, "wb") as dst:
        left = size
        while left > 0:
            block = src.read(min(left, COPY_BLOCK))
            if not block:
                break
            dst.write(block)
            left -= len(block)
    path.unlink()
    return copy


def _recover_one(
    db: Database,
    journal: Journal,
    cas: ContentStore,
    transcript: TranscriptStore,
    row: sqlite3.Row,
) -> None:
    spool = orjson.loads(row["spool"]) if row["spool"] else {}
    placed: list[Placed] = []
    for kind in ("out", "err"):
        path = Path(spool[kind]) if kind in spool else None
        if path is not None and path.exists():
            placed.append(cas.place(_snapshot(path)))
    cwd = decode_cwd(row["cwd"]) if row["cwd"] is not None else ""
    outcome: dict = {
        "$": "outcome",
        "status": None,
        "ok": False,
        "lost": True,
        "partial": True,
        "cmd": row["src"],
        "cwd": text_node(cwd),
    }
    outputs = []
    for kind, p in zip(("out", "err"), placed, strict=False):
        outcome[kind] = p.info.node()
        outputs.append({"kind": kind, "hash": p.info.hash, "len": p.info.size, "partial": True})
    n = transcript.allocate(row["session"])
    entry = JournalEntry(
        session=row["session"],
        principal=row["principal"],
        cwd=cwd,
        src=row["src"],
        ok=False,
        ref=uri.out_ref(n),
        outputs=outputs,
        state=LOST,
        error=LOST_REASON,
    )
    try:
        with db.transaction() as conn:
            for p in placed:
                cas.record_in(conn, p.info)
            transcript.insert_in(conn, row["session"], n, row["principal"], outcome)
            journal.finish_in(conn, row["id"], entry)
    except BaseException:
        for p in placed:
            cas.unplace(p)
        raise
    finally:
        for p in placed:
            cas.release(p)
