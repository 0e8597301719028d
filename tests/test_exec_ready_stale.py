"""Ready shells re-validated when taken (issue 31, "ready shells run in stale state").

Live: a real kernel with warm shells. A session's ready shell is made after each exec
with the session's cwd and env *strings*; these tests change what those strings name
while the shell waits, and the next exec must run in the state the session names now
(a cold start), never in the one the shell was started with.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from shoal_mcp.kernel.access import sandbox
from tests.support.kernel import KernelProcess, close_client
from tests.support.polling import wait_until
from tests.support.procfs import descendants_of
from tests.support.tmp import short_tmp
from tests.test_exec_ready_shells import new_ready_shells, out


def _with_ready_shell(kernel, c, src: str = "true") -> set[int]:
    """Run ``src`` and wait until this session's next shell is waiting (the kernel's
    other sessions have theirs: only shells new since before the exec count)."""
    before = new_ready_shells(kernel, set())
    out(c, src)
    return wait_until(lambda: new_ready_shells(kernel, before), timeout=30, what="a ready shell")


def _pwd_inode(c) -> tuple[str, str]:
    """(pid, inode of the directory the command runs in)."""
    pid, ino = out(c, 'echo "$$ $(stat -c %i .)"').split()
    return pid, ino


def test_a_cwd_removed_and_recreated_is_a_cold_start(kernel, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    c = kernel.client("stale-rm")
    try:
        out(c, f"cd '{d}'")
        waiting = _with_ready_shell(kernel, c)
        shutil.rmtree(d)
        d.mkdir()
        pid, ino = _pwd_inode(c)
        assert int(pid) not in waiting  # not the shell sitting in the deleted directory
        assert ino == str(d.stat().st_ino)
        assert out(c, "echo x > f; pwd") == f"{d}\n" and (d / "f").read_text() == "x\n"
    finally:
        close_client(c)


def test_a_cwd_moved_aside_is_a_cold_start(kernel, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    c = kernel.client("stale-mv")
    try:
        out(c, f"cd '{d}'")
        _with_ready_shell(kernel, c)
        d.rename(tmp_path / "d.old")
        d.mkdir()
        out(c, "echo written > where")
        assert (d / "where").read_text() == "written\n"
        assert not (tmp_path / "d.old" / "where").exists()
    finally:
        close_client(c)


def test_a_repointed_cwd_symlink_is_followed(kernel, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    link = tmp_path / "link"
    link.symlink_to(a)
    c = kernel.client("stale-link")
    try:
        # Straight after the cd: the session's cwd is the link (the next exec's report
        # would name the directory bash resolved it to).
        _with_ready_shell(kernel, c, f"cd '{link}'")
        link.unlink()
        link.symlink_to(b)
        assert out(c, "stat -c %i .").strip() == str(b.stat().st_ino)
    finally:
        close_client(c)


def test_bash_env_is_not_read_ahead(kernel, tmp_path):
    script = tmp_path / "bash_env.sh"
    count = tmp_path / "count"
    script.write_text(f'echo run >> "{count}"; BASH_ENV_SAYS=first\n')
    c = kernel.client("stale-bashenv")
    try:
        out(c, f"export BASH_ENV='{script}'")
        for _ in range(2):
            out(c, "true")
        before = new_ready_shells(kernel, set())
        out(c, "true")
        # Give a shell started ahead every chance to be waiting (none is made now).
        with contextlib.suppress(AssertionError):
            wait_until(lambda: new_ready_shells(kernel, before), timeout=2, what="none")
        # Changed while the next shell would be waiting: the next exec reads it now.
        script.write_text(f'echo run >> "{count}"; BASH_ENV_SAYS=second\n')
        assert out(c, 'echo "$BASH_ENV_SAYS"') == "second\n"
        # One read per exec that ran (3 + 1), none by a shell started ahead.
        assert count.read_text().count("run") == 4
    finally:
        close_client(c)


def test_a_spool_dir_removed_under_a_live_kernel(kernel):
    c = kernel.client("stale-spool")
    try:
        _with_ready_shell(kernel, c)
        shutil.rmtree(kernel.state / "spool")
        reply = c.call("exec", {"src": "echo still-here"}, timeout=60)
        assert reply["value"]["status"] == 0, reply
        assert out(c, "echo again") == "again\n"
    finally:
        close_client(c)


def test_an_unchanged_cwd_still_uses_the_ready_shell(kernel, tmp_path):
    """The re-validation is not a blanket cold start: nothing changed, the shell runs."""
    c = kernel.client("stale-none")
    try:
        out(c, f"cd '{tmp_path}'")
        waiting = _with_ready_shell(kernel, c)
        pid, _ = _pwd_inode(c)
        assert int(pid) in waiting and int(pid) in descendants_of(kernel.pid) | waiting
        assert os.path.isdir(tmp_path)
    finally:
        close_client(c)


def test_a_replaced_grant_directory_is_a_cold_start():
    """A sandboxed ready shell's Landlock rules name the granted directory's inode; one
    replaced meanwhile made "Permission denied" inside the grant."""
    try:
        sandbox.landlock.abi_version()
    except sandbox.landlock.LandlockUnavailable as e:
        pytest.skip(f"no Landlock here: {e}")
    with short_tmp("shgr") as tmp:
        granted = tmp / "granted"
        granted.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(
            f'[principal."uid:{os.geteuid()}"]\nproc_spawn = ["*"]\nopaque = "allow"\n'
            f"sandbox = true\n"
            f'[principal."uid:{os.geteuid()}".fs]\nread = ["{tmp}/**"]\n'
            f'write = ["{granted}/**"]\n'
        )
        kernel = KernelProcess(tmp, "--policy", str(policy)).start()
        c = kernel.client("grant")
        try:
            out(c, f"cd '{tmp}'")
            assert out(c, f"touch '{granted}/before' && echo ok") == "ok\n"
            _with_ready_shell(kernel, c)
            shutil.rmtree(granted)
            granted.mkdir()
            assert out(c, f"touch '{granted}/after' 2>&1 && echo ok") == "ok\n"
            assert (granted / "after").exists()
        finally:
            close_client(c)
            kernel.stop()
