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
            "shoal-mcp [--unconfined] [--host [user@]host[:port]]: MCP stdio server for shoal. "
            "--host (or SHOAL_HOST) uses the kernel on that host through your ssh "
            "(SHOAL_SSH, SHOAL_REMOTE_COMMAND). Without SHOAL_TOKEN the "
            "agent's commands run sandboxed (writes in the project, no network); "
            "--unconfined (or SHOAL_UNCONFINED=1) runs them as you instead. Configure with "
            "SHOAL_SOCKET, SHOAL_SESSION, SHOAL_TOKEN, SHOAL_NO_AUTOSTART."
        )
        sys.exit(0)
    try:
        host_from_argv(sys.argv[1:])
    except ValueError as exc:
        print(f"shoal-mcp: {exc}", file=sys.stderr)
        sys.exit(2)
    from .server import main_loop

    sys.exit(main_loop())


def host_from_argv(argv: list[str]) -> None:
    """``--host H`` / ``--host=H``: checked now (a bad one stops the server with a clear
    message before any client talks to it) and passed on as ``SHOAL_HOST``."""
    from ..client_transport import HOST_ENV, BadHost, configured_host

    spec = None
    for i, arg in enumerate(argv):
        if arg == "--host":
            if i + 1 >= len(argv):
                raise ValueError("--host needs a value: [user@]host[:port]")
            spec = argv[i + 1]
        elif arg.startswith("--host="):
            spec = arg.split("=", 1)[1]
    if spec is not None:
        os.environ[HOST_ENV] = spec
    try:
        configured_host()
    except BadHost as exc:
        raise ValueError(str(exc)) from None


if __name__ == "__main__":
    main()
