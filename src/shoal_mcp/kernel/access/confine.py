"""Which processes the kernel confines, and in what (docs/security.md, The OS sandbox).

The kernel holds one :class:`Confinement`, built at start from ``--sandbox``:

* ``off``       nothing is confined; ``caps.enforced`` is ``false``.
* ``auto``      (default) confine sandboxed principals when :func:`sandbox_probe.probe` saw
  Landlock and the unix-socket filter enforce; otherwise run as ``off`` and say so.
* ``required``  as ``auto``, but the kernel refuses to start without enforcement.

A principal is confined when its policy says ``sandbox`` (token principals by default,
the local human only with ``sandbox = true``) and the sandbox enforces.  Its spec is
built from its grants (``sandbox_build``), so a grant's directory created after start
is covered; the kernel's state dir and socket dir are always cut out.  Where the probe
saw namespaces work, the spec carries a view: the tree runs in namespaces of its own
on a read-only view of the system (``namespaces.py``), the trusted base
(:func:`trusted_base`) read-only whatever the grants say.  A built spec is
reused for ``SANDBOX_SPEC_TTL_S`` (building walks the grants and ``/etc``); the
supervisor re-checks each rule path when applying it, so a reused spec can be narrower
than a fresh one, never wider.  Each confined principal gets a private temp dir
(``TMPDIR``), made on first use under the kernel's temp root (:func:`sandbox_tmp_root`,
``<state>/tmp``: it counts against the state dir's budget, no /tmp cleaner removes it,
and it is outside every other principal's view; emptied at start: a killed kernel's
leftovers go with its successor) and removed when the kernel closes.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...protocol.errors import ErrorCode, RpcError
from ..config.limits import SANDBOX_MAX_PROCS, SANDBOX_SPEC_TTL_S
from ..net.limits import BRIDGE_PORT
from ..owner.tables import TABLES
from . import namespaces, sandbox_probe
from .policy import PrincipalPolicy
from .sandbox import SandboxError, SandboxSpec
from .sandbox_probe import SandboxSupport

if TYPE_CHECKING:
    from ..net.proxy import EgressProxy

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
        tmp_root: str | None = None,
        protect: tuple[str, ...] = (),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {' | '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.forbidden = tuple(forbidden)
        if support is None:
            support = (
                SandboxSupport(reason="--sandbox off") if mode == "off" else sandbox_probe.probe()
            )
        self.support = support
        self.enforcing = mode != "off" and support.enforced() is not False
        if mode == "required" and not self.enforcing:
            raise SandboxUnavailable(
                "--sandbox required, but this machine cannot confine processes: "
                + (support.reason or "Landlock or the unix-socket filter did not enforce")
            )
        self._tmp_root = _fresh_private_dir(tmp_root) if tmp_root else None
        if self.enforcing and support.view:
            namespaces.remove_stale_cgroups()
        self.protect = tuple(protect)
        self._scratch: str | None = None
        if self.enforcing and support.view and self._tmp_root:
            self._scratch = os.path.join(self._tmp_root, ".view")
            os.mkdir(self._scratch, 0o700)
        self.egress: EgressProxy | None = None  # the kernel installs its proxy (app.py)
        self._tmpdirs: dict[str, str] = {}
        self._specs: dict[tuple, tuple[float, SandboxSpec]] = {}

    def enforced(self, policy: PrincipalPolicy | None = None) -> dict[str, object] | bool:
        """``caps.enforced``: what the OS enforces here for ``policy``'s principal (False
        when it runs unconfined); without a policy, for a principal with no network."""
        if policy is None:
            return self._routed(self.support.enforced()) if self.enforcing else False
        if not self.applies_to(policy):
            return False
        if self.routes_network():
            return self._routed(self.support.enforced(private_net=True))
        return self.support.enforced(private_net=not policy.net_grants)

    def _routed(self, out: dict[str, object] | bool) -> dict[str, object] | bool:
        if isinstance(out, dict) and self.routes_network():
            out["net"] = "proxy+netns"
        return out

    def routes_network(self) -> bool:
        """Sandboxed trees get a network namespace of their own whose one way out is the
        egress proxy (net/): namespaces work here and the kernel runs the proxy.
        Elsewhere the Landlock TCP port rules are the fallback."""
        return self.egress is not None and self.enforcing and self.support.view

    def applies_to(self, policy: PrincipalPolicy) -> bool:
        """Whether this principal's processes run confined."""
        return self.enforcing and policy.sandboxed

    def status(self) -> dict[str, object]:
        """For ``ping``/``shoal doctor``: the mode and what it enforces."""
        return {
            "mode": self.mode,
            "enforced": self.enforced(),
            "reason": "" if self.enforcing else (self.support.reason or "off"),
        }

    def spec_for(
        self,
        policy: PrincipalPolicy,
        *,
        ttys: tuple[str, ...] = (),
        also_read: tuple[str, ...] = (),
        also_write: tuple[str, ...] = (),
        session: str = "",
        net_extra: tuple[str, ...] = (),
    ) -> SandboxSpec | None:
        """The spec for one process of ``policy``'s principal, or None when unconfined.
        ``also_read``: exact kernel-made paths it may read even inside the state dir
        (``$SHOAL_OUT``: the caller's own outputs).  ``session``, ``net_extra``: the
        egress channel's session and the hosts approvals added to the principal's.

        Fails closed: a spec that cannot be built raises -32010 and nothing runs."""
        if not self.applies_to(policy):
            return None
        key = (
            policy.principal,
            policy.grant_key(),
            ttys,
            also_read,
            also_write,
            session,
            net_extra,
        )
        now = time.monotonic()
        with TABLES:
            cached = self._specs.get(key)
        if cached is not None and cached[0] > now and os.path.isdir(cached[1].tmpdir):
            return cached[1]
        spec = self._build(policy, ttys, also_read, also_write)
        if self.routes_network() and spec.view is not None:
            spec = self._route_network(spec, policy, session, net_extra)
        else:
            spec = self._fit_network(spec)
        if not all(os.path.exists(p) for p in also_read):
            return spec  # made later (a session's $SHOAL_OUT): not kept without it
        with TABLES:
            for stale in [k for k, (until, _) in self._specs.items() if until <= now]:
                del self._specs[stale]  # bounded: PTY specs differ by terminal
            self._specs[key] = (now + SANDBOX_SPEC_TTL_S, spec)
        return spec

    def _build(
        self,
        policy: PrincipalPolicy,
        ttys: tuple[str, ...],
        also_read: tuple[str, ...],
        also_write: tuple[str, ...],
    ) -> SandboxSpec:
        try:
            return policy.sandbox_spec(
                tmpdir=self._tmpdir(policy.principal),
                forbidden=self.forbidden,
                ttys=ttys,
                also_read=also_read,
                also_write=also_write,
                view_scratch=self._scratch,
                protect=self.protect,
                max_procs=SANDBOX_MAX_PROCS,
            )
        except (SandboxError, OSError) as e:
            raise RpcError(
                ErrorCode.DENIED,
                f"cannot build the sandbox for {policy.principal}: {e}",
                {"principal": policy.principal, "sandbox": str(e)},
            ) from e

    def _fit_network(self, spec: SandboxSpec) -> SandboxSpec:
        """Where no private network namespace can be made (unprivileged user namespaces
        disabled, as on some distributions), ask for none: Landlock's TCP rules still
        deny every connect and bind (ABI 4+); below that the network stays open.  Either
        way ``caps.enforced.net`` says what holds.  Without this every exec would fail."""
        if not spec.private_net or self.support.netns or spec.view is not None:
            return spec
        data = spec.to_dict()
        data["private_net"] = False
        if not self.support.tcp:
            data["tcp_connect"] = None
        why = "TCP denied by Landlock; UDP open" if self.support.tcp else "network not confined"
        data["notes"] = [*spec.notes, f"no private network namespace on this machine: {why}"]
        return SandboxSpec.from_dict(data)

    def _route_network(
        self, spec: SandboxSpec, policy: PrincipalPolicy, session: str, extra: tuple[str, ...]
    ) -> SandboxSpec:
        """A network namespace in every case, its one way out the egress channel of this
        principal's session (revealed in the view, bridged to a loopback port).  Landlock
        (ABI 4+) still lets TCP connect only to the bridge's port: a second layer."""
        assert self.egress is not None and spec.view is not None
        path = self.egress.channel(
            policy.principal, session, (*policy.net_allow, *extra), policy.net_deny
        )
        data = spec.to_dict()
        data.update(private_net=True, tcp_connect=[BRIDGE_PORT], egress=path)
        data["view"] = {**spec.view, "reveal": sorted({*spec.view["reveal"], path})}
        data["notes"] = [n for n in spec.notes if not n.startswith("net_connect:")]
        return SandboxSpec.from_dict(data)

    def _tmpdir(self, principal: str) -> str:
        with TABLES:
            path = self._tmpdirs.get(principal)
            if path is None or not os.path.isdir(path):
                path = tempfile.mkdtemp(prefix=TMPDIR_PREFIX, dir=self._tmp_root)  # 0700
                self._tmpdirs[principal] = path
            return path

    def close(self) -> None:
        """Remove the private temp dirs (kernel exit)."""
        with TABLES:
            paths, self._tmpdirs = list(self._tmpdirs.values()), {}
            self._specs.clear()
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        if self._tmp_root:
            shutil.rmtree(self._tmp_root, ignore_errors=True)


