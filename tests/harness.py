"""Live-test harness: a real shoal-kernel on a temporary socket and state dir.

No mocks: tests drive the daemon over its Unix socket (``KernelClient``) or through a
real ``shoal-mcp`` subprocess over pipes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from shoal_mcp.client import KernelClient, KernelLost

READY_TIMEOUT_S = 10.0


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for kernel/facade children: same backend choice as this test run."""
    env = dict(os.environ)
    env.pop("SHOAL_TOKEN", None)
    env.update(extra or {})
    return env


class KernelProcess:
    """A ``python -m shoal_mcp.kernel`` child with its own socket and state dir."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.tmp = Path(tmp)
        self.socket = self.tmp / "run" / "kernel.sock"
        self.state = self.tmp / "state"
        self.args = list(args)
        self.env = child_env(env)
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
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"kernel exited {self.proc.returncode}: {err.decode()[-2000:]}")
            try:
                KernelClient(self.socket).close()
                return
            except KernelLost:
                time.sleep(0.02)
        raise TimeoutError("kernel did not become ready")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(
        self, session: str = "default", token: str | None = None, attach: bool = True
    ) -> KernelClient:
        c = KernelClient(self.socket)
        if attach:
            params: dict = {"session": session}
            if token:
                params["token"] = token
            c.call("session.attach", params, timeout=30)
        return c

    def vm_hwm_kib(self) -> int:
        """Peak resident set (VmHWM) of the kernel process, in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log(self) -> str:
        path = self.state / "kernel.log"
        return path.read_text() if path.exists() else ""


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until truthy (returned) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


NOBODY_UID = 65534


def exchange_as_uid(path: Path, request: bytes, uid: int = NOBODY_UID) -> bytes:
    """Connect to ``path`` from a forked child running as ``uid`` (needs root), send
    ``request`` and return every byte received until EOF. Fails if the child could not
    connect."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, talk, report through the pipe
        code = 1
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(str(path))
            try:
                s.sendall(request)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before we finished writing; the refusal is still readable
            try:
                while chunk := s.recv(65536):
                    os.write(wfd, chunk)
            except ConnectionResetError:
                pass  # the kernel closed on us with our request unread: that is EOF too
            code = 0
        except BaseException as exc:  # noqa: BLE001 - report and exit, never return
            os.write(wfd, f"CHILD-ERROR {exc!r}".encode())
        finally:
            os._exit(code)
    os.close(wfd)
    chunks = []
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return data
