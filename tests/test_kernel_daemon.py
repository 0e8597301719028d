"""shoal-kernel as a daemon: socket modes, refusals, stale sockets, the start-up flock
race, SIGTERM shutdown and the log file. Real processes only.

See docs/configuration.md, Paths, and docs/security.md.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import time
from pathlib import Path

import orjson
import pytest

from shoal_mcp import __version__
from shoal_mcp.client import KernelClient, KernelLost
from shoal_mcp.protocol.errors import ErrorCode
from tests.support.kernel import close_client
from tests.support.other_uid import exchange_as_uid
from tests.support.polling import wait_until
from tests.support.procfs import pgid_members, pid_alive

EXIT_REFUSED = 2


def _exit_code(k, timeout: float = 15.0) -> tuple[int, str]:
    code = k.proc.wait(timeout)
    _, err = k.proc.communicate()
    return code, err.decode(errors="replace")


def _ping(path: Path) -> dict:
    c = KernelClient(path)
    try:
        return c.call("ping", {}, timeout=10)
    finally:
        close_client(c)


def test_socket_dir_0700_socket_0600(kernel_factory):
    k = kernel_factory()
    assert stat.S_IMODE(os.stat(k.socket.parent).st_mode) == 0o700
    st = os.lstat(k.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(k.state).st_mode) == 0o700
    assert (k.state / "journal.sqlite3").exists()


def test_log_file_in_state_dir(kernel_factory):
    k = kernel_factory()
    wait_until(lambda: "listening on" in k.log(), timeout=10)
    assert str(k.socket) in k.log()
    assert k.proc.stdout is not None


def test_refuses_live_listener_first_keeps_serving(kernel_factory):
    first = kernel_factory()
    pid = _ping(first.socket)["kernel"]["pid"]
    assert pid == first.pid
    second = kernel_factory(wait=False)
    code, err = _exit_code(second)
    assert code == EXIT_REFUSED, err
    assert "already serves state dir" in err and f"pid {first.pid}" in err, err
    assert first.proc.poll() is None
    assert _ping(first.socket)["kernel"]["pid"] == first.pid


def test_one_kernel_per_state_dir_whatever_its_socket(kernel_factory, short_tmp_path):
    """A second kernel on the same state dir but another socket refuses, naming the
    first's pid and socket; kernel.json describes the one that serves (0600)."""
    first = kernel_factory()
    record = orjson.loads((first.state / "kernel.json").read_bytes())
    assert record["pid"] == first.pid and record["socket"] == str(first.socket)
    assert record["version"] == __version__ and record["started"] > 0
    assert stat.S_IMODE(os.stat(first.state / "kernel.json").st_mode) == 0o600
    second = kernel_factory(start=False)
    second.state = first.state
    second.socket = short_tmp_path / "other" / "kernel.sock"
    second.start(wait=False)
    code, err = _exit_code(second)
    assert code == EXIT_REFUSED, err
    assert f"pid {first.pid}" in err and str(first.socket) in err, err
    assert not os.path.lexists(second.socket)
    assert _ping(first.socket)["kernel"]["pid"] == first.pid
    assert first.stop() == 0
    assert not (first.state / "kernel.json").exists()  # a stopped kernel leaves no record


def test_refuses_symlinked_socket_dir_and_leaves_its_target_alone(kernel_factory, short_tmp_path):
    k = kernel_factory(start=False)
    target = short_tmp_path / "squatted"
    target.mkdir()
    os.chmod(target, 0o755)
    os.symlink(target, k.socket.parent)
    k.start(wait=False)
    code, err = _exit_code(k)
    assert code == EXIT_REFUSED, err
    assert "is a symlink" in err and "Traceback" not in err
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755  # not chmod-ed through the link
    assert list(target.iterdir()) == []  # nothing bound there


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a directory to another uid")
def test_refuses_socket_dir_of_another_user(kernel_factory):
    k = kernel_factory(start=False)
    k.socket.parent.mkdir(mode=0o700)
    os.chown(k.socket.parent, 65534, 65534)
    k.start(wait=False)
    code, err = _exit_code(k)
    assert code == EXIT_REFUSED, err
    assert "belongs to uid 65534" in err
    assert not os.path.lexists(k.socket)


def test_refuses_foreign_live_listener(tmp_path, kernel_factory):
    """A listener that is not a shoal kernel (no lock held) is refused too, left alone."""
    k = kernel_factory(start=False)
    k.socket.parent.mkdir(mode=0o700)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(k.socket))
    other.listen(1)
    try:
        k.start(wait=False)
        code, err = _exit_code(k)
        assert code == EXIT_REFUSED, err
        assert "already listening" in err
        assert stat.S_ISSOCK(os.lstat(k.socket).st_mode)
    finally:
        other.close()


def test_refuses_non_socket_path(kernel_factory):
    k = kernel_factory(start=False)
    k.socket.parent.mkdir(mode=0o700)
    k.socket.write_text("precious data\n")
    k.start(wait=False)
    code, err = _exit_code(k)
    assert code == EXIT_REFUSED, err
    assert "not a socket" in err
    assert k.socket.read_text() == "precious data\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a socket to another uid")
