"""``shoal-mcp`` / ``python -m shoal_mcp.facade``."""

from __future__ import annotations

import os
import sys

from .. import __version__
from ..protocol.framing import BACKEND


def main() -> None:
    if "--version" in sys.argv[1:]:
        print(f"shoal-mcp {__version__} (framing: {BACKEND})")
        sys.exit(0)
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(
            "shoal-mcp [--unconfined] [--host [user@]host[:port] [--remote-dir DIR]]: MCP "
            "stdio server for shoal. --host (or SHOAL_HOST) uses the kernel on that host "
            "through your ssh (SHOAL_SSH, SHOAL_REMOTE_COMMAND), working in DIR there "
            "(SHOAL_REMOTE_DIR, an absolute path on the host). Without SHOAL_TOKEN the "
            "agent's commands run sandboxed (writes in the project, no network); "
            "--unconfined (or SHOAL_UNCONFINED=1) runs them as you instead. Configure with "
            "SHOAL_SOCKET, SHOAL_SESSION, SHOAL_TOKEN, SHOAL_NO_AUTOSTART."
        )
        sys.exit(0)
    try:
        remote_options_from_argv(sys.argv[1:])
    except ValueError as exc:
        print(f"shoal-mcp: {exc}", file=sys.stderr)
        sys.exit(2)
    relay_priority()
    from .server import main_loop

    sys.exit(main_loop())


def relay_priority() -> None:
    """The facade relays an agent's calls to a kernel that many agents share: as
    ``SCHED_BATCH`` (before any thread starts, so all of them are), a reply waking it
    does not preempt that kernel's owner loop, which every agent waits on. Its share
    of the CPU is the same (docs/decisions.md, "Foreground execs on the owner loop")."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass  # not Linux, or refused: scheduled as before


def remote_options_from_argv(argv: list[str]) -> None:
    """``--host H`` and ``--remote-dir DIR`` (or ``--opt=value``): checked now (a bad one
    stops the server with a clear message before any client talks to it) and passed on
    as ``SHOAL_HOST`` / ``SHOAL_REMOTE_DIR``."""
    from ..client_transport import (
        HOST_ENV,
        REMOTE_DIR_ENV,
        BadHost,
        configured_host,
        remote_dir,
    )

    given: dict[str, str | None] = {}
    for option, env, what in (
        ("--host", HOST_ENV, "[user@]host[:port]"),
        ("--remote-dir", REMOTE_DIR_ENV, "an absolute directory on the host"),
    ):
        value = given[option] = _option_value(argv, option, what)
        if value is not None:
            os.environ[env] = value
    try:
        host = configured_host()
        remote_dir()
    except BadHost as exc:
        raise ValueError(str(exc)) from None
    # SHOAL_REMOTE_DIR alone is ignored locally (a shell may export it for `--host` runs);
    # the flag alone is a mistake worth stopping for.
    if given["--remote-dir"] is not None and host is None:
        raise ValueError("--remote-dir needs --host (or SHOAL_HOST): it names a directory there")


def _option_value(argv: list[str], option: str, what: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == option:
            if i + 1 >= len(argv):
                raise ValueError(f"{option} needs a value: {what}")
            value = argv[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value


if __name__ == "__main__":
    main()
