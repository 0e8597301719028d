"""One exchange with a Unix socket from a forked child running as another uid (needs root)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

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
