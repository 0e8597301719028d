"""A kernel link to another host through the user's own ``ssh`` (docs/decisions.md).

``shoal-mcp --host [user@]host[:port]`` and ``shoal --host`` reach the kernel of that
host by running ``ssh -T -o BatchMode=yes [-p port] [user@]host <shoal> kernel bridge``:
the remote ``shoal kernel bridge`` attaches to (or autostarts) the user's kernel there and
relays frames between its stdio and the kernel socket. Locally the ssh process's stdin
and stdout are one end of a socketpair, and the other end is handed to ``KernelClient``
as its connection: the demux, the heartbeat, the budgets and the framing limit work on it
exactly as on a local Unix socket. sshd is the only remote entry; nothing here listens.

When the link breaks, every pending call fails with ``KernelLost`` naming the host,
ssh's exit status and the last lines ssh (or the bridge) wrote to stderr, translated for
the usual causes: an unknown host, a refused key, shoal missing on the host.
"""

from __future__ import annotations

import collections
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from .client import KernelClient, KernelLost
from .protocol.limits import SSH_CONNECT_TIMEOUT_S, SSH_EXIT_WAIT_S, SSH_STDERR_LINES

HOST_ENV = "SHOAL_HOST"
"""``[user@]host[:port]``: the host whose kernel the facade (or the CLI) uses."""
SSH_ENV = "SHOAL_SSH"
"""The ssh command to run, as shell words (default ``ssh``; e.g. ``ssh -F ~/.ssh/work``)."""
REMOTE_COMMAND_ENV = "SHOAL_REMOTE_COMMAND"
"""The shoal command on the remote host, as text for its shell (default ``shoal``; e.g.
``~/venv/bin/shoal`` or ``env SHOAL_STATE_DIR=/data/shoal shoal``)."""
REMOTE_DIR_ENV = "SHOAL_REMOTE_DIR"
"""An absolute directory on the host: the remote session's working directory, as the
local one is for a local facade (the sandboxed agent's project is its git work tree, else
the directory itself).  Unset: the host's default session, and no project there."""
BRIDGE_ARGS = ("kernel", "bridge")
COMMAND_NOT_FOUND = 127
"""The remote shell's status when the command does not exist there."""
SSH_FAILED = 255
"""ssh's own status when it could not connect or log in."""

_HOST_RE = re.compile(
    r"^(?:(?P<user>[^@\s:/\-][^@\s:/]*)@)?"  # nothing may start with "-" (an ssh option)
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^@\s:/\[\]\-][^@\s:/\[\]]*)"
    r"(?::(?P<port>\d+))?$"
)


class BadHost(KernelLost):
    """``--host`` / ``SHOAL_HOST`` is not ``[user@]host[:port]``."""


@dataclass(frozen=True)
class RemoteHost:
    user: str | None
    host: str
    port: int | None = None

    @property
    def label(self) -> str:
        """``user@host:port`` as given (what messages and results name)."""
        at = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{at}{self.host}{port}"

    def ssh_argv(self, remote_args: tuple[str, ...]) -> list[str]:
        """The ssh command line running ``<remote shoal> *remote_args`` on the host."""
        ssh = shlex.split(os.environ.get(SSH_ENV, "") or "ssh")
        # The user's remote command is remote shell text (``~/venv/bin/shoal`` expands
        # there); only our own arguments are quoted.
        remote = os.environ.get(REMOTE_COMMAND_ENV, "").strip() or "shoal"
        options = ["-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"]
        if self.port:
            options += ["-p", str(self.port)]
        target = f"{self.user}@{self.host}" if self.user else self.host
        target = target.replace("[", "").replace("]", "")
        command = " ".join([remote, *(shlex.quote(arg) for arg in remote_args)])
        return [*ssh, *options, "--", target, command]


def parse_host(spec: str) -> RemoteHost:
    """``[user@]host[:port]`` (an IPv6 address in brackets) → ``RemoteHost``."""
    match = _HOST_RE.match(spec.strip())
    port = int(match["port"]) if match and match["port"] else None
    if match is None or (port is not None and not 0 < port < 65536):
        raise BadHost(
            f"bad host {spec!r}: expected [user@]host[:port] (e.g. alice@build.example:2222)"
        )
    return RemoteHost(match["user"], match["host"], port)


def configured_host(explicit: str | None = None) -> RemoteHost | None:
    """The host named by ``explicit`` (``--host``), else ``SHOAL_HOST``; None: local."""
    spec = explicit or os.environ.get(HOST_ENV, "")
    return parse_host(spec) if spec.strip() else None


def remote_dir(explicit: str | None = None) -> str | None:
    """The directory named by ``explicit`` (``--remote-dir``), else ``SHOAL_REMOTE_DIR``;
    an absolute path on the host (a local ``~`` or relative path would mean this
    machine's).  Its existence is the remote kernel's to judge: its attach refuses a
    cwd that is not a directory there."""
    path = (explicit or os.environ.get(REMOTE_DIR_ENV, "")).strip()
    if not path:
        return None
    if not path.startswith("/"):
        raise BadHost(f"bad remote dir {path!r}: expected an absolute path on the host")
    return path


