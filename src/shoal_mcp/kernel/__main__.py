"""``python -m shoal_mcp.kernel`` / ``shoal-kernel``."""

import sys

from .rpc.daemon import main as _main


def main() -> None:
    sys.exit(_main())


if __name__ == "__main__":
    main()
