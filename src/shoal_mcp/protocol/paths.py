"""Where the socket and the state live; shared by kernel, facade and CLI.

See docs/configuration.md, Paths.
"""

from __future__ import annotations

import os
from pathlib import Path


def socket_path(explicit: str | None = None) -> Path:
    """--socket, else $SHOAL_SOCKET, else $XDG_RUNTIME_DIR/shoal/kernel.sock, else /tmp."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("SHOAL_SOCKET")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "shoal" / "kernel.sock"
    return Path(f"/tmp/shoal-{os.geteuid()}") / "kernel.sock"


def state_dir(explicit: str | None = None) -> Path:
    """--state-dir, else $SHOAL_STATE_DIR, else $XDG_STATE_HOME/shoal, else ~/.local/state."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("SHOAL_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "shoal"
    return Path.home() / ".local" / "state" / "shoal"


def kernel_config_path() -> Path | None:
    """The kernel's config file: $SHOAL_KERNEL_CONFIG (empty: none), else
    $XDG_CONFIG_HOME/shoal/kernel.toml, else ~/.config/shoal/kernel.toml. Read by every
    kernel start (autostart, ``shoal kernel start|restart``) and ``shoal kernel reload``."""
    env = os.environ.get("SHOAL_KERNEL_CONFIG")
    if env is not None:
        return Path(env).expanduser() if env else None
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path.home() / ".config"
    return base / "shoal" / "kernel.toml"


class NotADirectory(NotADirectoryError):
    """A state or socket directory path names something that is not a directory."""


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make the leaf 0700.

    ``NotADirectory`` names the path when it (or a parent) exists as something else: the
    bare ``FileExistsError`` said neither which path nor what to do."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileExistsError, NotADirectoryError) as exc:
        raise NotADirectory(
            f"{path} cannot be a directory: it or a parent exists and is not one "
            "(move it away, or point SHOAL_STATE_DIR / --state-dir elsewhere)",
        ) from exc
    os.chmod(path, 0o700)
    return path


FULL_DISK_BYTES = 1024 * 1024
"""Less free space than this under the state dir: a kernel that died silently there most
likely could not write (not even its own log)."""


def disk_full_reason(path: Path) -> str | None:
    """ "the disk holding PATH is full …" when the filesystem of ``path`` (or its nearest
    existing parent) has almost no space left for this user; else None."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= FULL_DISK_BYTES:
        return None
    return f"the disk holding {path} is full ({free} bytes free): free some space and retry"


def local_principal() -> str:
    """The principal of an unauthenticated local connection: the kernel's own user."""
    return f"uid:{os.geteuid()}"
