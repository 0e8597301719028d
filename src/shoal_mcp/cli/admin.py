"""Operator commands: token, doctor, mcp-config (kernel control: ``kernel_cmds``)."""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
import stat
import sys
import time
from pathlib import Path

import click
import orjson

from .. import __version__
from ..client import KernelLost, autostart_allowed, connect
from ..client_transport import REMOTE_COMMAND_ENV, SSH_ENV, BadHost, parse_host
from ..client_transport import remote_dir as checked_remote_dir
from ..protocol.errors import RpcError
from ..protocol.framing import BACKEND
from ..protocol.limits import CALL_TIMEOUT_S
from ..tokens import TokenStore, TokenStoreError
from .common import Ctx, pass_ctx
from .kernel_cmds import KernelProbe, probe
from .output import emit_json, style, table
from .remote_cmds import remote_checks, ssh_available

GRAMMAR_PROBE = "echo hi | grep h > /tmp/x"  # parsed by the kernel, never run


# -- tokens ----------------------------------------------------------------------------


@click.group("token")
def token_group() -> None:
    """Bearer tokens for agents (principals)."""


def _store(ctx: Ctx) -> TokenStore:
    return TokenStore(ctx.state_path / "tokens.json")


@token_group.command("create")
@click.argument("principal")
@click.option("--ttl", type=float, default=None, help="lifetime in seconds")
@click.option("--label", default=None)
@pass_ctx
def token_create(ctx: Ctx, principal: str, ttl: float | None, label: str | None) -> None:
    """Create a token for PRINCIPAL; the bearer is printed once, alone on stdout (what it
    is goes to stderr), so ``SHOAL_TOKEN=$(shoal token create NAME)`` captures it."""
    try:
        record, bearer = _store(ctx).create(principal, ttl, label)
    except TokenStoreError as exc:
        raise click.ClickException(str(exc)) from exc
    expires = record.get("expires", "never")
    click.echo(
        f"token {record['id']} for {record['principal']} (expires {expires}); keep the bearer secret:",
        err=True,
    )
    click.echo(bearer)


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def token_list(ctx: Ctx, as_json: bool) -> None:
    """Tokens (never their secrets)."""
    try:
        records = _store(ctx).list()
    except TokenStoreError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_json(records)
        return
    table(
        [
            [
                r["id"],
                r["principal"],
                r.get("label"),
                r.get("created"),
                r.get("expires", "never"),
                r.get("expired"),
            ]
            for r in records
        ],
        ["ID", "PRINCIPAL", "LABEL", "CREATED", "EXPIRES", "EXPIRED"],
    )


@token_group.command("revoke")
@click.argument("id_or_principal")
@pass_ctx
def token_revoke(ctx: Ctx, id_or_principal: str) -> None:
    """Revoke by token id or every token of a principal (effective without restart)."""
    try:
        n = _store(ctx).revoke(id_or_principal)
    except TokenStoreError as exc:
        raise click.ClickException(str(exc)) from exc
    if n == 0:
        raise click.ClickException(f"no token matches {id_or_principal!r}")
    click.echo(f"revoked {n} token(s)")


