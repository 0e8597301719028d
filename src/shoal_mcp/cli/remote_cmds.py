"""``shoal doctor --host H``: what a remote link needs, checked over the user's ssh.

Three checks, each naming what to do: the local ``ssh`` (and the ``sshd`` a test or a
self-hosted setup uses), the remote shoal (ssh logs in, the remote command exists, its
version against ours), and the remote kernel (reached through ``shoal kernel bridge``,
autostarted there if needed, its version and state dir); with a remote directory
(``--remote-dir``), a fourth: the kernel there attaches in it (the session it gets).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .. import __version__
from ..client import KernelLost
from ..client_transport import (
    COMMAND_NOT_FOUND,
    REMOTE_COMMAND_ENV,
    SSH_ENV,
    RemoteHost,
    connect_remote,
    run_remote,
    ssh_hint,
)
from ..protocol.errors import RpcError
from ..protocol.limits import CALL_TIMEOUT_S, SSH_CONNECT_TIMEOUT_S, STATUS_PROBE_TIMEOUT_S

SSHD = Path("/usr/sbin/sshd")
VERSION_PROBE_TIMEOUT_S = SSH_CONNECT_TIMEOUT_S + CALL_TIMEOUT_S / 4

Check = tuple[str, str, str]
CheckFn = Callable[[str, Callable[[], object]], Check]


def remote_checks(
    host: RemoteHost, check: CheckFn, warn: Callable[[str], None], directory: str | None = None
) -> list[Check]:
    """The doctor's checks for ``host`` (``check`` runs one and catches its failure)."""
    checks = [
        check("ssh", lambda: ssh_available(warn)),
        check(f"shoal on {host.label}", lambda: _remote_version(host, warn)),
        check(f"kernel on {host.label}", lambda: _remote_kernel(host, warn)),
    ]
    if directory:
        checks.append(check(f"{directory} on {host.label}", lambda: _remote_dir(host, directory)))
    return checks


def ssh_available(warn: Callable[[str], None]) -> str:
    ssh = (os.environ.get(SSH_ENV, "") or "ssh").split()[0]
    found = shutil.which(ssh)
    if found is None:
        raise RuntimeError(f"{ssh} not on PATH: install openssh-client")
    server = f"; sshd at {SSHD}" if SSHD.exists() else ""
    return f"{found}{server}"


def _remote_version(host: RemoteHost, warn: Callable[[str], None]) -> str:
    code, out, err = run_remote(host, ("--version",), VERSION_PROBE_TIMEOUT_S)
    said = "; ".join(line for line in err.strip().splitlines()[-3:] if line.strip())
    if code == COMMAND_NOT_FOUND:
        remote = os.environ.get(REMOTE_COMMAND_ENV, "") or "shoal"
        raise RuntimeError(
            f"no `{remote}` on {host.label} ({said or 'command not found'}): install shoal "
            f"there, or set {REMOTE_COMMAND_ENV} to its path"
        )
    if code != 0:
        raise RuntimeError(f"ssh to {host.label} failed (status {code}): {said}{ssh_hint(said)}")
    words = out.split()
    remote_version = words[1] if len(words) > 1 else out.strip()
    if remote_version != __version__:
        warn(
            f"version skew: {host.label} runs shoal {remote_version}, this machine "
            f"{__version__}; install the same version on both"
        )
    return f"shoal {remote_version} (same as here)"


def _remote_kernel(host: RemoteHost, warn: Callable[[str], None]) -> str:
    try:
        client = connect_remote(host)
    except KernelLost as exc:
        raise RuntimeError(str(exc)) from None
    try:
        info = client.call("ping", {}, STATUS_PROBE_TIMEOUT_S + SSH_CONNECT_TIMEOUT_S)
    except KernelLost as exc:
        raise RuntimeError(str(exc)) from None
    finally:
        client.close()
    kernel = info.get("kernel") or {}
    version = kernel.get("version")
    where = f"pid {kernel.get('pid', '?')}, state dir {kernel.get('state_dir', '?')}"
    if version != __version__:
        warn(
            f"version skew: the kernel on {host.label} runs {version}, this machine {__version__} ({where})"
        )
    return f"{where}, version {version}"


def _remote_dir(host: RemoteHost, directory: str) -> str:
    """Attach in ``directory`` there, as the facade will (the session is made if new)."""
    try:
        client = connect_remote(host)
    except KernelLost as exc:
        raise RuntimeError(str(exc)) from None
    try:
        attached = client.call(
            "session.attach",
            {"cwd": directory, "client": {"kind": "cli"}},
            STATUS_PROBE_TIMEOUT_S + SSH_CONNECT_TIMEOUT_S,
        )
    except RpcError as exc:
        raise RuntimeError(f"{exc.message}: create it there, or fix --remote-dir") from None
    except KernelLost as exc:
        raise RuntimeError(str(exc)) from None
    finally:
        client.close()
    return f"session {attached['session']}, cwd {attached['cwd']}"
