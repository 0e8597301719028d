"""Find across runs: ``match`` over every stored output a caller could read, newest first.

``value.get {ref: "outputs", match, since?, until?, session?, stream?, ok?, cursor?}``
(docs/protocol.md, Find across runs; docs/decisions.md, Find across runs). The walk:

* Stored outputs come from the transcript in keyset pages of ``FIND_ROWS_BATCH`` rows,
  newest first (``n`` descending in one session; ``(ts, session, n)`` across sessions),
  filtered in SQL by time, principal and ``ok``. Visibility is exactly that of a read of
  ``out:N``: the caller's own outputs, every principal's with ``journal_read = "all"``.
* Each stream's blob is searched with the ``match`` engine (pread blocks, the framing
  core's scanners, one compiled matcher for the whole call). A blob shared by several
  outputs is searched once per call: its result is reused for every output naming it.
* Pruned outputs (``shoal gc`` tombstones) are skipped and counted; so are blobs that
  can no longer be read (missing or corrupted files).
* The time budget ``FIND_BUDGET_S`` is checked between outputs: past it the walk stops
  and the reply carries a cursor naming the first output not searched. Counts are exact
  for what was searched; nothing times out.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from ...protocol.errors import ErrorCode, RpcError, invalid_params
from ...protocol.framing import count_lines_with
from ..config.limits import FIND_BUDGET_S, FIND_CMD_HEAD_CHARS, FIND_ROWS_BATCH, MATCH_BLOCK
from ..store.cas import ContentStore, StoredBlob
from ..store.db import Database
from .match import Found, Hit, Matcher, MatchSpec, compile_matcher, search

STREAMS = ("out", "err")
UNREADABLE = frozenset({ErrorCode.UNKNOWN_REF, ErrorCode.CORRUPTED})
"""Errors that mean a stored blob is gone or damaged: that output is skipped, counted."""

NO_HITS = Found()
"""The result of every blob without a hit (never changed: results are only read)."""

_CURSOR = re.compile(r"(\d{1,19}),(out|err),(\d{1,19}),(\d{1,19})(?:,([0-9.e+-]{1,32}),(.+))?")


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a search continues: output ``n`` (of ``session``, stored at ``ts``: the
    order across sessions), its ``stream`` from byte ``offset``, whose line is line
    ``line`` (0-based). A search of one session needs neither ``ts`` nor ``session``."""

    n: int
    stream: str = "out"
    offset: int = 0
    line: int = 0
    ts: float | None = None
    session: str | None = None

    def encode(self, across_sessions: bool) -> str:
        text = f"{self.n},{self.stream},{self.offset},{self.line}"
        return f"{text},{self.ts!r},{self.session}" if across_sessions else text

    @classmethod
    def parse(cls, text: str, across_sessions: bool) -> Cursor:
        m = _CURSOR.fullmatch(text)
        try:
            if m is None or (across_sessions and m.group(5) is None):
                raise ValueError(text)
            n, stream, offset, line, ts, session = m.groups()
            return cls(
                int(n), stream, int(offset), int(line), None if ts is None else float(ts), session
            )
        except ValueError:
            raise invalid_params("cursor", "not a cursor from this search across runs") from None


@dataclass(frozen=True, slots=True)
class FindQuery:
    """One search across runs, its params already validated."""

    spec: MatchSpec
    session: str | None  # None: every session
    principal: str | None  # None: every principal's outputs (journal_read = all)
    since: float | None = None
    until: float | None = None
    ok: bool | None = None
    streams: tuple[str, ...] = STREAMS
    cursor: Cursor | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """A stored output as the search sees it: where it is, its journal head, its blobs."""

    session: str
    n: int
    principal: str
    ts: float
    ok: bool | None
    status: int | None
    cmd: str
    blobs: dict[str, str]  # stream -> blob hash
    pruned: bool

    @classmethod
    def from_row(cls, row: Any) -> Run:
        ok, status, out_hash, err_hash, pruned = orjson.loads(row["head"])
        blobs = {
            s: h for s, h in zip(STREAMS, (out_hash, err_hash), strict=True) if isinstance(h, str)
        }
        return cls(
            session=row["session"],
            n=int(row["n"]),
            principal=row["principal"],
            ts=float(row["ts"]),
            ok=ok if isinstance(ok, bool) else None,
            status=status if isinstance(status, int) and not isinstance(status, bool) else None,
            cmd=row["cmd"] if isinstance(row["cmd"], str) else "",
            blobs=blobs,
            pruned=pruned is not None,
        )

    def at(self, stream: str = "out", offset: int = 0, line: int = 0) -> Cursor:
        return Cursor(self.n, stream, offset, line, self.ts, self.session)

    def is_at(self, cursor: Cursor) -> bool:
        return self.n == cursor.n and cursor.session in (None, self.session)