def sandbox_tmp_root(state_dir: Path) -> str:
    """Where this kernel's private temp dirs go: ``<state>/tmp``, so a kernel that was
    killed leaves nothing its successor does not remove at start, and no /tmp cleaner
    can pull them from under a running sandbox."""
    return str(state_dir / "tmp")


def trusted_base(policy_path: Path | None) -> tuple[str, ...]:
    """What no sandboxed process may change, whatever its grants: the package (the
    kernel restarts from it), the interpreter's prefix (a venv's ``site-packages`` and
    ``.pth`` files run at the next start), the policy and the kernel's config dir."""
    import site
    import sys

    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [package, sys.prefix, os.path.join(paths_config_home(), "shoal")]
    # Everything the kernel imports from at its next start: PYTHONPATH and site dirs
    # (a planted sitecustomize.py or a patched dependency would run there), the user's
    # site-packages and their .pth files.  Not sys.path[0]: the script's directory, or
    # the directory ``python -m`` was started in (maybe the very project an agent works in).
    paths += [p for p in sys.path[1:] if p and os.path.isdir(p)]
    paths.append(site.getusersitepackages())
    if policy_path is not None:
        paths.append(str(policy_path))
    return tuple(sorted({os.path.realpath(p) for p in paths}))


def paths_config_home() -> str:
    return os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")


def _fresh_private_dir(path: str) -> str | None:
    """``path`` emptied (if it is our own real directory) and made ``0700``; None when
    it cannot be ours (someone else's, a symlink): then plain ``mkdtemp`` dirs are used."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return None
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.mkdir(path, 0o700)
    except OSError:
        return None
    return path


def kernel_forbidden(state_dir: Path, socket: Path) -> tuple[str, ...]:
    """What no sandboxed process may reach: the state dir and the socket's directory."""
    return (str(state_dir), str(socket.parent), str(socket))
