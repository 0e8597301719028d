"""``shoal``: the human CLI over the same kernel the agents use.

Every subcommand takes ``--socket``/``--state-dir`` (or SHOAL_SOCKET/SHOAL_STATE_DIR)
so CLI and kernel agree; listings take ``--json`` for scripts.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from .. import __version__
from ..client import KernelLost
from ..client_transport import BadHost
from ..client_transport import remote_dir as checked_remote_dir
from ..protocol.framing import BACKEND
from ..protocol.paths import NotADirectory
from .admin import doctor, mcp_config, token_group
from .common import Ctx, pass_ctx, unreachable
from .exec_cmd import exec_cmd
from .gc_cmd import gc_cmd
from .grep_cmd import grep_cmd
from .journal_cmd import events_group, journal_cmd
from .kernel_cmds import kernel_group, policy_group
from .pty_cmd import pty_group
from .streams import HINT_HOST
from .work import (
    approve_cmd,
    deny_cmd,
    get_cmd,
    grants_cmd,
    plans_cmd,
    tasks_group,
)

LOCAL_ONLY = frozenset({"kernel", "token", "policy", "gc"})
"""Commands that read this machine's state dir or signal its kernel by pid: never remote
(``doctor`` and ``mcp-config`` have a --host form of their own)."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", envvar="SHOAL_SOCKET", help="kernel socket path (SHOAL_SOCKET)")
@click.option(
    "--state-dir", envvar="SHOAL_STATE_DIR", help="kernel state directory (SHOAL_STATE_DIR)"
)
@click.option(
    "--session",
    envvar="SHOAL_SESSION",
    default=None,
    help="session name (SHOAL_SESSION); default: the session of the current directory",
)
@click.option(
    "--host",
    envvar="SHOAL_HOST",
    default=None,
    help="use the kernel on [user@]host[:port] through your ssh (SHOAL_HOST)",
)
@click.option(
    "--remote-dir",
    envvar="SHOAL_REMOTE_DIR",
    default=None,
    help="with --host: work in this absolute directory there (SHOAL_REMOTE_DIR)",
)
@click.version_option(__version__, message=f"shoal %(version)s (framing: {BACKEND})")
@click.pass_context
def main(
    ctx: click.Context,
    socket: str | None,
    state_dir: str | None,
    session: str | None,
    host: str | None,
    remote_dir: str | None,
) -> None:
    """shoal: a shell for AI agents that cannot flood their context."""
    if host and ctx.invoked_subcommand in LOCAL_ONLY:
        raise click.UsageError(
            f"`shoal {ctx.invoked_subcommand}` acts on this machine's files and kernel and "
            f"does not take --host/SHOAL_HOST; run it there: ssh HOST shoal "
            f"{ctx.invoked_subcommand} …"
        )
    if host and ctx.get_parameter_source("host") is ParameterSource.COMMANDLINE:
        HINT_HOST["host"] = host
    given = ctx.get_parameter_source("remote_dir") is ParameterSource.COMMANDLINE
    if remote_dir and given and not host:
        raise click.UsageError(
            "--remote-dir needs --host (or SHOAL_HOST): it names a directory there"
        )
    try:
        directory = checked_remote_dir(remote_dir) if host else None
    except BadHost as exc:
        raise click.UsageError(str(exc)) from None
    ctx.obj = Ctx(socket, state_dir, session, host or None, directory)


for command in (
    exec_cmd,
    get_cmd,
    grep_cmd,
    tasks_group,
    journal_cmd,
    events_group,
    pty_group,
    plans_cmd,
    approve_cmd,
    deny_cmd,
    grants_cmd,
    token_group,
    kernel_group,
    policy_group,
    doctor,
    mcp_config,
    gc_cmd,
):
    main.add_command(command)


def run() -> None:
    try:
        main()
    except KernelLost as exc:
        unreachable(exc)
    except NotADirectory as exc:  # the state dir (or the socket's) is a file
        unreachable(exc)


__all__ = ["main", "pass_ctx", "run"]
