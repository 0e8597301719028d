"""``$SHOAL_OUT`` entries are made in the background after a foreground exec's reply
(values/outputs.py ``schedule``), each built under a temporary name and renamed whole:
they appear without another exec, and the next exec never sees a partial one."""

from __future__ import annotations

import os
import time
from pathlib import Path

from shoal_mcp.kernel.values.output_entries import DIR_MODE, FILE_MODE
from tests.support.kernel import close_client
from tests.test_shoal_out import run, text

EVENTUALLY_S = 30.0  # a bound for a background thread on a loaded machine, not a timing


def test_an_entry_appears_after_the_reply_without_another_exec(kernel):
    c = kernel.client("shoal-out-bg")
    try:
        out_dir = Path(text(c, 'printf %s "$SHOAL_OUT"'))
        n = run(c, "echo background; echo err >&2")["ref"].split(":")[1]
        entry = out_dir / n
        deadline = time.monotonic() + EVENTUALLY_S
        while not entry.is_dir() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (entry / "out").read_bytes() == b"background\n"
        assert (entry / "err").read_bytes() == b"err\n"
        assert os.stat(entry).st_mode & 0o777 == DIR_MODE
        assert os.stat(entry / "out").st_mode & 0o777 == FILE_MODE
        assert not [p for p in os.listdir(out_dir) if p.endswith(".part")]
    finally:
        close_client(c)


def test_a_partial_entry_left_behind_is_rebuilt(kernel):
    c = kernel.client("shoal-out-part")
    try:
        shown = text(c, 'printf %s "$SHOAL_OUT"')
        # where the kernel writes it (a root kernel shows it through a read-only mount)
        out_dir = Path(shown.replace("/outputs-ro/", "/outputs/", 1))
        n = int(run(c, "echo one")["ref"].split(":")[1])
        # what a crash in the middle of building the next entry would leave
        os.chmod(out_dir, 0o755)
        part = out_dir / f".{n + 1}.part"
        part.mkdir()
        (part / "out").write_bytes(b"junk\n")
        os.chmod(part, 0o555)
        assert int(run(c, "echo two")["ref"].split(":")[1]) == n + 1
        assert text(c, f'cat "$SHOAL_OUT/{n + 1}/out"') == "two\n"
        assert text(c, f'cat "$SHOAL_OUT/{n}/out"') == "one\n"
        assert not part.exists()
    finally:
        close_client(c)
