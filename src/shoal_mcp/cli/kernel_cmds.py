"""``shoal kernel start|stop|restart|status`` and the liveness probe ``doctor`` shares.

A kernel is found as every client finds it (docs/configuration.md, "Discovery"); its pid
comes from the socket's peer credentials or ``kernel.json``, so even a stopped
(SIGSTOPped) kernel that answers nothing can be named, reported and killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from .. import __version__
from ..client import KernelClient, KernelLost, KernelStalled, KernelUntrusted, start_kernel
from ..protocol import discovery
from ..protocol.errors import RpcError
from ..protocol.limits import KERNEL_STOP_TIMEOUT_S, STATUS_PROBE_TIMEOUT_S
from .common import EXIT_FAILED, Ctx, pass_ctx
from .output import emit_json, style

STOP_POLL_S = 0.05
KERNEL_CHECK_TIMEOUT_S = 60.0
"""``shoal-kernel --check`` loads the policy (bash grammar included) and exits."""


@dataclass
class KernelProbe:
    """What can be learnt about the kernel without starting one."""

    socket: Path
    running: bool = False
    pid: int | None = None
    stalled: bool = False
    version: str | None = None
    untrusted: bool = False
    detail: str = ""

    @property
    def stale_version(self) -> bool:
        return self.version is not None and self.version != __version__


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (R, S, T stopped, Z zombie…)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat_line.rpartition(")")[2].split()[0]


def pid_gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


def probe(ctx: Ctx) -> KernelProbe:
    """Connect without autostart, name the pid, and ping with a short timeout."""
    result = KernelProbe(ctx.socket_path)
    try:
        client = KernelClient(result.socket, liveness_timeout=STATUS_PROBE_TIMEOUT_S)
    except KernelUntrusted as exc:
        result.untrusted, result.detail = True, str(exc)
        return result
    except KernelStalled as exc:
        record = discovery.live_record(ctx.state_path)
        result.running, result.stalled, result.detail = True, True, str(exc)
        result.pid = record.get("pid") if record else None
        return result
    except KernelLost as exc:
        result.detail = str(exc)
        return result
    result.running, result.pid = True, client.peer_pid
    try:
        info = client.call("ping", {}, STATUS_PROBE_TIMEOUT_S)["kernel"]
        result.version = info["version"]
        served = info.get("state_dir")
        if isinstance(served, str) and Path(served).resolve() != ctx.state_path.resolve():
            result.running, result.untrusted, result.pid = False, True, None
            result.detail = (
                f"the kernel at {result.socket} (pid {client.peer_pid}) serves the state dir "
                f"{served}, not {ctx.state_path}: it is not this state dir's kernel"
            )
    except KernelStalled:
        result.stalled = True
        state = process_state(client.peer_pid)
        how = "stopped (SIGSTOP?)" if state in ("T", "t") else f"process state {state}"
        result.detail = (
            f"pid {client.peer_pid} accepts connections but does not answer within "
            f"{STATUS_PROBE_TIMEOUT_S:g} s: {how}; `shoal kernel restart` replaces it"
        )
    except KernelLost as exc:
        result.running, result.detail = False, str(exc)
    finally:
        client.close()
    return result


@click.group("kernel")
def kernel_group() -> None:
    """Start, stop, restart or inspect the kernel daemon."""


@kernel_group.command("start")
@pass_ctx
def kernel_start(ctx: Ctx) -> None:
    """Start the kernel if it is not running (even with SHOAL_NO_AUTOSTART set)."""
    client = start_kernel(ctx.socket, ctx.state_dir)
    pid = client.peer_pid
    client.close()
    click.echo(f"kernel running: pid {pid}, socket {client.path}")


@kernel_group.command("bridge")
@pass_ctx
def kernel_bridge(ctx: Ctx) -> None:
    """Relay frames between stdio and the kernel (autostarted if needed): the remote end
    of `shoal --host` / `shoal-mcp --host`, run there by ssh."""
    from .bridge import run_bridge

    sys.exit(run_bridge(ctx.socket, ctx.state_dir))


@kernel_group.command("stop")
@pass_ctx
def kernel_stop(ctx: Ctx) -> None:
    """Stop the kernel: SIGTERM (tasks and PTYs are ended, the socket removed), then
    SIGKILL by pid if it has not exited within 10 s (a stalled kernel)."""
    pid = stop(ctx)
    click.echo("kernel not running" if pid is None else f"kernel {pid} stopped")


@kernel_group.command("restart")
@pass_ctx
def kernel_restart(ctx: Ctx) -> None:
    """Stop the running kernel and start the installed version (after an upgrade), with
    the flags the old one had and kernel.toml. The new start's config and policy are
    checked first: a bad one leaves the running kernel as it is."""
    checked = preflight(ctx)
    if not checked.get("ok"):
        click.echo(
            f"shoal: not restarting, the new kernel would refuse to start: {checked.get('error')}"
            "\nthe running kernel was left as it is; fix the file, then: shoal kernel restart",
            err=True,
        )
        sys.exit(EXIT_FAILED)
    flags = running_flags(ctx)
    old = stop(ctx)
    client = start_kernel(ctx.socket, ctx.state_dir, flag_args(flags))
    pid = client.peer_pid
    info = client.call("ping", {})["kernel"]
    client.close()
    was = "" if old is None else f" (was pid {old})"
    click.echo(f"kernel restarted: pid {pid}, version {info['version']}{was}")


def kernel_check(ctx: Ctx, policy: str | None = None, flags: dict | None = None) -> dict:
    """``shoal-kernel --check``: what a start with ``flags`` here would make of its
    kernel.toml and policy (``policy``: this file instead). Run as a process of its own:
    the CLI does not import the kernel."""
    argv = [sys.executable, "-m", "shoal_mcp.kernel", "--check", "--state-dir", str(ctx.state_path)]
    argv += flag_args({**(flags or {}), **({"policy": policy} if policy else {})})
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=KERNEL_CHECK_TIMEOUT_S)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {
            "ok": False,
            "error": (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}",
        }
    return result if isinstance(result, dict) else {"ok": False, "error": str(result)}


def preflight(ctx: Ctx) -> dict:
    """The check a restart makes before stopping anything."""
    return kernel_check(ctx, flags=running_flags(ctx))


def running_flags(ctx: Ctx) -> dict:
    """The flags the running kernel was started with (none when it does not answer)."""
    found = probe(ctx)
    if not found.running or found.stalled:
        return {}
    try:
        client = KernelClient(found.socket, liveness_timeout=STATUS_PROBE_TIMEOUT_S)
    except KernelLost:
        return {}
    try:
        client.call("session.attach", {"client": {"kind": "cli"}}, STATUS_PROBE_TIMEOUT_S)
        flags = client.call("kernel.status", {}, STATUS_PROBE_TIMEOUT_S).get("flags") or {}
    except (RpcError, KernelLost):
        flags = {}
    finally:
        client.close()
    return flags if isinstance(flags, dict) else {}


def flag_args(flags: dict) -> list[str]:
    """``shoal-kernel`` arguments for settings given as flags."""
    args: list[str] = []
    if flags.get("require_token"):
        args.append("--require-token")
    for key in ("sandbox", "policy", "log_level"):
        if flags.get(key):
            args += [f"--{key.replace('_', '-')}", str(flags[key])]
    return args


@kernel_group.command("reload")
@pass_ctx
def kernel_reload(ctx: Ctx) -> None:
    """Read kernel.toml and the policy again without a restart; a bad file is refused
    and the running settings stay."""
    result = ctx.call("kernel.reload")
    click.echo(
        f"reloaded: config {result.get('config')}, policy {result.get('policy') or '(defaults)'}, "
        f"require_token {str(result.get('require_token')).lower()}"
    )
    if result.get("restart_needed"):
        click.echo(
            f"changed, applied at the next start: {', '.join(result['restart_needed'])} "
            "(shoal kernel restart)",
            err=True,
        )


def stop(ctx: Ctx) -> int | None:
    """Stop the kernel of ``ctx``; its pid, or None when none was running."""
    found = probe(ctx)
    pid = found.pid
    if pid is None:
        record = discovery.live_record(ctx.state_path)
        pid = record.get("pid") if record and not ctx.socket else None
    if pid is None or pid_gone(pid):
        return None
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGCONT)  # a stopped kernel must run to see the SIGTERM
    if not _wait_gone(pid, KERNEL_STOP_TIMEOUT_S):
        click.echo(
            f"kernel {pid} did not exit within {KERNEL_STOP_TIMEOUT_S:g} s of SIGTERM; "
            "sending SIGKILL",
            err=True,
        )
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, KERNEL_STOP_TIMEOUT_S)
        _remove_leftovers(ctx, found.socket, pid)
    return pid


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid_gone(pid):
            return True
        time.sleep(STOP_POLL_S)
    return pid_gone(pid)


def _remove_leftovers(ctx: Ctx, sock: Path, pid: int) -> None:
    """A SIGKILLed kernel leaves its socket and record; the next kernel would replace
    them, but nothing should point at a dead kernel meanwhile."""
    discovery.remove_record(ctx.state_path, pid)
    try:
        if sock.is_socket() and sock.lstat().st_uid == os.geteuid():
            sock.unlink()
    except OSError:
        pass


@kernel_group.command("status")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def kernel_status(ctx: Ctx, as_json: bool) -> None:
    """pid, version, socket, state dir, uptime, sessions, tasks, PTYs, framing backend.

    Exits 1 when no kernel runs or the kernel is stalled (answers nothing)."""
    found = probe(ctx)
    if not found.running or found.stalled:
        state = "stalled" if found.stalled else "untrusted" if found.untrusted else "not running"
        if as_json:
            emit_json(
                {
                    "running": found.running,
                    "stalled": found.stalled,
                    "untrusted": found.untrusted,
                    "pid": found.pid,
                    "socket": str(found.socket),
                    "detail": found.detail,
                }
            )
        else:
            click.echo(f"kernel {state} (socket {found.socket}): {found.detail}")
        sys.exit(EXIT_FAILED)
    status = ctx.call("kernel.status")
    status = {**status, "client_version": __version__, "stale_version": found.stale_version}
    if as_json:
        emit_json({"running": True, "stalled": False, **status})
        return
    for key in (
        "pid",
        "version",
        "client_version",
        "socket",
        "state_dir",
        "uptime_s",
        "sessions",
        "tasks_running",
        "ptys",
        "connections",
        "framing_backend",
        "config",
        "policy",
        "require_token",
    ):
        click.echo(f"{style(key.ljust(16), bold=True)}{status.get(key)}")
    if found.stale_version:
        click.echo(
            style(
                f"the kernel runs {status.get('version')}, the installed shoal is "
                f"{__version__}: `shoal kernel restart`",
                fg="yellow",
            ),
            err=True,
        )


@click.group("policy")
def policy_group() -> None:
    """The policy file (docs/security.md): check it before a restart or reload."""


@policy_group.command("check")
@click.argument("file", required=False)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def policy_check(ctx: Ctx, file: str | None, as_json: bool) -> None:
    """Check FILE (default: the policy a kernel start would use, with kernel.toml) as the
    kernel would load it; unknown keys get the nearest known one suggested. Exits 1 when
    it would be refused."""
    result = kernel_check(ctx, policy=str(Path(file).absolute()) if file else None)
    if as_json:
        emit_json(result)
    elif result.get("ok"):
        names = ", ".join(result.get("principals") or []) or "none"
        click.echo(
            f"ok: {result.get('policy') or '(no policy file: defaults)'}; principals: {names}"
        )
    else:
        click.echo(f"refused: {result.get('error')}", err=True)
    if not result.get("ok"):
        sys.exit(EXIT_FAILED)
