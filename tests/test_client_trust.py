"""Clients trust nothing at the socket path (SPEC §4.1, issue 14) and wait for nothing
forever (issue 19): another user squatting the socket directory receives no byte; a
kernel that stops answering is named as stalled, and ``shoal kernel stop`` ends it.

Real processes only: the squatter is a listener run as uid 65534 through ``setpriv``;
the stalled kernel is a real ``shoal-kernel`` under SIGSTOP.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shoal_mcp.client import KernelClient, KernelStalled, KernelUntrusted
from tests.support.kernel import child_env, close_client
from tests.support.other_uid import NOBODY_UID
from tests.support.polling import wait_until
from tests.support.procfs import pid_alive
from tests.test_cli import shoal

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another uid")

# A listener that reports, on stdout, every byte each connection sent it (hex) once the
# peer hangs up or 3 s pass. Runs with the system python: stdlib only.
SQUATTER = r"""
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
os.chmod(path, 0o777)
srv.listen(8)
print("ready", flush=True)
srv.settimeout(60)
while True:
    try:
        conn, _ = srv.accept()
    except OSError:
        break
    conn.settimeout(3)
    got = b""
    try:
        while chunk := conn.recv(65536):
            got += chunk
    except OSError:
        pass
    print("conn " + got.hex(), flush=True)
    conn.close()
"""


def _squat(sock: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={NOBODY_UID}",
            f"--regid={NOBODY_UID}",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            SQUATTER,
            str(sock),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def _received(proc: subprocess.Popen) -> list[bytes]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return [bytes.fromhex(line[5:]) for line in out.splitlines() if line.startswith("conn ")]


def _cli_env(sock: Path, root: Path) -> dict[str, str]:
    return child_env(
        {
            "SHOAL_SOCKET": str(sock),
            "SHOAL_STATE_DIR": str(root / "state"),
            "SHOAL_TOKEN": "shoal_SECRET-TOKEN-never-to-be-sent",
            "SHOAL_NO_AUTOSTART": "1",
        }
    )


@needs_root
def test_squatted_socket_dir_receives_nothing(short_tmp_path):
    """The socket directory belongs to another user: refused before connecting."""
    os.chmod(short_tmp_path, 0o711)
    squatted = short_tmp_path / "run"
    squatted.mkdir(mode=0o755)
    os.chown(squatted, NOBODY_UID, NOBODY_UID)
    sock = squatted / "kernel.sock"
    squatter = _squat(sock)
    proc = shoal(_cli_env(sock, short_tmp_path), "exec", "echo SECRET-CMD", check=False)
    assert proc.returncode == 125
    assert f"belongs to uid {NOBODY_UID}" in proc.stderr and "SECRET-CMD" not in proc.stdout
    assert _received(squatter) == []  # not even a connection


@needs_root
def test_squatter_socket_in_our_dir_gets_no_byte(short_tmp_path):
    """Our directory, but another user's listener at the path: the peer credentials
    (SO_PEERCRED) refuse it after connect and before the first byte."""
    os.chmod(short_tmp_path, 0o711)
    run = short_tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o777)  # careless, but ours: only the peer check stands in the way
    sock = run / "kernel.sock"
    squatter = _squat(sock)
    proc = shoal(_cli_env(sock, short_tmp_path), "exec", "echo SECRET-CMD", check=False)
    assert proc.returncode == 125
    assert f"served by uid {NOBODY_UID}" in proc.stderr, proc.stderr
    with pytest.raises(KernelUntrusted):
        KernelClient(sock)
    received = _received(squatter)
    assert received and all(data == b"" for data in received), received


def test_symlinked_socket_dir_is_refused_by_clients(short_tmp_path, kernel_factory):
    k = kernel_factory()
    link = short_tmp_path / "link"
    os.symlink(k.socket.parent, link)
    with pytest.raises(KernelUntrusted, match="symlink"):
        KernelClient(link / k.socket.name)


# -- stalls ---------------------------------------------------------------------------------


def test_listener_that_never_answers_is_named_stalled(short_tmp_path):
    sock = short_tmp_path / "mute.sock"
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(sock))
    mute.listen(4)
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: held.append(mute.accept()[0]), daemon=True)
    accepting.start()
    client = KernelClient(sock, liveness_interval=0.2, liveness_timeout=0.5)
    try:
        with pytest.raises(KernelStalled, match=r"stalled.*session\.attach"):
            client.call("session.attach", {})
        client.liveness_interval = 60  # now the call's own ceiling is what runs out
        with pytest.raises(KernelStalled, match="did not answer kernel.status within 0.3 s"):
            client.call("kernel.status", {}, timeout=0.3)
        assert not client._pending  # given-up calls are forgotten
    finally:
        close_client(client)
        for conn in held:
            conn.close()
        mute.close()


@pytest.fixture()
def cli_env():
    from tests.support.tmp import short_tmp

    with short_tmp("shoal-stall-") as root:
        env = child_env(
            {"SHOAL_SOCKET": str(root / "run" / "k.sock"), "SHOAL_STATE_DIR": str(root / "state")}
        )
        try:
            yield env
        finally:
            record = root / "state" / "kernel.json"
            if record.exists():
                pid = json.loads(record.read_text())["pid"]
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_stopped_kernel_is_reported_and_stopped(cli_env):
    shoal(cli_env, "kernel", "start")
    pid = json.loads((Path(cli_env["SHOAL_STATE_DIR"]) / "kernel.json").read_text())["pid"]
    os.kill(pid, signal.SIGSTOP)
    status = shoal(cli_env, "kernel", "status", "--json", check=False)
    assert status.returncode == 1
    report = json.loads(status.stdout)
    assert report["stalled"] and report["pid"] == pid and "stopped" in report["detail"]
    doctor = shoal(cli_env, "doctor", "--json", check=False)
    assert doctor.returncode == 1
    kernel = next(c for c in json.loads(doctor.stdout) if c["check"] == "kernel")
    assert kernel["status"] == "fail" and "stalled" in kernel["detail"]
    ran = shoal(cli_env, "exec", "echo hi", check=False, timeout=120)
    assert ran.returncode == 125 and "stalled" in ran.stderr, ran.stderr
    stopped = shoal(cli_env, "kernel", "stop", timeout=120)
    assert f"kernel {pid} stopped" in stopped.stdout
    wait_until(lambda: not pid_alive(pid), timeout=30, what="the kernel to exit")


# A "kernel" that ignores SIGTERM and never answers: only SIGKILL by pid ends it.
WEDGED = r"""
import os, signal, socket, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1])
srv.listen(8)
print("ready", flush=True)
held = []
while True:
    held.append(srv.accept()[0])
"""


def test_kernel_stop_escalates_to_sigkill(cli_env):
    sock = Path(cli_env["SHOAL_SOCKET"])
    sock.parent.mkdir(mode=0o700)
    wedged = subprocess.Popen(
        [sys.executable, "-c", WEDGED, str(sock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert wedged.stdout.readline().strip() == "ready"
        status = shoal(cli_env, "kernel", "status", check=False)
        assert status.returncode == 1 and "stalled" in status.stdout
        stopped = shoal(cli_env, "kernel", "stop", timeout=120)
        assert "sending SIGKILL" in stopped.stderr
        assert wedged.wait(30) == -signal.SIGKILL
        assert not sock.exists()  # the dead listener's socket is gone
    finally:
        if wedged.poll() is None:
            wedged.kill()
