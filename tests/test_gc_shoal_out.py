"""``shoal gc`` prunes what follows a pruned output: its ``$SHOAL_OUT`` entry and long
journal texts no journal row refers to. Real kernel, real CLI processes, real files."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from shoal_mcp.client import KernelClient
from tests.support.kernel import close_client
from tests.test_cli import shoal
from tests.test_cli_lifecycle import env  # noqa: F401 - the fixture

TOKEN = b"PRUNE-199999-7f3a"  # a line of the pruned output, not in its command


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _exec(e: dict, session: str, src: str, check: bool = True) -> dict:
    args = ("--session", session, "exec", "--json", src)
    return json.loads(shoal(e, *args, check=check).stdout)


def test_gc_removes_pruned_outputs_from_shoal_out(env):  # noqa: F811
    state = Path(env["SHOAL_STATE_DIR"])
    big = "seq 1 200000 | sed 's/^/PRUNE-/;s/$/-7f3a/'"  # ~3.5 MB: a stored blob
    _exec(env, "old", big)
    seen = _exec(env, "old", 'wc -l < "$SHOAL_OUT/1/out"; echo "$SHOAL_OUT"')
    lines = shoal(
        env, "--session", "old", "get", seen["ref"], "--path", ".out", "--format", "raw"
    ).stdout
    count, old_dir = lines.split()
    assert count == "200000" and Path(old_dir, "1", "out").is_file()
    _exec(env, "live", "seq 1 100000")  # the live session's output, kept whatever the age
    _exec(env, "live", 'test -r "$SHOAL_OUT/1/out"')
    live = KernelClient(Path(env["SHOAL_SOCKET"]))
    try:
        live.call("session.attach", {"session": "live"})
        dry = json.loads(shoal(env, "gc", "--older-than", "0", "--json").stdout)
        assert dry["values"] == 2 and dry["shoal_out_entries"] >= 1
        assert Path(old_dir, "1", "out").is_file()  # a dry run removes nothing
        assert "$SHOAL_OUT" in shoal(env, "gc", "--older-than", "0").stdout

        done = json.loads(shoal(env, "gc", "--older-than", "0", "--delete", "--json").stdout)
        assert done["shoal_out_entries"] == dry["shoal_out_entries"]
        assert not Path(old_dir, "1").exists()
        # No copy, no hard link of the pruned bytes is left anywhere in the state dir.
        assert _files_holding(state, TOKEN) == []
        # A second pass at once finds nothing more to remove (later execs of "old" make
        # new entries: $SHOAL_OUT is synced in the background after each exec).
        again = json.loads(shoal(env, "gc", "--older-than", "0", "--json").stdout)
        assert again["shoal_out_entries"] == 0
        # The next exec of that session does not see it; the live session keeps its own.
        after = _exec(env, "old", 'test -e "$SHOAL_OUT/1/out"', check=False)
        assert after["value"]["status"] == 1
        kept = _exec(env, "live", 'tail -n 1 "$SHOAL_OUT/1/out"')
        assert shoal(env, "--session", "live", "get", kept["ref"]).stdout.startswith("100000")
    finally:
        close_client(live)


def test_gc_deletes_journal_texts_no_row_refers_to(env):  # noqa: F811
    long_src = ": " + "x" * 6000 + "; echo long"  # over SRC_INLINE_CHARS: stored once by hash
    _exec(env, "s", long_src)
    db = sqlite3.connect(Path(env["SHOAL_STATE_DIR"]) / "journal.sqlite3")
    try:
        (kept_hash,) = db.execute("SELECT hash FROM journal_texts").fetchone()
        # A text whose row is gone: kernels before 0.2 dropped the descriptor when the
        # running row was finished, leaving such rows behind.
        with db:
            db.execute("INSERT INTO journal_texts(hash, len, text) VALUES ('0rphan', 5, 'lost!')")
        dry = json.loads(shoal(env, "gc", "--json").stdout)
        assert dry["journal_texts"] == 1 and dry["journal_text_chars"] == 5
        hashes = {h for (h,) in db.execute("SELECT hash FROM journal_texts")}
        assert hashes == {kept_hash, "0rphan"}  # a dry run deletes nothing
        done = json.loads(shoal(env, "gc", "--delete", "--json").stdout)
        assert done["journal_texts"] == 1
        hashes = {h for (h,) in db.execute("SELECT hash FROM journal_texts")}
        assert hashes == {kept_hash}
    finally:
        db.close()
    (row,) = json.loads(shoal(env, "journal", "--json", "-n", "1").stdout)  # an array
    assert row["src_hash"] == kept_hash and row["src_len"] == len(long_src)
