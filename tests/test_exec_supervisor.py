"""The exec supervisor and warm zygotes, driven through ``runner.spawn`` (real processes).

Each exec gets a fresh supervisor forked by its (principal, spec) zygote: nothing of one
exec reaches the next, a sandboxed zygote confines every job (with the job's own spools
writable by path), and a spec change never reuses a zygote.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import landlock, sandbox_probe
from shoal_mcp.kernel.access.sandbox import SandboxSpec
from shoal_mcp.kernel.access.sandbox_build import build_spec
from shoal_mcp.kernel.exec.pool import WarmPool
from shoal_mcp.kernel.exec.runner import RunningCommand, spawn
from shoal_mcp.kernel.exec.supervisor import Supervisor
from tests.support.landlock import landlock_evidence
from tests.support.polling import wait_until
from tests.support.procfs import (
    children,
    is_exec_supervisor,
    kill_pids,
    pids_with_arg,
    proc_ids,
)

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "HOME": "/root"}


@pytest.fixture
def zygote() -> Iterator[Supervisor]:
    z = Supervisor()
    yield z
    z.close()


def run(src: str, spool: Path, **kw) -> tuple[RunningCommand, str, str]:
    r = spawn(src, "/", dict(ENV), spool, **kw)
    r.wait(60)
    out, err = r.out_path.read_text(), r.err_path.read_text()
    r.discard()
    return r, out, err


def test_jobs_of_one_zygote_share_nothing(zygote: Supervisor, tmp_path: Path) -> None:
    first, _, _ = run(
        "umask 077; ulimit -n 64; export LEAK=1; cd /tmp; trap 'echo trapped' USR1; echo $$",
        tmp_path,
        supervisor=zygote,
    )
    second, out, _ = run(
        'echo "$$ $(umask) $(ulimit -n) ${LEAK:-unset} $PWD"; trap -p USR1',
        tmp_path,
        supervisor=zygote,
    )
    pid, umask, nofile, leak, cwd = out.split()
    assert int(pid) == second.pid != first.pid
    assert umask == f"{_our_umask():04o}"
    assert int(nofile) != 64 and leak == "unset" and cwd == "/"
    assert zygote.jobs == 2 and zygote.alive()


def _our_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_zygote_outlives_a_job_that_kills_its_supervisor(zygote: Supervisor, tmp_path) -> None:
    marks = [f"300.{secrets.randbelow(10**8):08d}" for _ in range(2)]
    try:
        r, _, _ = run(
            f"setsid sleep {marks[0]} & sleep {marks[1]} & kill -9 $PPID; wait",
            tmp_path,
            supervisor=zygote,
        )
        # Its supervisor died without a report: the kernel side kills bash's group, and
        # the zygote (a subreaper too) kills what was reparented to it, setsid or not.
        assert r.returncode == -9
        wait_until(lambda: not any(pids_with_arg(m) for m in marks), what="the orphans to die")
        again, out, _ = run("echo fine", tmp_path, supervisor=zygote)
        assert out == "fine\n" and again.returncode == 0
    finally:
        for m in marks:
            kill_pids(pids_with_arg(m))


def test_cold_one_job_zygote_is_reaped(tmp_path: Path) -> None:
    """Without a warm zygote, spawn starts one for the job alone; the job's end reaps it."""
    r, out, _ = run("echo cold", tmp_path)
    assert out == "cold\n" and r.returncode == 0
    assert [p for p in children(os.getpid()) if is_exec_supervisor(p)] == []


def test_pool_keys_by_principal_and_spec() -> None:
    pool = WarmPool(lambda principal: 0 if principal == "none" else 4)
    try:
        assert pool.take("a", b"") is None  # a miss starts the zygote in the background
        pool.prestart("a", b"")
        deadline_hits = [pool.take("a", b"") for _ in range(200) if not _sleep(0.02)]
        warm = next((z for z in deadline_hits if z is not None), None)
        assert warm is not None
        assert pool.take("a", b"spec-2") is None  # another spec: never that zygote
        assert pool.take("b", b"") is not warm
        assert pool.take("none", b"") is None and pool.zygotes() <= 3
    finally:
        pool.close()
    assert not warm.alive()
    assert pool.take("a", b"") is None  # closed


