"""Building a :class:`~.sandbox.SandboxSpec` from a principal's grants (runs in the kernel).

* Globs map to directories (:func:`grant_root`): ``dir/**`` and literal paths map to
  themselves; a glob with wildcards grants its longest literal prefix directory (Landlock
  rules are whole trees), unless that is ``/``, ``$HOME`` or an ancestor of ``$HOME``:
  then the grant is refused for enforcement and noted (the analysis still uses it).
* Paths are resolved (:func:`canonical`); a grant that resolves through a symlink inside
  a tree the principal can write is refused, since the principal could have planted it.
* A tree that contains one of the kernel's own directories is replaced by its siblings
  along the path (:func:`subtract`): Landlock only allows, it cannot carve holes.
* Programs need system trees (:data:`SYSTEM_READ`), a few devices, and git its config.

Every narrowing or refusal is explained in the spec's ``notes``.
"""

from __future__ import annotations

import errno
import os
import posixpath

from .sandbox import SandboxError, SandboxSpec

SYSTEM_READ = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",  # other processes' environ/mem/fd stay closed: Landlock scopes ptrace
    "/sys",
    "/dev/random",
    "/dev/urandom",
)
# Not /dev/pts: reading another terminal of the same user would steal its input.  A
# PTY's own slave device is passed as ``ttys``; /dev/tty reaches the controlling one.
# Read in $HOME by default: git dies ("unknown error occurred while reading the
# configuration files") when ~/.gitconfig exists but cannot be read.
HOME_READ = (".gitconfig", ".config/git")
HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker/config.json",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".pypirc",
    ".npmrc",
    ".yarnrc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".password-store",
    ".local/share/keyrings",
    ".config/op",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".local/share/fish/fish_history",
)
"""Below ``$HOME``: what a sandboxed tree never sees, whatever it may read otherwise:
keys, credentials and tokens, keyrings, browser profiles, shell histories.  In the
namespaced view each one that exists is replaced by an empty read-only directory or
file (docs/security.md has the list and why)."""
GIT_PROTECTED = ("hooks", "config")
"""In each repository's ``.git``: code the human's git runs later (read-only in the view;
the ``.git`` itself is pinned, so it cannot be moved aside and replaced)."""
GIT_SCAN_DEPTH = 3
GIT_SCAN_DIRS = 1000
_SCAN_SKIP = frozenset(
    {"node_modules", ".venv", "venv", "__pycache__", "target", "build", "dist", ".tox", ".git"}
)
SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx")
# Cut out of the system trees when the kernel runs as root: root keeps uid 0 in the
# sandbox (without capabilities), and these root-owned files are readable by their owner.
SYSTEM_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_*_key",
)

_WILDCARDS = frozenset("*?[{")


def _expand_home(glob: str, home: str) -> str:
    if glob == "~" or glob.startswith("~/"):
        return home + glob[1:]
    return os.path.expanduser(glob)


