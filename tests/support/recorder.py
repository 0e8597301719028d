"""Driving the walk recorder (tests/support/walk/sitecustomize.py) of a process started
with ``recorder_env``: ``recorded`` signals it and waits for the file it writes."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.polling import wait_until

RECORDER_DIR = Path(__file__).resolve().parent / "walk"


def recorder_env(walk_dir: Path, pythonpath: str | None = None) -> dict[str, str]:
    """Environment that loads the recorder (before ``pythonpath``) writing to ``walk_dir``."""
    path = os.pathsep.join(p for p in (str(RECORDER_DIR), pythonpath) if p)
    return {"PYTHONPATH": path, "SHOAL_WALK_DIR": str(walk_dir)}


def recorded(pid: int, walk_dir: Path, sig: int, suffix: str) -> Path:
    """Send ``sig`` (SIGUSR1: start, SIGUSR2: stop and write) and wait for its file."""
    path = walk_dir / f"walk-{pid}.{suffix}"
    path.unlink(missing_ok=True)
    os.kill(pid, sig)
    wait_until(path.exists, timeout=30, interval=0.01, what=f"walk-{pid}.{suffix}")
    return path
