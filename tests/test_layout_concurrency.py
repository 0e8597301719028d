"""How many locks and thread starts the kernel has: a ratchet toward one owner.

Issue 30's target is at most 12 lock objects and at most 6 places that start threads in
``kernel/`` (docs/plan-one-owner.md). The thread starts are there (the owner loop took
the background watcher, the warm pool, the periodic chores, the egress proxy and its
relays), and so are the locks since 2026-12-07 (the small tables share one lock,
``owner/tables.py``, and what waits for a table to change waits on a condition of
it). This test holds the kernel there: a change may remove a lock or a thread start,
never add one.

Until 2026-12-07 the counter missed two forms, so it said 47 and 6 where the kernel
had 49 and 9: a lock named as a dataclass field's factory, and thread pools
(``ThreadPoolExecutor``). It sees both now.
"""

from __future__ import annotations

import re
from pathlib import Path

KERNEL = Path(__file__).resolve().parents[1] / "src" / "shoal_mcp" / "kernel"

LOCK = re.compile(
    r"\bthreading\.(?:Lock|RLock|Semaphore|BoundedSemaphore)(?:\(|\s*[,)])"
    r"|\bthreading\.Condition\(\)"
)
"""A lock made by a call, or named as a factory (``field(default_factory=threading.Lock)``),
or a condition that makes its own lock. A condition over a lock that exists already
(``threading.Condition(TABLES)``) makes none: its waiters wait for that lock."""
THREAD_START = re.compile(
    r"\bthreading\.(?:Thread|Timer)\(|\b_thread\.start_new_thread\(|\bThreadPoolExecutor\("
)
"""A thread started directly, or a pool that starts its own."""

LOCK_SITES = 12
"""Lock objects made in kernel/ (the goal, 12, is met: none may be added)."""
THREAD_START_SITES = 6
"""Places in kernel/ that start a thread today (the goal, 6, is met: none may be added)."""


def count(pattern: re.Pattern[str], root: Path = KERNEL) -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        for line in path.read_text().splitlines():
            hits = len(pattern.findall(line.split("#", 1)[0]))
            if hits:
                rel = path.relative_to(root).as_posix()
                found[rel] = found.get(rel, 0) + hits
    return found


def test_no_new_lock_in_the_kernel():
    found = count(LOCK)
    assert sum(found.values()) <= LOCK_SITES, f"a lock added to the kernel: {found}"


def test_no_new_thread_start_in_the_kernel():
    found = count(THREAD_START)
    assert sum(found.values()) <= THREAD_START_SITES, f"a thread start added: {found}"


def test_the_counter_sees_every_form(tmp_path):
    (tmp_path / "m.py").write_text(
        "import threading\n"
        "a = threading.Lock()\n"
        "b = threading.RLock(); c = threading.Condition(a); d = threading.Condition()\n"
        "# d = threading.Lock()  (a comment is not a lock)\n"
        "threading.Thread(target=print).start()\n"
        "lock: threading.Lock = field(default_factory=threading.Lock)\n"
        "held: dict[str, threading.Lock] = {}  # (a type is not a lock)\n"
        "pool = ThreadPoolExecutor(2); t = threading.Timer(1, print)\n"
    )
    assert count(LOCK, tmp_path) == {"m.py": 4}
    assert count(THREAD_START, tmp_path) == {"m.py": 3}
