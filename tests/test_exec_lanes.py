"""Lanes: the supervisor of an exec without a sandbox starts the session's next ready
shell itself, instead of the zygote forking a new supervisor (supervise.py, protocol
step 5; supervisor.Lane).

Driven on real processes: a zygote and its jobs through ``Supervisor.run``, then the
whole path through a real kernel and facade. What must hold: a lane serves only its own
zygote, a lane nobody takes ends, a killed job leaves none, a dead one is passed over
with nothing lost, a sandboxed job never stays, and nothing of one exec reaches the next
except the session's own cwd and environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import landlock
from shoal_mcp.kernel.access.sandbox_build import build_spec
from shoal_mcp.kernel.exec.ready import ReadyShells
from shoal_mcp.kernel.exec.ready_start import ShellOrder
from shoal_mcp.kernel.exec.supervisor import Job, Supervisor
from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import close_client
from tests.support.landlock import landlock_evidence
from tests.support.polling import wait_until
from tests.support.procfs import children, pid_alive, proc_state

ENV = {b"PATH": b"/usr/local/bin:/usr/bin:/bin", b"LC_ALL": b"C"}


@pytest.fixture
def zygote() -> Iterator[Supervisor]:
    z = Supervisor()
    yield z
    z.close(timeout=10)


def _start(zygote: Supervisor, tmp: Path, src: str, **kw) -> tuple[Job, Path]:
    """A job running ``src`` under ``sh``, its stdout in a fresh file (returned)."""
    out = tmp / f"out-{len(os.listdir(tmp))}"
    fds = [os.open(out, os.O_WRONLY | os.O_CREAT, 0o600), os.open(os.devnull, os.O_WRONLY)]
    try:
        job = zygote.run([b"/bin/sh", b"-c", src.encode()], b"/", dict(ENV), fds, [], 0, **kw)
    finally:
        for fd in fds:
            os.close(fd)
    return job, out


def _finished(job: Job, *, keep: bool = True) -> Job:
    job.keep_lane = keep
    assert job.wait(30) is not None
    return job


def test_a_lane_runs_the_next_job_on_the_same_supervisor(zygote, tmp_path):
    first, out1 = _start(zygote, tmp_path, "echo $PPID", stay=True)
    lane = _finished(first).take_lane()
    assert lane is not None
    second, out2 = _start(zygote, tmp_path, "echo $PPID", stay=True, lane=lane)
    _finished(second, keep=False)
    assert lane.used
    assert out1.read_text() == out2.read_text()  # one supervisor, two jobs
    assert zygote.jobs == 1  # the zygote forked once
    wait_until(lambda: children(zygote.pid) == [], timeout=10)  # not kept: it exited


def test_jobs_on_one_lane_share_nothing(zygote, tmp_path):
    first, _ = _start(
        zygote,
        tmp_path,
        "umask 077; ulimit -n 64; export LEAK=1; cd /tmp; trap 'echo trapped' USR1; "
        "f() { :; }; echo $PPID",
        stay=True,
    )
    lane = _finished(first).take_lane()
    second, out = _start(
        zygote,
        tmp_path,
        'echo "$(umask) $(ulimit -n) ${LEAK:-unset} $PWD $(trap -p USR1) $(type f 2>&1 | wc -l)"',
        stay=True,
        lane=lane,
    )
    _finished(second, keep=False)
    assert lane is not None and lane.used
    umask, nofile, leak, cwd, *rest = out.read_text().split()
    assert umask == f"{_our_umask():04o}"
    assert int(nofile) != 64 and leak == "unset" and cwd == "/"
    assert rest == ["1"]  # no trap printed, and `type f` says only "not found"


def _our_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_lane_nobody_takes_ends(zygote, tmp_path):
    job, _ = _start(zygote, tmp_path, "true", stay=True)
    _finished(job)
    (supervisor,) = children(zygote.pid)
    job.drop_lane()
    wait_until(lambda: not pid_alive(supervisor), timeout=10)
    assert job.take_lane() is None


def test_a_lane_is_only_its_own_zygotes(zygote, tmp_path):
    job, out1 = _start(zygote, tmp_path, "echo $PPID", stay=True)
    lane = _finished(job).take_lane()
    (first_supervisor,) = children(zygote.pid)
    other = Supervisor()
    try:
        second, out2 = _start(other, tmp_path, "echo $PPID", stay=True, lane=lane)
        _finished(second, keep=False)
        assert lane is not None and not lane.used
        assert out1.read_text() != out2.read_text() and other.jobs == 1
        wait_until(lambda: not pid_alive(first_supervisor), timeout=10)  # closed, not kept
    finally:
        other.close(timeout=10)


def test_a_killed_job_leaves_no_lane(zygote, tmp_path):
    job, _ = _start(zygote, tmp_path, "sleep 30", stay=True)
    job.keep_lane = True
    job.kill()
    assert job.wait(30) is not None
    assert job.take_lane() is None
    wait_until(lambda: children(zygote.pid) == [], timeout=10)


def test_a_dead_lane_is_passed_over_and_the_zygote_forks(zygote, tmp_path):
    job, _ = _start(zygote, tmp_path, "true", stay=True)
    lane = _finished(job).take_lane()
    (supervisor,) = children(zygote.pid)
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: not pid_alive(supervisor), timeout=10)
    second, out = _start(zygote, tmp_path, "echo ran", stay=True, lane=lane)
    _finished(second, keep=False)
    assert lane is not None and not lane.used
    assert out.read_text() == "ran\n" and zygote.jobs == 2


@pytest.mark.parametrize(
    "change",
    ["prlimit --pid $PPID --nofile=100:100", "renice -n 5 -p $PPID >/dev/null"],
)
def test_a_supervisor_its_job_changed_takes_no_other(zygote, tmp_path, change):
    """A limit or a priority set on the supervisor from inside the job would be
    inherited by the next exec's tree: that supervisor ends, the zygote forks anew."""
    if shutil.which(change.split()[0]) is None:
        pytest.skip(f"no {change.split()[0]} here")
    job, out1 = _start(zygote, tmp_path, f"{change}; echo $PPID", stay=True)
    lane = _finished(job).take_lane()
    second, out2 = _start(
        zygote, tmp_path, "echo $PPID; ulimit -n; ps -o ni= -p $$", stay=True, lane=lane
    )
    _finished(second, keep=False)
    ppid, nofile, nice = out2.read_text().split()
    assert lane is not None and not lane.used
    assert ppid != out1.read_text().strip()
    assert nofile != "100" and nice == str(os.getpriority(os.PRIO_PROCESS, zygote.pid))