@dataclass(slots=True)
class RunHit:
    run: Run
    stream: str
    hit: Hit

    def after(self) -> Cursor:
        """The cursor of the line after this hit (where the next page starts)."""
        return self.run.at(self.stream, self.hit.end + 1, self.hit.line + 1)


@dataclass
class FindOutcome:
    hits: list[RunHit] = field(default_factory=list)  # the first hits of the walk, in order
    total: int = 0  # matching lines in the outputs searched (from the cursor on)
    runs: int = 0  # outputs searched
    blobs: int = 0  # distinct blobs searched
    bytes: int = 0  # bytes searched
    pruned: int = 0  # outputs pruned by gc, skipped
    unreadable: int = 0  # outputs whose blob is missing or damaged, skipped
    cut_lines: int = 0  # lines over MATCH_LINE_MAX, searched in their head
    stopped_at: Cursor | None = None  # the budget ran out: the first output not searched

    @property
    def complete(self) -> bool:
        return self.stopped_at is None


# Journal head fields come out of the stored outcome itself (no join with the journal),
# in two JSON parses a row (SQLite 3.40 does not cache parses between calls): one for
# the small fields, one for the command's head (a source can be 1 MiB; only its head
# leaves SQLite).
_HEAD_PATHS = ("$.ok", "$.status", "$.out.hash", "$.err.hash", "$.gc_removed")
_COLUMNS = f"""session, n, principal, ts,
    json_extract(value, {", ".join(f"'{p}'" for p in _HEAD_PATHS)}) AS head,
    substr(json_extract(value, '$.cmd'), 1, {FIND_CMD_HEAD_CHARS * 4}) AS cmd"""


class RunRows:
    """The outputs a query covers, newest first, read in keyset pages (no lease is held
    while blobs are searched)."""

    def __init__(self, db: Database, query: FindQuery) -> None:
        self.db = db
        self.query = query

    def __iter__(self) -> Iterator[Run]:
        after: Cursor | None = self.query.cursor
        inclusive = True  # the cursor's own output is where the search resumes
        while True:
            rows = self.db.query(*self._sql(after, inclusive))
            for row in rows:
                yield Run.from_row(row)
            if len(rows) < FIND_ROWS_BATCH:
                return
            last = rows[-1]
            after = Cursor(int(last["n"]), ts=float(last["ts"]), session=last["session"])
            inclusive = False

    def _sql(self, after: Cursor | None, inclusive: bool) -> tuple[str, list]:
        q = self.query
        where: list[str] = []
        args: list[Any] = []
        op = "<=" if inclusive else "<"
        if q.session is not None:
            where.append("session = ?")
            args.append(q.session)
            if after is not None:
                where.append(f"n {op} ?")
                args.append(after.n)
            order = "n DESC"
        else:
            if after is not None:
                where.append(f"(ts, session, n) {op} (?, ?, ?)")
                args += [after.ts, after.session, after.n]
            order = "ts DESC, session DESC, n DESC"
        if q.principal is not None:
            where.append("principal = ?")
            args.append(q.principal)
        if q.since is not None:
            where.append("ts >= ?")
            args.append(float(q.since))
        if q.until is not None:
            where.append("ts <= ?")
            args.append(float(q.until))
        if q.ok is not None:  # a pruned output's status is gone: it is counted as skipped
            where.append(
                "(json_extract(value, '$.ok') = ? OR json_extract(value, '$.gc_removed') IS NOT NULL)"
            )
            args.append(int(q.ok))
        sql = f"SELECT {_COLUMNS} FROM transcript"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order} LIMIT ?"
        args.append(FIND_ROWS_BATCH)
        return sql, args