def _under(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it (both normalised, absolute)."""
    return path == root or root == "/" or path.startswith(root + "/")


def grant_root(glob: str, home: str) -> tuple[str | None, str | None]:
    """The directory (or file) a policy glob maps to, or ``(None, why)`` if refused.

    ``dir/**`` and a literal path map to themselves.  Otherwise the longest literal
    prefix directory is granted (a widening: Landlock rules are whole trees), unless it
    would be ``/``, ``$HOME`` or an ancestor of ``$HOME``; then the grant is refused for
    enforcement (the policy analysis still uses the glob).
    """
    path = _expand_home(glob, home)
    if not path.startswith("/"):
        return None, f"{glob}: not an absolute path"
    parts = [p for p in path.split("/") if p]
    if "." in parts or ".." in parts:
        return None, f"{glob}: not a normalised path; not enforced by the sandbox"
    literal: list[str] = []
    for part in parts:
        if _WILDCARDS.intersection(part):
            break
        literal.append(part)
    root = posixpath.normpath("/" + "/".join(literal))
    rest = parts[len(literal) :]
    exact = not rest or rest == ["**"]
    if not exact or os.path.isdir(root):
        homes = {posixpath.normpath(home), os.path.realpath(home)}
        broad = root == "/" or any(_under(h, root) for h in homes)
        if broad and not (exact and rest == ["**"]):
            return None, f"{glob}: would widen to the whole of {root}; not enforced by the sandbox"
    return root, None


def canonical(root: str, writable: list[str]) -> tuple[str | None, str | None]:
    """``root`` with symlinks resolved, or ``(None, why)``.

    Refused when the path does not exist (a rule needs an object) or when it resolves
    through a symlink below one of the ``writable`` roots: the principal could have
    planted that link to point the grant somewhere else.
    """
    if not os.path.lexists(root):
        return None, f"{root}: does not exist"
    real = os.path.realpath(root)
    for w in writable:
        if root != w and _under(root, w):
            rel = posixpath.relpath(root, w)
            expected = posixpath.normpath(posixpath.join(os.path.realpath(w), rel))
            if real != expected:
                return None, f"{root}: resolves through a symlink inside writable {w}"
    return real, None


def subtract(root: str, forbidden: list[str]) -> tuple[list[str], list[str]]:
    """Grant ``root`` minus the ``forbidden`` paths: (paths to grant, dirs split open).

    A tree containing a forbidden path is replaced by every entry of each directory on
    the way down except the branch that leads to it.  Symlinks among those entries are
    skipped (their targets are granted only if they are granted anyway).  Entries
    created later in a split directory are not covered.
    """
    if any(_under(root, f) for f in forbidden):
        return [], []
    below = [f for f in forbidden if _under(f, root)]
    if not below or not os.path.isdir(root):
        return [root], []
    grants: list[str] = []
    split = [root]
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return [], split
    for entry in entries:
        child = posixpath.join(root, entry.name)
        if entry.is_symlink() or child in below:
            continue
        if any(_under(f, child) for f in below):
            g, s = subtract(child, below)
            grants += g
            split += s
        else:
            grants.append(child)
    return grants, split


def build_spec(
    *,
    fs_read: tuple[str, ...] | list[str] = (),
    fs_write: tuple[str, ...] | list[str] = (),
    fs_delete: tuple[str, ...] | list[str] = (),
    net_connect: tuple[str, ...] | list[str] = (),
    home: str,
    tmpdir: str,
    forbidden: tuple[str, ...] | list[str] = (),
    also_write: tuple[str, ...] | list[str] = (),
    also_read: tuple[str, ...] | list[str] = (),
    ttys: tuple[str, ...] | list[str] = (),
    system_read: tuple[str, ...] = SYSTEM_READ,
    home_read: tuple[str, ...] = HOME_READ,
    system_devices: tuple[str, ...] = SYSTEM_DEVICES,
    system_secrets: tuple[str, ...] | None = None,
    view_scratch: str | None = None,
    protect: tuple[str, ...] | list[str] = (),
    home_secrets: tuple[str, ...] = HOME_SECRETS,
    max_procs: int = 0,
) -> SandboxSpec:
    """A spec from a principal's grants (policy globs) and the kernel's facts.

    ``forbidden``: the kernel's state and socket directories, never granted.
    ``tmpdir``: the private temp dir (must exist; read, write and delete there).
    ``also_write``: exact paths the kernel wants writable even inside its own dirs (an
    exec's own spool files, so ``> /dev/stdout`` works); never a tree holding a
    forbidden path.  ``also_read``: the same for reading (``$SHOAL_OUT``, the caller's
    own stored outputs); paths that do not exist are left out.  ``ttys``: the PTY's own slave device, if any.
    ``net_connect``: ``host:port`` grants; hosts are advisory, ports are enforced.
    ``system_secrets``: paths (``*`` allowed in the last part) cut out of the system
    trees; default :data:`SYSTEM_SECRETS` when running as root, else none.
    ``view_scratch``: where the namespaced view is assembled (an empty directory of the
    kernel's); None: no namespaces (Landlock alone).  ``protect``: the trusted base
    (package, interpreter, policy), read-only in the view whatever the grants say.
    """
    notes: list[str] = []
    banned = sorted({os.path.realpath(f) for f in forbidden})
    tmp = os.path.realpath(tmpdir)
    roots: dict[str, list[str]] = {"read": [], "write": [], "delete": []}
    for cls, globs in (("read", fs_read), ("write", fs_write), ("delete", fs_delete)):
        for g in globs:
            root, why = grant_root(g, home)
            if root is None:
                notes.append(f"fs.{cls} {why}")
            else:
                roots[cls].append(root)
    writable = [*roots["write"], tmp]
    out: dict[str, list[str]] = {"read": [], "write": [], "delete": [], "devices": []}

    if system_secrets is None:
        system_secrets = SYSTEM_SECRETS if os.geteuid() == 0 else ()
    secrets = sorted({os.path.realpath(p) for p in _existing(system_secrets)})

    def add(cls: str, path: str, label: str, cut: list[str] = banned) -> None:
        real, why = canonical(path, writable)
        if real is None:
            if label:  # system paths that do not exist here are not worth a note
                notes.append(f"{label} {why}")
            return
        grants, split = subtract(real, cut)
        if split and any(_under(b, real) for b in banned):
            notes.append(
                f"{label or cls} {real}: holds a kernel directory, so only the other entries of "
                f"{', '.join(split)} are granted (entries created there later are not)"
            )
        elif not grants:
            notes.append(f"{label or cls} {real}: inside a kernel directory; not granted")
        out[cls] += grants

    # With a view, reads need no split around the kernel's directories and the secrets:
    # the view hides them (an empty read-only mount no rule can see past), and a split
    # of "/" or $HOME would make the spec change with every file created there (a new
    # zygote, a cold start, each time).  Without one, Landlock is all there is: split.
    read_cut: list[str] = [] if view_scratch is not None else banned
    for cls in ("read", "write", "delete"):
        for root in roots[cls]:
            add(cls, root, f"fs.{cls}", read_cut if cls == "read" else banned)
    home_paths = [posixpath.join(home, rel) for rel in home_read]
    for path in (*system_read, *_etc_link_targets(), *home_paths):
        add("read", path, "", [] if view_scratch is not None else sorted({*banned, *secrets}))
    for path in (*system_devices, *ttys):
        add("devices", path, "")
    for path in (tmp, *also_write):
        real = os.path.realpath(path)
        if any(_under(f, real) for f in banned):
            raise SandboxError(errno.EINVAL, f"{path}: contains a kernel directory")
        if not os.path.exists(real):
            raise SandboxError(errno.ENOENT, f"{path}: does not exist")
        out["write"].append(real)
        if real == tmp:
            out["read"].append(real)
            out["delete"].append(real)

    for path in also_read:
        real = os.path.realpath(path)
        if any(_under(f, real) for f in banned):
            raise SandboxError(errno.EINVAL, f"{path}: contains a kernel directory")
        if os.path.exists(real):
            out["read"].append(real)

    tcp: tuple[int, ...] | None = ()
    if net_connect:
        ports = [entry.rpartition(":")[2] for entry in net_connect]
        tcp = None if "*" in ports else tuple(sorted({int(p) for p in ports}))
        notes.append("net_connect: hosts are advisory; the sandbox enforces TCP ports only")
    view = None
    if view_scratch is not None:
        # The view's private /dev/shm is the tree's own (a tmpfs per sandbox).
        for cls in ("read", "write", "delete"):
            out[cls].append("/dev/shm")
        hidden = [
            *banned,
            *secrets,
            *_existing(tuple(posixpath.join(home, h) for h in home_secrets)),
        ]
        git_dirs = _git_dirs(roots["write"])
        view = build_view(
            scratch=view_scratch,
            write=[p for p in _dedupe(out["write"] + out["delete"]) if p != "/dev/shm"],
            hide=hidden,
            protect=[*protect, *_git_protected(git_dirs)],
            reveal=[tmp, *(os.path.realpath(p) for p in also_read)],
            pin=git_dirs,
        )
    return SandboxSpec(
        read=_dedupe(out["read"]),
        write=_dedupe(out["write"]),
        delete=_dedupe(out["delete"]),
        devices=_dedupe(out["devices"]),
        tmpdir=tmp,
        tcp_connect=tcp,
        private_net=not net_connect,
        view=view,
        max_procs=max_procs,
        notes=tuple(notes),
    )


def build_view(
    *,
    scratch: str,
    write: list[str],
    hide: list[str],
    protect: list[str],
    reveal: list[str],
    pin: list[str] = (),  # type: ignore[assignment]
) -> dict:
    """The mount plan (``namespaces.View`` as a dict).  Only paths that exist; a protected
    or pinned path matters only inside a writable tree (elsewhere the view is read-only
    anyway)."""
    writable = sorted(set(write))

    def inside(paths: list[str]) -> list[str]:
        return sorted(
            {p for p in paths if os.path.exists(p) and any(_under(p, w) for w in writable)}
        )

    return {
        "scratch": scratch,
        "write": writable,
        "hide": sorted({p for p in hide if os.path.lexists(p)}),
        "pin": inside(list(pin)),
        "protect": inside(protect),
        "reveal": sorted({p for p in reveal if os.path.exists(p)}),
    }


def _git_dirs(write_roots: list[str]) -> list[str]:
    """The ``.git`` of every git work tree in the writable trees, found by a bounded walk
    (``GIT_SCAN_DEPTH`` levels, ``GIT_SCAN_DIRS`` directories per root; heavy build and
    dependency directories skipped): nested repositories too."""
    found: list[str] = []
    for root in write_roots:
        real = os.path.realpath(root)
        if not os.path.isdir(real):
            continue
        seen = 0
        level = [real]
        for _ in range(GIT_SCAN_DEPTH + 1):
            following: list[str] = []
            for d in level:
                seen += 1
                if seen > GIT_SCAN_DIRS:
                    break
                try:
                    entries = list(os.scandir(d))
                except OSError:
                    continue
                for e in entries:
                    if e.name == ".git":
                        found.append(e.path)
                    elif e.name not in _SCAN_SKIP and e.is_dir(follow_symlinks=False):
                        following.append(e.path)
            level = following
    return sorted(set(found))


def _git_protected(git_dirs: list[str]) -> list[str]:
    """``.git/hooks`` and ``.git/config`` of each repository: code the human's git runs."""
    return [posixpath.join(g, rel) for g in git_dirs if os.path.isdir(g) for rel in GIT_PROTECTED]


def _existing(patterns: tuple[str, ...]) -> list[str]:
    """The paths that exist, with ``*`` expanded in the last component."""
    found: list[str] = []
    for pattern in patterns:
        parent, name = posixpath.split(pattern)
        if "*" not in name:
            if os.path.lexists(pattern):
                found.append(pattern)
            continue
        head, _, tail = name.partition("*")
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        found += [
            posixpath.join(parent, n)
            for n in names
            if n.startswith(head) and n.endswith(tail) and len(n) >= len(head) + len(tail)
        ]
    return found


def _etc_link_targets() -> list[str]:
    """Targets of symlinks directly in /etc (``resolv.conf`` often points into /run)."""
    try:
        entries = list(os.scandir("/etc"))
    except OSError:
        return []
    return [os.path.realpath(e.path) for e in entries if e.is_symlink()]


def _dedupe(paths: list[str]) -> tuple[str, ...]:
    """Sorted, without paths already inside another listed tree."""
    kept: list[str] = []
    for p in sorted(set(paths)):
        if not any(_under(p, k) for k in kept):
            kept.append(p)
    return tuple(kept)
