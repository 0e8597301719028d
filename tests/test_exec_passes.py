"""What one exec costs the kernel in SQLite commits and JSON passes (issue 30), counted on
a real kernel by the recorder tests/support/walk/sitecustomize.py (loaded through
``PYTHONPATH``; the kernel's code is not changed).

* **Commits**: at most two per exec: the ``running`` row at spawn (crash consistency:
  docs/decisions.md) and one transaction for everything finalize stores, the durable
  events (``journal``, ``session.transcript``) included.
* **Whole-message JSON passes**: the command carries a 16 KiB comment, so a pass over
  JSON text at least that long is a pass over a whole message or the whole value (the
  request's parse, the stored value, the reply's encoding, and anything that dumps one
  of them again only to measure it). At most four; the small ones (journal columns,
  event payloads) are bounded separately, so a new pass per exec shows up here.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.support.kernel import close_client, running_kernel
from tests.support.recorder import recorded, recorder_env

COMMENT = 4 * 1024
MAX_COMMITS = 2
MAX_WHOLE_PASSES = 4
MAX_SMALL_PASSES = 12


@pytest.fixture(scope="module")
def one_exec(tmp_path_factory) -> dict:
    """The kernel's record of one foreground exec after a warm-up."""
    walk_dir = tmp_path_factory.mktemp("walk")
    env = recorder_env(walk_dir, os.environ.get("PYTHONPATH"))
    src = f"true # {'x' * COMMENT}"
    with running_kernel(env=env, prefix="shps-") as kernel:
        c = kernel.client("passes")
        try:
            for _ in range(3):
                assert c.call("exec", {"src": src}, timeout=60)["value"]["ok"] is True
            recorded(kernel.pid, walk_dir, signal.SIGUSR1, "ready")
            reply = c.call("exec", {"src": src}, timeout=60)
            report = json.loads(recorded(kernel.pid, walk_dir, signal.SIGUSR2, "json").read_text())
        finally:
            close_client(c)
    assert reply["value"]["ok"] is True and reply["ref"].startswith("out:"), reply
    assert report["calls"] > 0, "the recorder saw nothing: it is not loaded"
    return report


def _passes(report: dict, whole: bool) -> list[str]:
    return [
        f"{kind} {site} ({size} bytes)"
        for kind, site, size in report["json_passes"]
        if (size >= COMMENT) == whole
    ]


def test_an_exec_commits_at_most_twice(one_exec):
    commits = one_exec["counts"].get("sqlite.commit", 0)
    where = {k: v for k, v in one_exec["sites"].items() if k.startswith("sqlite.commit")}
    assert 1 <= commits <= MAX_COMMITS, where


def test_an_exec_makes_few_whole_message_json_passes(one_exec):
    whole = _passes(one_exec, whole=True)
    # the request is parsed and the reply encoded: at least those two are seen
    assert 2 <= len(whole) <= MAX_WHOLE_PASSES, "\n".join(whole)


def test_an_exec_makes_few_small_json_passes(one_exec):
    small = _passes(one_exec, whole=False)
    assert len(small) <= MAX_SMALL_PASSES, "\n".join(small)
