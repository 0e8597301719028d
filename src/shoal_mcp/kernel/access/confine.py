"""Which processes the kernel confines, and in what (docs/security.md, The OS sandbox).

The kernel holds one :class:`Confinement`, built at start from ``--sandbox``:

* ``off``       nothing is confined; ``caps.enforced`` is ``false``.
* ``auto``      (default) confine sandboxed principals when :func:`sandbox.probe` saw
  Landlock and the unix-socket filter enforce; otherwise run as ``off`` and say so.
* ``required``  as ``auto``, but the kernel refuses to start without enforcement.

A principal is confined when its policy says ``sandbox`` (token principals by default,
the local human only with ``sandbox = true``) and the sandbox enforces.  Its spec is
built fresh for every process from its grants (``sandbox_build``), so a grant's
directory created after start is covered; the kernel's state dir and socket dir are
always cut out.  Each confined principal gets a private temp dir (``TMPDIR``), made
on first use and removed when the kernel closes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from ...protocol.errors import ErrorCode, RpcError
from . import sandbox
from .policy import PrincipalPolicy
from .sandbox import SandboxError, SandboxSpec, SandboxSupport

MODES = ("auto", "required", "off")
TMPDIR_PREFIX = "shoal-sandbox-"


class SandboxUnavailable(RuntimeError):
    """``--sandbox required`` on a machine where the sandbox does not enforce."""


class Confinement:
    """The kernel's sandbox mode, what the machine enforces, and specs per principal."""

    def __init__(
        self,
        mode: str,
        *,
        forbidden: tuple[str, ...],
        support: SandboxSupport | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {' | '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.forbidden = tuple(forbidden)
        if support is None:
            support = SandboxSupport(reason="--sandbox off") if mode == "off" else sandbox.probe()
        self.support = support
        self.enforcing = mode != "off" and support.enforced() is not False
        if mode == "required" and not self.enforcing:
            raise SandboxUnavailable(
                "--sandbox required, but this machine cannot confine processes: "
                + (support.reason or "Landlock or the unix-socket filter did not enforce")
            )
        self._tmpdirs: dict[str, str] = {}
        self._lock = threading.Lock()

    def enforced(self) -> dict[str, object] | bool:
        """``caps.enforced`` for a confined principal: what the OS enforces here."""
        return self.support.enforced() if self.enforcing else False

    def applies_to(self, policy: PrincipalPolicy) -> bool:
        """Whether this principal's processes run confined."""
        return self.enforcing and policy.sandboxed

    def status(self) -> dict[str, object]:
        """For ``ping``/``shoal doctor``: the mode and what it enforces."""
        return {
            "mode": self.mode,
            "enforced": self.support.enforced() if self.enforcing else False,
            "reason": "" if self.enforcing else (self.support.reason or "off"),
        }

    def spec_for(
        self,
        policy: PrincipalPolicy,
        *,
        ttys: tuple[str, ...] = (),
        also_read: tuple[str, ...] = (),
    ) -> SandboxSpec | None:
        """The spec for one process of ``policy``'s principal, or None when unconfined.
        ``also_read``: exact kernel-made paths it may read even inside the state dir
        (``$SHOAL_OUT``: the caller's own outputs).

        Fails closed: a spec that cannot be built raises -32010 and nothing runs."""
        if not self.applies_to(policy):
            return None
        try:
            return policy.sandbox_spec(
                tmpdir=self._tmpdir(policy.principal),
                forbidden=self.forbidden,
                ttys=ttys,
                also_read=also_read,
            )
        except (SandboxError, OSError) as e:
            raise RpcError(
                ErrorCode.DENIED,
                f"cannot build the sandbox for {policy.principal}: {e}",
                {"principal": policy.principal, "sandbox": str(e)},
            ) from e

    def _tmpdir(self, principal: str) -> str:
        with self._lock:
            path = self._tmpdirs.get(principal)
            if path is None or not os.path.isdir(path):
                path = tempfile.mkdtemp(prefix=TMPDIR_PREFIX)  # 0700, fresh name
                self._tmpdirs[principal] = path
            return path

    def close(self) -> None:
        """Remove the private temp dirs (kernel exit)."""
        with self._lock:
            paths, self._tmpdirs = list(self._tmpdirs.values()), {}
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


def kernel_forbidden(state_dir: Path, socket: Path) -> tuple[str, ...]:
    """What no sandboxed process may reach: the state dir and the socket's directory."""
    return (str(state_dir), str(socket.parent), str(socket))