# -- doctor ----------------------------------------------------------------------------


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--verify", is_flag=True, help="also check every stored output's length and hash (slow)"
)
@click.option(
    "--repair",
    is_flag=True,
    help="move a damaged database aside (kernel stopped) so the next start begins a fresh one",
)
@click.option("--host", default=None, help="check [user@]host[:port] over ssh instead")
@pass_ctx
def doctor(ctx: Ctx, as_json: bool, verify: bool, repair: bool, host: str | None) -> None:
    """Check what shoal needs: the kernel (running, responsive, same version), bash, the
    bash grammar, pyte, permissions, backend; with --host, ssh and that host's shoal and
    kernel (versions compared with this machine's)."""
    if host or ctx.host:
        try:
            directory = ctx.remote_dir or checked_remote_dir()
        except BadHost as exc:
            raise click.UsageError(str(exc)) from None
        checks = remote_checks(parse_host(host or ctx.host or ""), _check, _warn, directory)
        report(checks, as_json)
        return
    if repair:
        _repair(ctx, as_json)
        return
    found = probe(ctx)
    grammar = _check("tree-sitter-bash", lambda: _grammar(ctx, found))
    if not found.running:
        found = probe(ctx)  # the grammar check may have started one
    checks = [
        _check("bash", lambda: shutil.which("bash") or _raise("bash not on PATH")),
        _check("kernel", lambda: _kernel(found)),
        _check("kernel version", lambda: _kernel_version(found)),
        _check("kernel package", lambda: _kernel_package(ctx, found)),
        grammar,
        _check("pyte", _pyte),
        _check("sandbox", lambda: _sandbox(ctx, found)),
        _check("egress proxy", lambda: _egress(ctx, found)),
        _check(
            "framing backend",
            lambda: (
                BACKEND
                if BACKEND == "cython"
                else _warn("pure-Python fallback (install with a C compiler for the compiled core)")
            ),
        ),
        _check("ssh (remote hosts)", _ssh_local),
        _check("state dir", lambda: _private(ctx.state_path, 0o700, must_exist=False)),
        _check("socket dir", lambda: _private(ctx.socket_path.parent, 0o700, must_exist=False)),
        _check("socket", lambda: _private(ctx.socket_path, 0o600, must_exist=False)),
    ]
    if verify:
        checks.append(_check("stored outputs", lambda: _verify(ctx)))
    report(checks, as_json)


def report(checks: list[tuple[str, str, str]], as_json: bool) -> None:
    """Print the doctor's checks and exit 1 when one failed."""
    if as_json:
        emit_json([{"check": n, "status": s, "detail": d} for n, s, d in checks])
    else:
        colours = {"ok": "green", "warn": "yellow", "fail": "red"}
        for name, status, detail in checks:
            click.echo(
                f"{style(status.upper().ljust(5), fg=colours[status], bold=True)} {name}: {detail}"
            )
    sys.exit(1 if any(s == "fail" for _, s, _ in checks) else 0)


class _Warn(Exception):
    pass


def _ssh_local() -> str:
    """``--host`` needs ssh here (sshd there); only a warning: local use needs neither."""
    try:
        return ssh_available(_warn)
    except RuntimeError as exc:
        raise _Warn(f"{exc} (needed only for --host)") from None


DB_FILES = ("journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm")


def _verify(ctx: Ctx) -> str:
    report = ctx.call("store.verify")
    dangling = report.get("dangling", 0)  # an older kernel does not check references
    if report["corrupted"] or dangling or report["database"] != "ok":
        listed = ", ".join(
            f"{b.get('ref', b['hash'][:16] + '…')} ({b['reason']})" for b in report["bad"][:5]
        )
        raise RuntimeError(
            f"{report['corrupted']} of {report['checked']} stored outputs corrupted, "
            f"{dangling} stored values reference missing outputs"
            f"{': ' + listed if listed else ''}; database: {report['database']}"
        )
    return (
        f"{report['checked']} stored outputs match their length and hash, every stored value's "
        "outputs are there; database ok"
    )


def _repair(ctx: Ctx, as_json: bool) -> None:
    """Move the database aside (never while a kernel serves the socket)."""
    found = probe(ctx)
    if found.running:
        raise click.ClickException(
            f"a kernel is running on {found.socket} (pid {found.pid}); stop it first "
            "(shoal kernel stop)"
        )
    state = ctx.state_path
    suffix = time.strftime(".bad-%Y%m%dT%H%M%S")
    moved = []
    for name in DB_FILES:
        path = state / name
        if path.exists():
            os.replace(path, state / (name + suffix))
            moved.append(str(state / (name + suffix)))
    if as_json:
        emit_json({"moved": moved})
    elif moved:
        click.echo("moved aside: " + ", ".join(moved))
        click.echo("the next kernel start begins a fresh database; stored outputs stay in cas/")
    else:
        click.echo(f"no database in {state}; nothing to repair")


def _raise(message: str):
    raise RuntimeError(message)


def _warn(message: str):
    raise _Warn(message)