class SshProcess:
    """One ``ssh`` child whose stdin and stdout are a socketpair end; keeps its last
    stderr lines for error messages."""

    def __init__(self, host: RemoteHost, remote_args: tuple[str, ...]) -> None:
        self.host = host
        self.argv = host.ssh_argv(remote_args)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.PIPE,
                start_new_session=True,  # the MCP client's Ctrl-C is not ours to pass on
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            raise KernelLost(
                f"cannot run ssh ({self.argv[0]}) to reach {host.label}: {exc}"
            ) from exc
        finally:
            theirs.close()  # only ssh holds it now: its exit is our EOF
        self.sock = ours
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=SSH_STDERR_LINES)
        self._stderr_reader = threading.Thread(
            target=self._read_stderr, name="ssh-stderr", daemon=True
        )
        self._stderr_reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode(errors="replace").strip()
            if line:
                self.stderr_tail.append(line)

    def exit_reason(self) -> str:
        """Why the link ended, in the user's terms (waits briefly for ssh to exit)."""
        try:
            code = self.proc.wait(SSH_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr_reader.join(SSH_EXIT_WAIT_S)
        said = "; ".join(self.stderr_tail)
        label = self.host.label
        if code is None:
            return f"the ssh link to {label} closed" + (f" ({said})" if said else "")
        if code < 0:
            return f"the ssh link to {label} was cut (ssh killed by signal {-code})"
        if code == COMMAND_NOT_FOUND:
            remote = os.environ.get(REMOTE_COMMAND_ENV, "") or "shoal"
            return (
                f"shoal is not installed on {label} (the remote shell has no `{remote}`: "
                f"{said or 'command not found'}); install it there, or set "
                f"{REMOTE_COMMAND_ENV} to its path (e.g. ~/venv/bin/shoal)"
            )
        if code == SSH_FAILED:
            return f"ssh to {label} failed: {said or 'exit status 255'}{ssh_hint(said)}"
        return f"the shoal bridge on {label} exited with status {code}" + (
            f": {said}" if said else ""
        )

    def close(self) -> None:
        """End ssh (its stdin's EOF ends the bridge first); never leaves a child behind."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.proc.wait(SSH_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.proc.wait(SSH_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self._stderr_reader.join(SSH_EXIT_WAIT_S)
            self.proc.stderr.close()


def ssh_hint(said: str) -> str:
    """What to do about ssh's usual complaints (BatchMode: ssh never prompts)."""
    text = said.lower()
    if "could not resolve" in text or "name or service not known" in text:
        return " (unknown host: check the name, or add it to ~/.ssh/config)"
    if "permission denied" in text:
        return (
            " (shoal runs ssh with BatchMode=yes, so it cannot ask for a password: load a "
            "key into ssh-agent or name one with IdentityFile in ~/.ssh/config)"
        )
    if "host key verification failed" in text:
        return " (the host key is not known yet: run `ssh HOST true` once to accept it)"
    if "connection refused" in text or "timed out" in text:
        return " (is sshd running there, and is the port right?)"
    return ""


class RemoteKernelClient(KernelClient):
    """A ``KernelClient`` whose connection is ``ssh host shoal kernel bridge``."""

    def __init__(self, host: RemoteHost, on_event: Callable[[dict], None] | None = None) -> None:
        self.host = host
        self._closing = False
        self.ssh = SshProcess(host, BRIDGE_ARGS)
        # ``path`` only names the kernel in messages: the host, and that ssh carries it.
        try:
            super().__init__(
                Path(f"{host.label} (over ssh)"),
                on_event,
                connected=(self.ssh.sock, self.ssh.pid),
            )
        except BaseException:
            self.ssh.close()
            raise

    def start_call(self, method: str, params: dict | None = None) -> tuple[int, Future]:
        try:
            return super().start_call(method, params)
        except KernelLost as exc:  # not sent: ssh is gone; say why, not "broken pipe"
            if self._closing:
                raise
            raise KernelLost(self.ssh.exit_reason()) from exc

    def _lost(self, reason: str) -> None:
        if not self._closing:  # not a close of ours: say why the link ended
            reason = self.ssh.exit_reason()
        super()._lost(reason)

    def stalled_message(self, doing: str = "") -> str:
        return (
            f"no answer from the shoal kernel on {self.host.label} over ssh within "
            f"{self.liveness_timeout:g} s {doing}".rstrip()
            + " (network down, ssh hung, or the remote kernel stopped: `shoal doctor --host "
            f"{self.host.label}`)"
        )

    def close(self) -> None:
        self._closing = True
        super().close()
        self.ssh.close()


def connect_remote(
    host: RemoteHost, on_event: Callable[[dict], None] | None = None
) -> RemoteKernelClient:
    """A client on ``host``'s kernel (autostarted there by the bridge unless the remote
    side's ``SHOAL_NO_AUTOSTART`` forbids it); failures surface on the first call."""
    return RemoteKernelClient(host, on_event)


def run_remote(host: RemoteHost, args: tuple[str, ...], timeout: float) -> tuple[int, str, str]:
    """Run ``<remote shoal> *args`` over ssh (``shoal doctor --host``): (status, out, err)."""
    argv = host.ssh_argv(args)
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return SSH_FAILED, "", f"ssh to {host.label} did not finish within {timeout:g} s"
    except OSError as exc:
        return SSH_FAILED, "", f"cannot run ssh ({argv[0]}): {exc}"
    return (
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )
