"""A real ``shoal-kernel`` child on a temporary socket and state dir.

Tests drive it over its Unix socket (``KernelProcess.client`` gives a ``KernelClient``;
``wire.RawConn`` speaks raw JSON lines) or through a real ``shoal-mcp`` (``facade``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from shoal_mcp.client import KernelClient
from shoal_mcp.kernel.access.namespaces import mounted_at

from .procfs import vm_hwm_kib
from .tmp import short_tmp

READY_TIMEOUT_S = 15.0


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for kernel/facade/CLI children: this run's, minus any bearer token
    (so the framing backend choice, e.g. ``SHOAL_PURE_PYTHON``, carries over)."""
    env = dict(os.environ)
    env.pop("SHOAL_TOKEN", None)
    env.update(extra or {})
    return env


class KernelProcess:
    """``python -m shoal_mcp.kernel`` with its socket at ``tmp/run/kernel.sock`` and its
    state in ``tmp/state``."""

    def __init__(
        self,
        tmp: Path,
        *args: str,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.tmp = Path(tmp)
        self.socket = self.tmp / "run" / "kernel.sock"
        self.state = self.tmp / "state"
        self.args = list(args)
        self.env = child_env(env)
        self.preexec_fn = preexec_fn  # e.g. set an rlimit the kernel and its tasks inherit
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> KernelProcess:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal_mcp.kernel",
                "--socket",
                str(self.socket),
                "--state-dir",
                str(self.state),
                *self.args,
            ],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=self.preexec_fn,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once the socket accepts a connection; raise if the kernel exits first.

        Probed with a bare socket rather than a ``KernelClient``: nothing of the probe
        (no reader thread) can outlive it and touch a later connection.
        """
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                _, err = self.proc.communicate()
                raise RuntimeError(f"kernel exited {self.proc.returncode}: {err.decode()[-2000:]}")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(self.socket))
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop(signal.SIGKILL)
                    raise TimeoutError("kernel did not become ready") from None
                time.sleep(0.02)
            finally:
                probe.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(
        self, session: str = "default", token: str | None = None, attach: bool = True
    ) -> KernelClient:
        """A ``KernelClient`` on this kernel, attached to ``session`` unless told not to."""
        c = KernelClient(self.socket)
        if attach:
            params: dict = {"session": session}
            if token:
                params["token"] = token
            c.call("session.attach", params, timeout=30)
        return c

    def vm_hwm_kib(self) -> int:
        """Peak resident set (VmHWM) of the kernel process, in KiB."""
        return vm_hwm_kib(self.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Signal the kernel and reap it (SIGKILL if it lingers); its exit code."""
        try:
            if self.proc is None or self.proc.poll() is not None:
                return None if self.proc is None else self.proc.returncode
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        finally:
            if self.proc is not None and self.proc.poll() is not None:
                unmount_outputs_view(self.state)

    def release_pipes(self) -> None:
        """Close this side of the stopped kernel's stdout/stderr pipes (teardown); left
        to the garbage collector they close in whichever later test it runs."""
        if self.proc is None or self.proc.poll() is None:
            return
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def log(self) -> str:
        path = self.state / "kernel.log"
        return path.read_text() if path.exists() else ""


@contextlib.contextmanager
def running_kernel(
    *args: str, env: dict[str, str] | None = None, prefix: str = "shoal-k-"
) -> Iterator[KernelProcess]:
    """A ready kernel in a fresh short temp dir; stopped and the dir removed afterwards."""
    with short_tmp(prefix) as tmp:
        kernel = KernelProcess(tmp, *args, env=env).start()
        try:
            yield kernel
        finally:
            kernel.stop()
            kernel.release_pipes()


def close_client(client: KernelClient) -> None:
    """Close a ``KernelClient`` and wait for its reader thread to end.

    (An early ``KernelClient.close`` released the fd before its reader thread had read
    it, so that thread could swallow replies meant for the next socket given the same fd
    number; fixed in client.py, and this keeps the tests independent of it.)
    """
    client.close()
    reader = getattr(client, "_reader", None)
    if reader is not None:
        reader.join(5)


def unmount_outputs_view(state: Path) -> None:
    """A root kernel's read-only ``$SHOAL_OUT`` mount outlives a SIGKILLed kernel (the
    next kernel on that state dir replaces it); a test that is done takes it down."""
    view = state / "outputs-ro"
    if os.geteuid() == 0 and mounted_at(str(view)):
        subprocess.run(["umount", "-l", str(view)], check=False)
