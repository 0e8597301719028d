"""``exec`` with a stdin (``shoal exec -i``): a FIFO the client feeds, at the command's fd 0.

The client (same uid) makes a FIFO in a private directory and names it in ``exec``'s
``stdin`` param; the kernel opens its read end and hands it to the command through the
supervisor's extra descriptors (``Supervisor.run``'s ``fds``/``targets``), placed at 0.
Nothing is read by the kernel itself. Only a FIFO of the kernel's own uid is accepted: a
path naming a regular file, a device or another user's FIFO is refused (-32602).
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import Any

from ...protocol.errors import invalid_params
from .supervisor import Job, Supervisor

STDIN_FD = 0


def open_stdin_fifo(path: str) -> int:
    """The read end of the client's FIFO at ``path``, blocking reads, close-on-exec."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise invalid_params("stdin", f"cannot open {path!r}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise invalid_params("stdin", "must name a FIFO of the kernel's user")
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return fd


class StdinSupervisor:
    """A supervisor whose next job also gets ``fd`` as its stdin.

    Wraps the principal's warm zygote, or (none warm) a one-job cold one started here
    and told it is the last job, as ``runner.spawn`` does for its own cold ones."""

    def __init__(self, inner: Supervisor | None, spec_bytes: bytes, fd: int) -> None:
        self.cold = inner is None
        self.inner = inner if inner is not None else Supervisor(spec_bytes)
        self.fd = fd

    def run(
        self,
        argv: list[bytes],
        cwd: bytes,
        env: dict[bytes, bytes],
        fds: list[int],
        targets: list[int],
        cap: int,
        **kwargs: Any,
    ) -> Job:
        if self.cold:
            kwargs["last"] = True
        return self.inner.run(argv, cwd, env, [*fds, self.fd], [*targets, STDIN_FD], cap, **kwargs)