def _check(name: str, fn) -> tuple[str, str, str]:
    try:
        return name, "ok", str(fn())
    except _Warn as exc:
        return name, "warn", str(exc)
    except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
        return name, "fail", str(exc)


def _kernel(found: KernelProbe) -> str:
    if found.untrusted:
        raise RuntimeError(found.detail)
    if found.stalled:
        raise RuntimeError(f"stalled: {found.detail}")
    if not found.running:
        _warn(f"not running ({found.detail})")
    return f"pid {found.pid}, socket {found.socket}"


def _kernel_version(found: KernelProbe) -> str:
    if found.stale_version:
        raise RuntimeError(
            f"the kernel runs {found.version}, the installed shoal is {__version__}; "
            "run `shoal kernel restart`"
        )
    if found.version is None:
        _warn("no kernel answered; nothing to compare")
    return f"{__version__} (kernel and client agree)"


def _kernel_package(ctx: Ctx, found: KernelProbe) -> str:
    """The running kernel's own files replaced under it (``pip install`` over it)?"""
    if not found.running or found.stalled or found.untrusted:
        _warn("no kernel answered; nothing to compare")
    package = ctx.call("kernel.status").get("package")
    if not isinstance(package, dict):
        _warn("the kernel does not report its package (an older kernel): `shoal kernel restart`")
    if package.get("changed"):
        raise RuntimeError(
            f"the kernel's package changed on disk since it started ({package.get('detail')}; "
            f"{package.get('dir')}): run `shoal kernel restart`"
        )
    return f"{package.get('dir')}: {package.get('detail')}"


def _grammar(ctx: Ctx, found: KernelProbe) -> str:
    # The grammar is the kernel's dependency, so ask the kernel (``parse`` needs no
    # attach); this also checks that a kernel can be reached or started.
    if found.stalled or found.untrusted:
        _warn("not checked: " + ("the kernel is stalled" if found.stalled else found.detail))
    try:
        client = connect(ctx.socket, ctx.state_dir)
    except KernelLost as exc:
        if not autostart_allowed():
            _warn(f"not checked, no kernel running and SHOAL_NO_AUTOSTART is set ({exc})")
        raise
    try:
        summary = client.call("parse", {"src": GRAMMAR_PROBE}, CALL_TIMEOUT_S)
    finally:
        client.close()
    if not summary.get("ok") or summary.get("commands") != ["echo", "grep"]:
        raise RuntimeError(f"the kernel's bash grammar misread a simple pipeline: {summary}")
    return "the kernel parses bash"


def _sandbox(ctx: Ctx, found: KernelProbe) -> str:
    """The kernel's OS sandbox (``ping``): its mode and what it enforces (docs/security.md)."""
    if found.stalled or found.untrusted:
        _warn("not checked: " + ("the kernel is stalled" if found.stalled else found.detail))
    try:
        client = connect(ctx.socket, ctx.state_dir)
    except KernelLost as exc:
        _warn(f"not checked, no kernel reachable ({exc})")
    try:
        info = client.call("ping", None, CALL_TIMEOUT_S).get("kernel", {})
    finally:
        client.close()
    box = info.get("sandbox") or {}
    agent = info.get("agent") or {}
    if not box.get("enforced"):
        _warn(f"{box.get('mode', '?')}: not enforcing ({box.get('reason') or 'not reported'})")
    who = agent.get("principal", "?")
    if not agent.get("confined"):
        why = agent.get("opt_out") or agent.get("why") or "not reported"
        _warn(f"{box['mode']}: {box['enforced']}; MCP agents ({who}) run UNCONFINED: {why}")
    return f"{box['mode']}: {box['enforced']}; MCP agents run as {who}, confined"


def _egress(ctx: Ctx, found: KernelProbe) -> str:
    """The egress path end to end (``egress.check``): from a network namespace of its
    own, an allowed stand-in answers through the proxy, another host is refused, a
    direct connect finds no route (docs/security.md, "Network")."""
    if not found.running or found.stalled or found.untrusted:
        _warn("not checked: no responsive kernel")
    try:
        got = ctx.client().call("egress.check", {})
    except (KernelLost, RpcError) as exc:
        _warn(f"not checked ({exc})")
    if not got.get("proxy"):
        _warn(f"no egress proxy ({got.get('detail')}); sandboxed trees: Landlock TCP ports")
    if not got.get("ok"):
        raise RuntimeError(f"the egress path does not hold: {got.get('detail')}")
    return "proxy+netns: allowed host reached, other host refused, direct connect no route"