def test_a_supervisor_gone_with_our_bytes_unread_reads_as_eof():
    """A lane's supervisor that ends before reading the next job's frame leaves the
    kernel's end reset (ECONNRESET), not at EOF: read as EOF, so the zygote forks."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.sendall(b"a frame the supervisor never read\n")
    theirs.close()
    job = Job(ours, stays=True)
    try:
        assert job.line(5) is None and job.eof
    finally:
        job.close()


def _stopped_lane(zygote: Supervisor, tmp: Path) -> tuple[Job, int]:
    """A job that stops its own supervisor (``kill -STOP $PPID``) once it has started,
    ended (the supervisor let go only to report that), and its supervisor stopped again
    before the next job comes: the job, and the stopped supervisor's pid."""
    go = tmp / "go"
    job, _ = _start(
        zygote, tmp, f"while [ ! -e {go} ]; do sleep 0.01; done; kill -STOP $PPID", stay=True
    )
    go.touch()  # after its start was reported: the stop cannot come before it
    (supervisor,) = children(zygote.pid)
    wait_until(lambda: proc_state(supervisor) == "T", timeout=10)
    job.keep_lane = True
    os.kill(supervisor, signal.SIGCONT)  # only to let it report this job's end
    assert job.wait(30) is not None
    os.kill(supervisor, signal.SIGSTOP)  # stopped again before the next job comes
    return job, supervisor


def test_a_stopped_lane_is_given_up(zygote, tmp_path):
    job, supervisor = _stopped_lane(zygote, tmp_path)
    lane = job.take_lane()
    try:
        second, out = _start(zygote, tmp_path, "echo ran", stay=True, lane=lane)
        _finished(second, keep=False)
        assert lane is not None and not lane.used
        assert out.read_text() == "ran\n" and zygote.jobs == 2
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_until(lambda: not pid_alive(supervisor), timeout=10)  # given up: it exits