def test_refuses_other_users_socket(kernel_factory):
    k = kernel_factory(start=False)
    k.socket.parent.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(k.socket))
    stale.close()  # a stale socket… but owned by someone else
    os.chown(k.socket, 65534, 65534)
    k.start(wait=False)
    code, err = _exit_code(k)
    assert code == EXIT_REFUSED, err
    assert "belongs to uid 65534" in err
    assert os.lstat(k.socket).st_uid == 65534  # not replaced


def test_replaces_own_stale_socket(kernel_factory):
    first = kernel_factory()
    first.stop(signal.SIGKILL)
    assert stat.S_ISSOCK(os.lstat(first.socket).st_mode)  # left behind by the kill
    with pytest.raises(KernelLost):
        KernelClient(first.socket)
    second = kernel_factory()
    assert _ping(second.socket)["kernel"]["pid"] == second.pid
    assert stat.S_IMODE(os.lstat(second.socket).st_mode) == 0o600


def test_concurrent_starts_exactly_one_wins(kernel_factory):
    kernels = [kernel_factory(wait=False) for _ in range(5)]
    # All but one exit; the winner keeps serving.
    wait_until(lambda: sum(k.proc.poll() is None for k in kernels) <= 1, timeout=20)
    winner = wait_until(lambda: _serving_pid(kernels[0].socket), timeout=10)
    alive = [k for k in kernels if k.proc.poll() is None]
    assert [k.pid for k in alive] == [winner]
    losers = [k for k in kernels if k.pid != winner]
    for k in losers:
        code, err = _exit_code(k)
        assert code == 0, err
        assert "holds the lock" in err
    time.sleep(0.3)  # a negative: the winner must not follow the losers out
    assert alive[0].proc.poll() is None
    assert _ping(kernels[0].socket)["kernel"]["pid"] == winner


def _serving_pid(path: Path) -> int | None:
    try:
        return _ping(path)["kernel"]["pid"]
    except (KernelLost, OSError):
        return None


def test_sigterm_removes_socket_and_kills_tasks(kernel_factory):
    k = kernel_factory()
    c = k.client("daemon-term")
    handle = c.call("exec", {"src": "sleep 1000", "background": True}, timeout=10)
    record = c.call("task.get", {"task": handle["task"]}, timeout=10)
    pgid = record["pid"]
    assert os.getpgid(pgid) == pgid  # the task leads its own process group
    members = wait_until(
        lambda: [
            p
            for p in pgid_members(pgid)
            if "sleep" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        ],
        timeout=10,
    )
    sleep_pid = members[0]
    close_client(c)
    assert k.stop(signal.SIGTERM) == 0
    assert not os.path.lexists(k.socket)
    wait_until(lambda: not pid_alive(sleep_pid), timeout=10)
    wait_until(lambda: not pgid_members(pgid), timeout=10)
    assert "stopped" in k.log()


def test_existing_private_dirs_are_tightened(kernel_factory):
    k = kernel_factory(start=False)
    k.socket.parent.mkdir(mode=0o755)
    os.chmod(k.socket.parent, 0o755)
    k.state.mkdir(mode=0o755)
    os.chmod(k.state, 0o755)
    k.start()
    assert stat.S_IMODE(os.stat(k.socket.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(k.state).st_mode) == 0o700


@pytest.mark.parametrize("which", ["socket", "state"])
def test_refuses_shared_directories_untouched(kernel_factory, which):
    """``--socket /tmp/x.sock`` must not chmod /tmp; a sticky/world-writable dir is refused."""
    k = kernel_factory(start=False)
    shared = k.socket.parent if which == "socket" else k.state
    shared.mkdir()
    os.chmod(shared, 0o1777)
    k.start(wait=False)
    code, err = _exit_code(k)
    assert code == EXIT_REFUSED, err
    assert "shared" in err and "Traceback" not in err
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_refuses_peer_of_another_uid(kernel_factory, short_tmp_path):
    k = kernel_factory(start=False)
    # pytest's tmp dirs are 0700: put this socket where uid 65534 can traverse to it.
    outer = short_tmp_path
    os.chmod(outer, 0o711)
    k.socket = outer / "run" / "kernel.sock"
    k.start()
    # Let uid 65534 reach the socket at all (the 0700 dir / 0600 socket normally stop
    # it), so the kernel's own SO_PEERCRED check is what refuses it.
    os.chmod(k.socket.parent, 0o711)
    os.chmod(k.socket, 0o666)
    _peer_refused(k)


def _peer_refused(k) -> None:
    data = exchange_as_uid(k.socket, b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    lines = [orjson.loads(line) for line in data.splitlines() if line.strip()]
    assert len(lines) == 1, data  # one refusal, then EOF: the ping was never served
    assert lines[0]["error"]["code"] == ErrorCode.AUTH_FAILED
    assert "id" not in lines[0]
    assert _ping(k.socket)["kernel"]["pid"] == k.pid  # our own uid still served