class Finder:
    """One search across runs: the walk, the per-call blob results, the counts."""

    def __init__(self, db: Database, cas: ContentStore, query: FindQuery) -> None:
        self.db = db
        self.cas = cas
        self.query = query
        self.matcher: Matcher = compile_matcher(query.spec)
        self.seen: dict[str, Found | None] = {}  # blob hash -> its whole-blob result
        self.block: bytearray | None = None  # the read buffer of _may_match
        self.out = FindOutcome()

    def run(self, budget_s: float = FIND_BUDGET_S) -> FindOutcome:
        deadline = time.monotonic() + budget_s
        cursor = self.query.cursor
        started = False  # every call searches at least one output: a cursor always moves on
        for run in RunRows(self.db, self.query):
            if run.pruned:
                self.out.pruned += 1
                continue
            if started and time.monotonic() > deadline:
                self.out.stopped_at = run.at()
                break
            started = True
            resume = cursor if cursor is not None and run.is_at(cursor) else None
            cursor = None  # only the first output can be the cursor's
            self._search_run(run, resume)
        return self.out

    def _search_run(self, run: Run, resume: Cursor | None) -> None:
        streams = self.query.streams
        if resume is not None and resume.stream in streams:
            streams = streams[streams.index(resume.stream) :]
        unreadable = False
        for stream in streams:
            digest = run.blobs.get(stream)
            if digest is None:
                continue
            start = (resume.offset, resume.line) if resume and resume.stream == stream else (0, 0)
            found = self._blob(digest, *start)
            if found is None:
                unreadable = True
                continue
            self.out.total += found.total
            room = self.query.spec.max - len(self.out.hits)
            self.out.hits.extend(RunHit(run, stream, hit) for hit in found.hits[: max(0, room)])
        if unreadable:
            self.out.unreadable += 1
        else:
            self.out.runs += 1

    def _blob(self, digest: str, offset: int, line: int) -> Found | None:
        """The search of one blob from ``offset``; a whole blob is searched once per call.

        Asked for the hits the reply still has room for: later outputs only ever have
        less room, so a remembered result holds every hit they can show."""
        whole = offset == 0
        if whole and digest in self.seen:
            return self.seen[digest]
        room = max(0, self.query.spec.max - len(self.out.hits))
        try:
            source = self.cas.source(digest)
            size = source.info_.size
            found = Found()
            if offset < size:  # (the empty blob, most runs' stderr, needs no read)
                self.out.blobs += 1
                self.out.bytes += size - offset
                if self._may_match(source, offset, size):
                    spec = replace(self.query.spec, max=room)
                    found = search(source, offset, size, line, spec, self.matcher)
                    self.out.cut_lines += found.cut_lines
        except RpcError as exc:
            if exc.code not in UNREADABLE:
                raise
            found = None
        if whole:  # a blob without hits is remembered as the one shared empty result
            self.seen[digest] = NO_HITS if found is not None and not found.total else found
        return found

    def _may_match(self, source: StoredBlob, start: int, end: int) -> bool:
        """False when bytes ``[start, end)`` lack the literal every match holds.

        Most outputs hold no hit of a rare pattern: for them one memmem pass of the
        framing core (``count_lines_with``, without the GIL) replaces the line-numbering
        scan of ``match``, which counts every newline to number the hits it might find.
        A needle across two read blocks is caught in the joint of the two."""
        needle = self.matcher.literal or self.matcher.prefilter
        if not needle:
            return True
        want = min(MATCH_BLOCK, end - start)
        if self.block is None or len(self.block) < want:  # one buffer per call, grown as
            self.block = bytearray(want)  # needed: a fresh one per blob page-faults
        view = memoryview(self.block)
        keep = len(needle) - 1
        tail = b""
        with source.open_fd() as fd:
            pos = start
            while pos < end:
                got = os.preadv(fd, [view[: min(len(view), end - pos)]], pos)
                if got <= 0:
                    break
                if count_lines_with(view, needle, 0, got):
                    return True
                if tail and needle in tail + bytes(view[: min(keep, got)]):
                    return True
                tail = bytes(view[max(0, got - keep) : got]) if keep else b""
                pos += got
        return False