def _sleep(s: float) -> bool:
    import time

    time.sleep(s)
    return False


# -- a sandboxed zygote -------------------------------------------------------------------


def project_spec(tree: dict[str, Path], **kw: str) -> SandboxSpec:
    """A spec that may read and write ``tree["project"]``; the state dir is forbidden."""
    return build_spec(
        home=str(tree["home"]),
        tmpdir=str(tree["tmp"]),
        forbidden=[str(tree["state"])],
        fs_read=[f"{tree['project']}/**"],
        fs_write=[f"{tree['project']}/**"],
        **kw,
    )


@pytest.fixture
def box(tmp_path: Path):
    try:
        landlock.abi_version()
    except landlock.LandlockUnavailable as e:
        pytest.skip(f"{e} (evidence of Landlock: {landlock_evidence()})")
    tree = {n: tmp_path / n for n in ("home", "project", "outside", "state", "tmp")}
    for p in tree.values():
        p.mkdir()
    (tree["outside"] / "secret").write_text("outside secret\n")
    spool = tree["state"] / "spool"
    spool.mkdir()
    spec = project_spec(tree)
    z = Supervisor(spec.to_bytes())
    yield tree, spool, spec, z
    z.close()


@pytest.mark.landlock
def test_sandboxed_zygote_confines_every_job(box) -> None:
    tree, spool, spec, z = box
    mark = f"300.{secrets.randbelow(10**8):08d}"
    script = (
        f"echo a > {tree['project']}/made; cat {tree['outside']}/secret; "
        f"echo x > {tree['outside']}/new; echo $TMPDIR; echo to-stdout >> /dev/stdout; "
        f"setsid sleep {mark} &"
    )
    try:
        for _ in range(2):  # two jobs, one zygote: the same confinement each time
            r = spawn(script, str(tree["project"]), dict(ENV), spool, sandbox=spec, supervisor=z)
            r.wait(60)
            out, err = r.out_path.read_text(), r.err_path.read_text()
            assert (tree["project"] / "made").read_text() == "a\n"
            assert "outside secret" not in out and err.count("Permission denied") == 2, err
            assert not (tree["outside"] / "new").exists()
            assert out.splitlines() == [str(tree["tmp"]), "to-stdout"], out
            assert pids_with_arg(mark) == []
            r.discard()
        assert z.jobs == 2
    finally:
        kill_pids(pids_with_arg(mark))


@pytest.mark.landlock
def test_sandboxed_cold_start_is_confined_too(box) -> None:
    tree, spool, spec, _ = box
    r = spawn(f"cat {tree['outside']}/secret", "/", dict(ENV), spool, sandbox=spec)
    assert r.wait(60) == 1
    assert "Permission denied" in r.err_path.read_text()


@pytest.mark.landlock
def test_a_read_only_mount_inside_a_writable_grant_stays_read_only(tmp_path: Path) -> None:
    """A host mount below a writable grant (a read-only bind under ``/tmp``, a leftover
    of some other program) is locked read-only in the view's user namespace: the job
    runs, writes where it may, and gets EROFS inside that mount (it was SIGKILLed: the
    view could not be built)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make the host's read-only mount")
    if not sandbox_probe.probe().view:
        pytest.skip("no namespaced view here (user namespaces unavailable)")
    tree = {n: tmp_path / n for n in ("home", "project", "state", "tmp", "spool", "src")}
    for p in tree.values():
        p.mkdir()
    (tree["state"] / "view").mkdir(mode=0o700)
    locked = tree["project"] / "ro"
    locked.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(tree["src"]), str(locked)], check=True)
    try:
        spec = project_spec(tree, view_scratch=str(tree["state"] / "view"))
        r = spawn(
            f"echo a > {tree['project']}/made && echo wrote; echo b > {locked}/x",
            "/",
            dict(ENV),
            tree["spool"],
            sandbox=spec,
        )
        assert r.wait(60) == 1, r.err_path.read_text()
        assert r.out_path.read_text() == "wrote\n"
        assert "Read-only file system" in r.err_path.read_text()
        assert (tree["project"] / "made").read_text() == "a\n"
        assert list(tree["src"].iterdir()) == []
    finally:
        subprocess.run(["umount", str(locked)], check=True)


@pytest.mark.landlock
def test_a_view_that_cannot_be_built_says_why_on_the_jobs_stderr(tmp_path: Path) -> None:
    """A view that cannot be assembled (here its scratch directory is missing, so the
    tmpfs cannot be mounted) fails closed: nothing runs, the exec exits 125 and the
    sandbox's reason is on its stderr (it was a bare SIGKILL, exit 137, no message)."""
    if not sandbox_probe.probe().view:
        pytest.skip("no namespaced view here (user namespaces unavailable)")
    tree = {n: tmp_path / n for n in ("home", "project", "state", "tmp", "spool")}
    for p in tree.values():
        p.mkdir()
    spec = project_spec(tree, view_scratch=str(tree["state"] / "missing"))
    r = spawn(f"echo ran > {tree['project']}/ran", "/", dict(ENV), tree["spool"], sandbox=spec)
    assert r.wait(60) == 125
    err = r.err_path.read_text()
    assert err.startswith("shoal sandbox: "), err
    assert "No such file or directory" in err
    assert not (tree["project"] / "ran").exists()