def _pyte() -> str:
    import pyte

    screen = pyte.Screen(10, 2)
    pyte.Stream(screen).feed("ok")
    if not screen.display[0].startswith("ok"):
        raise RuntimeError("pyte did not render")
    return f"pyte {importlib.metadata.version('pyte')}"


def _private(path, mode: int, must_exist: bool) -> str:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if must_exist:
            raise RuntimeError(f"{path} missing") from None
        return f"{path} (not created yet)"
    if stat.S_ISLNK(st.st_mode):
        raise RuntimeError(f"{path} is a symlink; shoal refuses to follow it")
    if st.st_uid != os.geteuid():
        raise RuntimeError(f"{path} belongs to uid {st.st_uid}")
    actual = stat.S_IMODE(st.st_mode)
    if actual & ~mode:
        raise RuntimeError(f"{path} has mode {actual:o}, expected {mode:o}")
    return f"{path} mode {actual:o}"


# -- MCP client configuration -----------------------------------------------------------


@click.command("mcp-config")
@click.option("--name", default="shoal", show_default=True, help="server name in the client")
@click.option("--host", default=None, help="an entry for the kernel on [user@]host[:port]")
@click.option(
    "--remote-dir", default=None, help="with --host: the entry works in this directory there"
)
@pass_ctx
def mcp_config(ctx: Ctx, name: str, host: str | None, remote_dir: str | None) -> None:
    """Print ready-to-paste MCP config (Claude Code, Claude Desktop, generic clients) with
    absolute paths, so a client with a minimal PATH still finds this installation."""
    command, args = facade_command()
    env: dict[str, str] = {}
    host = host or ctx.host
    if host:
        args = [*args, "--host", parse_host(host).label]
        try:
            directory = checked_remote_dir(remote_dir) or ctx.remote_dir
        except BadHost as exc:
            raise click.UsageError(str(exc)) from None
        if directory:
            args += ["--remote-dir", directory]
        env.update(remote_env())
    elif remote_dir:
        raise click.UsageError("--remote-dir needs --host: it names a directory there")
    if ctx.session:
        env["SHOAL_SESSION"] = ctx.session  # else: each project its own session
    if ctx.socket and not host:  # a remote entry's kernel is found on its host
        env["SHOAL_SOCKET"] = str(Path(ctx.socket).absolute())
    if ctx.state_dir and not host:
        env["SHOAL_STATE_DIR"] = str(ctx.state_path.absolute())
    env_flags = "".join(f" -e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    argv = " ".join(shlex.quote(a) for a in [command, *args])
    click.echo(style("# Claude Code", bold=True))
    click.echo(f"claude mcp add {shlex.quote(name)}{env_flags} -- {argv}")
    server: dict = {"command": command}
    if args:
        server["args"] = args
    if env:
        server["env"] = env
    click.echo(
        style(
            "\n# Claude Desktop (claude_desktop_config.json) and generic mcpServers clients",
            bold=True,
        )
    )
    click.echo(orjson.dumps({"mcpServers": {name: server}}, option=orjson.OPT_INDENT_2).decode())


def remote_env() -> dict[str, str]:
    """The ssh settings of this shell that a remote entry needs too (else ssh's own)."""
    return {k: v for k in (SSH_ENV, REMOTE_COMMAND_ENV) if (v := os.environ.get(k, ""))}


def facade_command() -> tuple[str, list[str]]:
    """The absolute ``shoal-mcp`` of this installation (beside its interpreter), else this
    interpreter with ``-m shoal_mcp.facade``."""
    beside = Path(sys.executable).absolute().parent / "shoal-mcp"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside), []
    return str(Path(sys.executable).absolute()), ["-m", "shoal_mcp.facade"]
