"""Version skew between a client and the kernel it reached (local or over ssh)."""

from __future__ import annotations

from . import __version__

_version_reported = False


def version_mismatch(kernel_info: dict | None) -> str | None:
    """A message when the kernel runs another shoal version than this client, or its
    package was replaced on disk since it started, reported once per process (later
    calls return None)."""
    global _version_reported
    version = (kernel_info or {}).get("version")
    replaced = bool((kernel_info or {}).get("package_changed"))
    if _version_reported or version is None or (version == __version__ and not replaced):
        return None
    _version_reported = True
    if version == __version__:
        return (
            "shoal: the running kernel's package changed on disk since it started (a "
            "reinstall?); run `shoal kernel restart` to use the installed files"
        )
    return (
        f"shoal: the running kernel is version {version}, this client is {__version__}; "
        "run `shoal kernel restart` to use the installed version"
    )
