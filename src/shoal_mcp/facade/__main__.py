"""``shoal-mcp`` / ``python -m shoal_mcp.facade``."""

from __future__ import annotations

import sys

from .. import __version__
from ..protocol.framing import BACKEND


def main() -> None:
    if "--version" in sys.argv[1:]:
        print(f"shoal-mcp {__version__} (framing: {BACKEND})")
        sys.exit(0)
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(
            "shoal-mcp [--unconfined]: MCP stdio server for shoal. Without SHOAL_TOKEN the "
            "agent's commands run sandboxed (writes in the project, no network); "
            "--unconfined (or SHOAL_UNCONFINED=1) runs them as you instead. Configure with "
            "SHOAL_SOCKET, SHOAL_SESSION, SHOAL_TOKEN, SHOAL_NO_AUTOSTART."
        )
        sys.exit(0)
    from .server import main_loop

    sys.exit(main_loop())


if __name__ == "__main__":
    main()
