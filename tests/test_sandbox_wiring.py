"""The sandbox wired into the kernel's spawners: ``runner.spawn(sandbox=...)`` for exec.

Real bash, real Landlock; nothing mocked.  Marked ``landlock``: these fail instead of
skipping on a machine that has Landlock (tests/support/landlock.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import landlock
from shoal_mcp.kernel.access.sandbox_build import build_spec
from shoal_mcp.kernel.exec.runner import spawn
from tests.support.landlock import landlock_evidence

pytestmark = pytest.mark.landlock


@pytest.fixture
def abi() -> int:
    try:
        return landlock.abi_version()
    except landlock.LandlockUnavailable as e:
        pytest.skip(f"{e} (evidence of Landlock: {landlock_evidence()})")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    paths = {n: tmp_path / n for n in ("project", "outside", "state", "tmp")}
    for p in paths.values():
        p.mkdir()
    (paths["state"] / "spool").mkdir()
    (paths["state"] / "tokens.key").write_text("KERNEL-KEY\n")
    return paths


def test_runner_spawn_applies_the_spec(abi: int, tree: dict[str, Path]) -> None:
    spec = build_spec(
        fs_read=[f"{tree['project']}/**"],
        fs_write=[f"{tree['project']}/**"],
        home=str(tree["project"]),
        tmpdir=str(tree["tmp"]),
        forbidden=[str(tree["state"])],
    )
    script = (
        f"touch {tree['outside']}/X; cat {tree['state']}/tokens.key; touch {tree['project']}/ok; "
        'echo "tmp=$TMPDIR"; echo again > /dev/stdout; export NEW=1'
    )
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}  # no LC_CTYPE: none may appear
    run = spawn(script, str(tree["project"]), env, tree["state"] / "spool", sandbox=spec)
    try:
        assert run.wait(60) == 0
        assert not (tree["outside"] / "X").exists()
        assert (tree["project"] / "ok").exists()
        err = run.err_path.read_text()
        assert err.count("Permission denied") == 2, err
        assert run.out_path.read_text() == "again\n"  # reopened by path: the spool is writable
        state = run.read_state()
        assert state is not None
        assert state[1]["NEW"] == "1"
        assert "LC_CTYPE" not in state[1]  # the supervisor's locale coercion does not leak
    finally:
        for p in (run.out_path, run.err_path, run.state_path):
            p.unlink(missing_ok=True)


def test_runner_spawn_without_a_spec_is_unconfined(tree: dict[str, Path]) -> None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    run = spawn(f"touch {tree['outside']}/X", str(tree["project"]), env, tree["state"] / "spool")
    assert run.wait(60) == 0
    assert (tree["outside"] / "X").exists()
    for p in (run.out_path, run.err_path, run.state_path):
        p.unlink(missing_ok=True)
    assert os.listdir(tree["state"] / "spool") == []