def test_idle_zygote_is_closed() -> None:
    pool = WarmPool(lambda principal: 4, idle_s=0.3)
    try:
        pool.prestart("a", b"")
        wait_until(lambda: pool.zygotes() == 1, what="the zygote to start")
        (zygote,) = [e.zygote for e in pool._keys.values()]
        assert zygote is not None
        wait_until(lambda: pool.zygotes() == 0, what="the idle zygote to be closed")
        wait_until(lambda: zygote.proc.poll() is not None, what="it to exit and be reaped")
    finally:
        pool.close()


def test_a_retired_zygote_is_reaped_once_its_job_ends(tmp_path: Path) -> None:
    """A zygote retired while its job runs (evicted here by a second key) takes no more
    jobs, does not hold up the next key's start, and is reaped by the pool's keeper once
    that job ended: nobody else waits for it."""
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    pool = WarmPool(lambda principal: 4, max_keys=1)
    try:
        pool.prestart("a", b"")
        wait_until(lambda: pool.zygotes() == 1, what="a's zygote to start")
        first = pool.take("a", b"")
        assert first is not None
        job = spawn(
            f"read line < {fifo}; echo got $line", "/", dict(ENV), tmp_path, supervisor=first
        )
        pool.prestart("b", b"")  # one key at most: a's zygote is retired
        wait_until(lambda: pool.take("b", b"") is not None, what="b's zygote to start")
        assert first.closed and not first.alive()
        assert first.proc.returncode is None and first.sock.fileno() != -1  # its job runs
        with open(fifo, "w") as w:
            w.write("go\n")
        job.wait(60)
        assert job.returncode == 0 and job.out_path.read_text() == "got go\n"
        job.discard()
        wait_until(lambda: first.sock.fileno() == -1, what="the keeper to reap it")
        assert first.proc.returncode == 0  # reaped (a zombie has no returncode yet)
    finally:
        pool.close()
    assert not [t for t in threading.enumerate() if t.name == "warm-pool"]


def test_kernel_runs_execs_under_the_attached_principals_zygote(kernel) -> None:
    """session.attach starts the zygote; an exec's bash is its grandchild (zygote →
    the job's supervisor → bash), not a child of the kernel."""
    c = kernel.client("zygote-path")
    mark = f"300.{secrets.randbelow(10**8):08d}"
    try:
        wait_until(
            lambda: [p for p in children(kernel.pid) if is_exec_supervisor(p)],
            what="the warm zygote",
        )
        task = c.call("exec", {"src": f"sleep {mark}", "background": True})["task"]
        pid = c.call("task.get", {"task": task})["pid"]
        job_sup = proc_ids(pid)["ppid"]
        zygote = proc_ids(job_sup)["ppid"]
        assert is_exec_supervisor(job_sup) and is_exec_supervisor(zygote)
        assert proc_ids(zygote)["ppid"] == kernel.pid
        c.call("task.cancel", {"task": task})
        c.call("task.await", {"task": task, "timeout_ms": 20000}, timeout=30)
        assert pids_with_arg(mark) == []
    finally:
        kill_pids(pids_with_arg(mark))
        c.close()
