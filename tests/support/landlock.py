"""Whether this machine has Landlock: sandbox tests may skip only where it has not."""

from __future__ import annotations

import os


def landlock_evidence() -> str | None:
    """Why this machine has Landlock (ABI query, securityfs, or SHOAL_REQUIRE_LANDLOCK=1),
    or None.  Sandbox tests skip only when this is None."""
    from shoal_mcp.kernel.access import landlock

    try:
        return f"Landlock ABI {landlock.abi_version()}"
    except landlock.LandlockUnavailable:
        pass
    if os.path.exists("/sys/kernel/security/landlock"):
        return "/sys/kernel/security/landlock exists"
    try:
        with open("/sys/kernel/security/lsm") as fh:
            if "landlock" in fh.read().split(","):
                return "/sys/kernel/security/lsm lists landlock"
    except OSError:
        pass
    if os.environ.get("SHOAL_REQUIRE_LANDLOCK", "") not in ("", "0"):
        return "SHOAL_REQUIRE_LANDLOCK is set"
    return None