@pytest.mark.landlock
def test_a_job_under_a_sandbox_never_stays(tmp_path):
    """Its supervisor's confinement is the job's own (an IPC namespace, Landlock rules
    on its spool inodes): the kernel never asks it to stay."""
    try:
        landlock.abi_version()
    except landlock.LandlockUnavailable as e:
        pytest.skip(f"{e} (evidence of Landlock: {landlock_evidence()})")
    (tmp_path / "tmp").mkdir()
    spec = build_spec(
        home=str(tmp_path),
        tmpdir=str(tmp_path / "tmp"),
        forbidden=[],
        fs_read=["/**"],
        fs_write=[f"{tmp_path}/**"],
    )
    boxed = Supervisor(spec.to_bytes())
    try:
        job, _ = _start(boxed, tmp_path, "true", stay=True)
        assert not job.stays
        assert _finished(job).take_lane() is None
    finally:
        boxed.close(timeout=10)


# -- through a kernel ---------------------------------------------------------------------


def _ppid(facade: RawFacade, src: str = "echo $PPID") -> str:
    reply = facade.tool("shoal_exec", {"command": src})
    value = reply["result"]["structuredContent"]["value"]
    return value.get("out", {"v": ""})["v"].strip()


def _warm(kernel) -> dict:
    client = kernel.client()
    try:
        return client.call("kernel.status", {}, timeout=30)["warm"]
    finally:
        close_client(client)


def test_the_local_humans_execs_run_on_a_lane(kernel):
    before = _warm(kernel)["ready_on_lanes"]
    facade = RawFacade(facade_env(kernel, "lanes"))
    try:
        facade.initialize()
        ppids = [_ppid(facade) for _ in range(6)]
    finally:
        facade.close()
    # The first exec starts cold; from the second on, each ready shell was started by
    # the supervisor of the exec before it, which is the same process all along.
    assert len(set(ppids[2:])) == 1, ppids
    assert _warm(kernel)["ready_on_lanes"] - before >= 3


def test_the_default_agent_never_runs_on_a_lane(kernel):
    before = _warm(kernel)
    facade = RawFacade(facade_env(kernel, "agent-lanes", agent=True))
    try:
        facade.initialize()
        for _ in range(4):
            _ppid(facade, "true")
    finally:
        facade.close()
    warm = _warm(kernel)
    assert warm["ready_on_lanes"] == before["ready_on_lanes"], (before, warm)
    assert warm["ready_hits"] - before["ready_hits"] >= 2, (before, warm)  # forked as ever


# -- a ready shell sent without waiting (the owner loop's refill: ready_start.ShellOrder.send) --

READY_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def test_a_shell_sent_to_a_lane_starts_once_its_answer_is_read(zygote, tmp_path):
    first, out1 = _start(zygote, tmp_path, "echo $PPID", stay=True)
    lane = _finished(first).take_lane()
    spools = tmp_path / "spools"
    spools.mkdir()
    start = ShellOrder("/", READY_ENV, spools, zygote, sandbox=None, max_output_bytes=0).send(lane)
    assert start.on_lane and lane is not None and lane.used
    shells = ReadyShells()
    try:
        # What the owner loop does once the job's socket is readable: the answer, then
        # the shell kept for the session (its waiters told).
        shells.refill(("p", "s"), lambda done: done(start.finish(start.job.line(30))), later=True)
        assert len(shells) == 1
        shell = shells.take(("p", "s"), "/", dict(READY_ENV), b"", 0)
        assert shell is not None
        run = shell.start("echo $PPID")
        assert run is not None and run.wait(60) == 0
        assert run.out_path.read_text() == out1.read_text()  # the first job's supervisor
        assert zygote.jobs == 1  # no fork for the shell
        run.discard()
    finally:
        shells.close()


def test_a_shell_sent_to_a_stopped_lane_is_given_up_with_its_files(zygote, tmp_path):
    job, supervisor = _stopped_lane(zygote, tmp_path)
    (tmp_path / "spools").mkdir()
    try:
        order = ShellOrder("/", READY_ENV, tmp_path / "spools", zygote, None, 0)
        start = order.send(job.take_lane())
        assert start.on_lane and all(p.exists() for p in start.files.paths)
        assert start.job.line(0) is None and not start.job.eof  # no answer yet
        with pytest.raises(OSError):
            start.finish(None)  # what the loop does when its answer does not come in time
        assert not any(p.exists() for p in start.files.paths)
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_until(lambda: not pid_alive(supervisor), timeout=10)  # given up: it exits
