"""A real OpenSSH server on a loopback port, and a client set up to reach it.

The server is the distribution's ``/usr/sbin/sshd`` (``.ci/run`` installs it) in the
foreground (``-D -e``) with its own host key, config, pid file and authorized key, all in
a temp dir; it lets in the user running the tests, by key only. The client side is a
config file for ``ssh -F`` (identity, known_hosts with the server's key, port), so
nothing of the user's own ~/.ssh is read or written.

``RemoteSide`` is the "other host": a state dir and socket of its own, reached only
through ``shoal kernel bridge`` run by sshd (``SHOAL_REMOTE_COMMAND`` passes them on).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .kernel import child_env
from .polling import wait_until
from .tmp import short_tmp

SSHD = Path("/usr/sbin/sshd")
SSHD_MISSING = (
    f"{SSHD} is not installed (openssh-server; .ci/run installs it): the remote-host tests "
    "need a real sshd"
)
READY_TIMEOUT_S = 15.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class SshServer:
    dir: Path
    port: int
    user: str
    client_config: Path
    proc: subprocess.Popen

    @property
    def host_spec(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    @property
    def ssh_command(self) -> str:
        """``SHOAL_SSH`` for this server (its own client config, nothing of ~/.ssh)."""
        return f"ssh -F {shlex.quote(str(self.client_config))}"

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-F", str(self.client_config), "-p", str(self.port), "127.0.0.1"]


@contextlib.contextmanager
def running_sshd() -> Iterator[SshServer]:
    """sshd on 127.0.0.1:<free port> for the current user; stopped afterwards."""
    with short_tmp("shssh-") as tmp:
        os.chmod(tmp, 0o755)  # sshd checks nothing here (StrictModes no), ssh reads it
        host_pub = _keygen(tmp / "host_key")
        client_pub = _keygen(tmp / "client_key")
        (tmp / "authorized_keys").write_text(client_pub + "\n")
        os.chmod(tmp / "authorized_keys", 0o600)
        with contextlib.suppress(PermissionError):  # not root: sshd runs unprivileged
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        port = _free_port()
        (tmp / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host_key'}\n"
            f"PidFile {tmp / 'sshd.pid'}\nAuthorizedKeysFile {tmp / 'authorized_keys'}\n"
            "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nMaxStartups 100:30:200\nMaxSessions 100\n"
            "LogLevel ERROR\n"
        )
        (tmp / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
        config = tmp / "ssh_config"
        config.write_text(
            f"Host *\n  IdentityFile {tmp / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {tmp / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            "  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        )
        log = open(tmp / "sshd.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(tmp / "sshd_config")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        server = SshServer(tmp, port, getpass.getuser(), config, proc)
        try:
            wait_until(
                lambda: proc.poll() is not None or _accepts(port),
                timeout=READY_TIMEOUT_S,
                what="sshd listening",
            )
            assert proc.poll() is None, (tmp / "sshd.log").read_text()
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def shoal_script() -> Path:
    """The ``shoal`` of this interpreter's installation (what the "remote" host runs)."""
    return Path(sys.executable).absolute().parent / "shoal"


@dataclass
class RemoteSide:
    """The remote host's shoal: its own state dir and socket, reached through sshd."""

    dir: Path
    server: SshServer

    @property
    def state(self) -> Path:
        return self.dir / "state"

    @property
    def socket(self) -> Path:
        return self.dir / "run" / "kernel.sock"

    def env(self) -> dict[str, str]:
        """The remote shoal's environment (sshd gives the command a bare one)."""
        pure = os.environ.get("SHOAL_PURE_PYTHON")
        return {
            "SHOAL_STATE_DIR": str(self.state),
            "SHOAL_SOCKET": str(self.socket),
            "SHOAL_KERNEL_CONFIG": "",
            **({"SHOAL_PURE_PYTHON": pure} if pure else {}),
        }

    def remote_command(self, extra: dict[str, str] | None = None) -> str:
        """``SHOAL_REMOTE_COMMAND``: ``env <the remote env> <this install's shoal>``."""
        env = {**self.env(), **(extra or {})}
        words = ["env", *(f"{k}={v}" for k, v in env.items()), str(shoal_script())]
        return " ".join(shlex.quote(w) for w in words)

    def client_env(self, **extra: str) -> dict[str, str]:
        """A local facade's / CLI's environment for this host: no local kernel anywhere
        (its own, never-created state dir; no autostart here)."""
        env = child_env(
            {
                "SHOAL_HOST": self.server.host_spec,
                "SHOAL_SSH": self.server.ssh_command,
                "SHOAL_REMOTE_COMMAND": self.remote_command(),
                "SHOAL_STATE_DIR": str(self.dir / "local-state"),
                "SHOAL_SOCKET": str(self.dir / "local-run" / "kernel.sock"),
                "SHOAL_NO_AUTOSTART": "1",
                "SHOAL_UNCONFINED": "1",
                "SHOAL_SESSION": "default",
            }
        )
        env.update(extra)
        return env

    def stop_kernel(self) -> None:
        subprocess.run(
            [str(shoal_script()), "kernel", "stop"],
            env=child_env(self.env()),
            capture_output=True,
            timeout=30,
            check=False,
        )


@contextlib.contextmanager
def remote_side(server: SshServer) -> Iterator[RemoteSide]:
    """A fresh "remote host" state; its kernel (autostarted by the bridge) is stopped after."""
    with short_tmp("shrem-") as tmp:
        side = RemoteSide(tmp, server)
        try:
            yield side
        finally:
            side.stop_kernel()
