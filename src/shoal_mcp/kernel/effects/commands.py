"""What well-known programs do, for the effect analysis (docs/decisions.md, Effects and policy).

``run(a, argv)`` is the effect of executing one static argv: a call of a function the
script defined, or a ``proc_spawn`` plus whatever the program's handler reports, and a
``conditional`` bump unless the program is known to be read-only (``READ_ONLY``, or its
handler says so).  The handlers here cover file and text tools (``cat``, ``grep``,
``cp``, ``rm``, ``sed``, ``tar`` ...), shell state (``cd``, ``read``, ``set`` ...) and
the wrappers and interpreters that run another command or a script (``sudo``, ``env``,
``xargs``, ``eval``, ``bash`` ...); ``netcommands`` holds the network clients, package
managers and ``git``.  A handler records through ``bashstate.Recorder`` only; it never
sees the syntax tree.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from . import netcommands
from .args import IDENT, Args, has, options, values, wordset
from .state import Handler, Recorder, registrar

SHELL_BUILTINS = wordset(
    "cd pushd popd dirs pwd echo printf test [ true false : set shift read exit return "
    "break continue wait getopts let local export declare typeset readonly unset alias "
    "unalias shopt umask type hash help times jobs"
)
"""Builtins that spawn nothing and whose effects are all reported as other kinds."""

READ_ONLY = wordset(
    "echo printf pwd true false test [ : which type whereis id whoami uname date sleep seq "
    "yes expr uptime ps df free nproc locale tty groups logname arch cal basename dirname "
    "shift exit return break continue wait getopts let shopt alias unalias hash help "
    "times jobs dirs umask"
)
"""Programs whose only effects are the reads their handler reports (or none at all)."""

COMMANDS: dict[str, Handler] = dict(netcommands.COMMANDS)
"""Handlers by argv0 basename: this module's and ``netcommands``'."""
command = registrar(COMMANDS)


def run(a: Recorder, argv: Args) -> None:
    """Effects of executing ``argv`` (argv[0] is static)."""
    argv0 = argv[0]
    assert argv0 is not None
    if argv0 in a.functions:
        if argv0 in a.cd_functions:
            a.cwd = None
        return
    name = posixpath.basename(argv0)
    a.add("proc_spawn", argv0)
    handler = COMMANDS.get(name)
    read_only = name in READ_ONLY
    if handler is not None:
        read_only = handler(a, name, argv[1:]) or False
    if not read_only:
        a.bump(1, f"runs {argv0}")


# --- file and text tools --------------------------------------------------------------


def _reader(
    short_val: str = "",
    long_val: Sequence[str] = (),
    *,
    default_cwd: bool = False,
    recursive: str | None = None,
    pattern_first: bool = False,
) -> Handler:
    """A program that reads its path operands (``recursive``: flag letters or "always")."""

    def handler(a: Recorder, name: str, args: Args) -> bool:
        opts, paths = options(args, short_val + ("ef" if pattern_first else ""), long_val)
        if pattern_first:
            for f in values(opts, "-f", "--file"):
                a.read(f, name)
            if not has(opts, "-e", "-f", "--regexp", "--file") and paths:
                paths = paths[1:]
        subtree = recursive == "always" or bool(
            recursive
            and (
                has(opts, *("-" + c for c in recursive))
                or has(opts, "--recursive", "--dereference-recursive")
            )
        )
        if not paths and (default_cwd or subtree):
            paths = ["."]  # `ls`, `du`, `grep -r` default to the cwd
        for p in paths:
            a.read(p, name, subtree)
        return True

    return handler


for _names, _handler in [
    (
        "cat tac less more nl strings file md5sum sha1sum sha256sum sha512sum b2sum cksum "
        "readlink realpath cmp comm paste fold fmt rev",
        _reader(),
    ),
    ("head tail", _reader("nc", ("--lines", "--bytes"))),
    ("wc", _reader()),
    ("stat", _reader("c", ("--format", "--printf"))),
    ("od hexdump", _reader("AjNtns", ())),
    ("base64", _reader("w", ("--wrap",))),
    ("cut", _reader("bcdf", ("--delimiter", "--fields", "--bytes", "--characters"))),
    ("column", _reader("cstoNRWEHO", ())),
    (
        "grep egrep fgrep",
        _reader(
            "ABCDdm",
            (
                "--regexp",
                "--file",
                "--max-count",
                "--label",
                "--context",
                "--after-context",
                "--before-context",
            ),
            recursive="rR",
            pattern_first=True,
        ),
    ),
    (
        "ls",
        _reader(
            "ITw", ("--ignore", "--width", "--tabsize", "--hide"), default_cwd=True, recursive="R"
        ),
    ),
    (
        "du",
        _reader(
            "dBt",
            ("--max-depth", "--block-size", "--threshold", "--exclude"),
            default_cwd=True,
            recursive="always",
        ),
    ),
    (
        "diff",
        _reader(
            "CUxXIFL",
            ("--label", "--exclude", "--exclude-from", "--unified", "--context"),
            recursive="r",
        ),
    ),
]:
    command(*_names.split())(_handler)


@command("rg", "ag")
def _rg(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "efgtTmABCjMErd",
        (
            "--regexp",
            "--file",
            "--glob",
            "--iglob",
            "--type",
            "--type-not",
            "--max-count",
            "--context",
            "--after-context",
            "--before-context",
            "--threads",
            "--replace",
            "--max-depth",
            "--encoding",
            "--ignore-file",
            "--type-add",
            "--pre",
            "--pre-glob",
            "--sort",
            "--sortr",
            "--max-columns",
            "--max-filesize",
            "--color",
            "--colors",
        ),
    )
    if has(opts, "--pre"):
        a.opaque("rg --pre")
    for f in values(opts, "-f", "--file"):
        a.read(f, name)
    if not has(opts, "-e", "-f", "--regexp", "--file", "--files", "--type-list") and pos:
        pos = pos[1:]
    for p in pos or ["."]:
        a.read(p, name, subtree=True)
    return True


@command("sort")
def _sort(a: Recorder, name: str, args: Args) -> bool:
    opts, paths = options(
        args,
        "kotTS",
        (
            "--key",
            "--output",
            "--field-separator",
            "--temporary-directory",
            "--buffer-size",
            "--files0-from",
        ),
    )
    for p in paths:
        a.read(p, name)
    for f in values(opts, "--files0-from"):
        a.read(f, name)
    for out in values(opts, "-o", "--output"):
        a.write(out, name)
    return True


@command("uniq", "xxd")
def _in_out(a: Recorder, name: str, args: Args) -> bool:
    _, paths = options(
        args,
        "fswcgloOs" if name == "xxd" else "fsw",
        ("--skip-fields", "--skip-chars", "--check-chars"),
    )
    if paths:
        a.read(paths[0], name)
    if len(paths) > 1:
        a.write(paths[1], name)
    return True


@command("jq")
def _jq(a: Recorder, name: str, args: Args) -> bool:
    rest: Args = []
    filter_seen = False
    it = iter(args)
    for arg in it:
        if arg in ("--arg", "--argjson"):
            next(it, None)
            next(it, None)
        elif arg in ("--slurpfile", "--rawfile"):
            next(it, None)
            a.read(next(it, None), name)
        elif arg in ("-f", "--from-file"):
            a.read(next(it, None), name)
            filter_seen = True
        elif arg in ("--indent", "--tab", "-L"):
            if arg != "--tab":
                next(it, None)
        elif arg is not None and arg.startswith("-") and arg != "-":
            continue
        elif not filter_seen:
            filter_seen = True
        else:
            rest.append(arg)
    for p in rest:
        a.read(p, name)
    return True


@command("find")
def _find(a: Recorder, name: str, args: Args) -> bool:
    i = 0
    while i < len(args) and args[i] in ("-H", "-L", "-P"):
        i += 1
    starts: Args = []
    while i < len(args):
        arg = args[i]
        if arg is not None and arg.startswith(("-", "(", "!", ")")):
            break
        starts.append(arg)
        i += 1
    starts = starts or ["."]
    expr = args[i:]
    for s in starts:
        a.read(s, name, subtree=True)
    read_only = True
    j = 0
    while j < len(expr):
        tok = expr[j]
        if tok in ("-exec", "-execdir", "-ok", "-okdir"):
            a.opaque("find -exec")
            if j + 1 < len(expr) and expr[j + 1] is not None:
                a.add("proc_spawn", expr[j + 1])  # type: ignore[arg-type]
            read_only = False
        elif tok == "-delete":
            for s in starts:
                a.delete(s, name, subtree=True)
        elif tok in ("-fprint", "-fprint0", "-fls", "-fprintf") and j + 1 < len(expr):
            a.write(expr[j + 1], name)
        j += 1
    return read_only


def _sources_and_dest(opts, pos: list) -> tuple[list, str | None, bool] | None:
    """(sources, destination, whether -t named it) for cp/mv-style argv; None if too few."""
    target = values(opts, "-t", "--target-directory")
    if target:
        return pos, target[-1], True
    if len(pos) >= 2:
        return pos[:-1], pos[-1], False
    return None


@command("cp", "install")
def _cp(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "tSmogT" if name == "install" else "tS",
        ("--target-directory", "--suffix", "--mode", "--owner", "--group"),
    )
    if name == "install" and has(opts, "-d", "--directory"):
        for p in pos:
            a.write(p, name)
        return True
    rec = has(opts, "-r", "-R", "-a", "--recursive", "--archive")
    split = _sources_and_dest(opts, pos)
    if split is None:
        return True
    srcs, dest, explicit = split
    into = explicit or len(srcs) > 1 or (dest or "").endswith("/")
    for s in srcs:
        a.read(s, name, rec)
        if into and s is not None and dest is not None and not rec:
            a.write(posixpath.join(dest, posixpath.basename(s.rstrip("/"))), name)
    if rec or not into:
        a.write(dest, name, rec)
    elif dest is None or any(s is None for s in srcs):
        a.write(None, name)
    return True


@command("mv")
def _mv(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "tS", ("--target-directory", "--suffix"))
    split = _sources_and_dest(opts, pos)
    if split is None:
        return True
    srcs, dest, _ = split
    for s in srcs:
        a.delete(s, name)
    a.write(dest, name)
    return True


@command("rm", "rmdir", "unlink", "shred")
def _rm(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "ns" if name == "shred" else "", ("--iterations", "--size"))
    rec = has(opts, "-r", "-R", "--recursive")
    for p in pos:
        if name == "shred" and not has(opts, "-u", "--remove"):
            a.write(p, name, destroys="overwrites content")
        else:
            a.delete(p, name, rec)
    return True


@command("mkdir", "touch", "tee", "truncate")
def _writer(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        {"mkdir": "m", "touch": "dtr", "truncate": "sr"}.get(name, ""),
        ("--mode", "--date", "--reference", "--size"),
    )
    for ref in values(opts, "-r", "--reference"):
        a.read(ref, name)
    for p in pos:
        a.write(p, name)
    return True


@command("chmod", "chown", "chgrp")
def _chmod(a: Recorder, name: str, args: Args) -> bool:
    flags = [x for x in args if x is not None and re.fullmatch(r"-[cfvRhHLP]+|--\w[\w-]*(=.*)?", x)]
    pos = [x for x in args if x not in flags]
    rec = any("R" in f for f in flags if not f.startswith("--")) or "--recursive" in flags
    if not any(f.startswith("--reference") for f in flags):
        pos = pos[1:]  # the mode / owner operand
    for p in pos:
        a.write(p, name, rec)
    return True


@command("ln")
def _ln(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "tS", ("--target-directory", "--suffix"))
    target = values(opts, "-t", "--target-directory")
    if target:
        for p in pos:
            a.write(
                None
                if p is None or target[-1] is None
                else posixpath.join(target[-1], posixpath.basename(p)),
                name,
            )
    elif len(pos) == 1:
        a.write(None if pos[0] is None else posixpath.basename(pos[0].rstrip("/")), name)
    elif pos:
        a.write(pos[-1], name)
    return True


@command("sed")
def _sed(a: Recorder, name: str, args: Args) -> bool:
    in_place = False
    scripts = False
    rest: Args = []
    it = iter(args)
    for arg in it:
        if arg is None or not arg.startswith("-") or arg == "-":
            rest.append(arg)
        elif arg in ("-e", "--expression", "-l", "--line-length"):
            scripts |= arg in ("-e", "--expression")
            next(it, None)
        elif arg in ("-f", "--file"):
            scripts = True
            a.read(next(it, None), name)
        elif arg.startswith("--in-place") or (not arg.startswith("--") and "i" in arg):
            in_place = True
            scripts |= not arg.startswith("--") and "e" in arg.split("i")[0]
        elif arg.startswith(("--expression=", "--file=")):
            scripts = True
    files = rest if scripts else rest[1:]
    for f in files:
        a.read(f, name)
        if in_place:
            a.write(f, name)
    return False


@command("awk", "gawk", "mawk")
def _awk(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "fvF", ("--file", "--assign", "--field-separator"))
    progs = values(opts, "-f", "--file")
    for f in progs:
        a.read(f, name)
    for p in pos if progs else pos[1:]:
        if p is None or "=" not in p:
            a.read(p, name)
    return False


@command("dd")
def _dd(a: Recorder, name: str, args: Args) -> bool:
    for arg in args:
        if arg is None:
            a.opaque("dynamic dd operand")
        elif arg.startswith("if="):
            a.read(arg[3:], name)
        elif arg.startswith("of="):
            a.write(arg[3:], name)
    return True


@command("tar")
def _tar(a: Recorder, name: str, args: Args) -> bool:
    if args and args[0] is not None and not args[0].startswith("-"):
        args = ["-" + args[0], *args[1:]]  # old-style bundled modes: `tar xzf a.tgz`
    opts, pos = options(
        args,
        "fCTXbHKLNgV",
        ("--file", "--directory", "--files-from", "--exclude-from", "--exclude"),
    )
    archive = (values(opts, "-f", "--file") or ["-"])[-1]
    where = (values(opts, "-C", "--directory") or ["."])[-1]
    if has(opts, "-x", "--extract", "--get"):
        a.read(archive, name)
        a.write(where, name, subtree=True)
    elif has(opts, "-c", "--create", "-r", "--append", "-u", "--update"):
        base = a.path(where, name)
        for p in pos:
            a.read(p if p is None or base is None else posixpath.join(base, p), name, True)
            if has(opts, "--remove-files"):
                a.delete(p if p is None or base is None else posixpath.join(base, p), name, True)
        a.write(archive, name)
    else:  # --list and friends
        a.read(archive, name)
    return True


@command("unzip")
def _unzip(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "dxP")
    if pos:
        a.read(pos[0], name)
    if has(opts, "-l", "-v", "-t", "-Z"):
        return True
    a.write((values(opts, "-d") or ["."])[-1], name, subtree=True)
    return True


@command("zip")
def _zip(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "xibntP")
    rec = has(opts, "-r", "-R")
    if pos:
        a.write(pos[0], name)
    for p in pos[1:]:
        a.read(p, name, rec)
        if has(opts, "-m"):
            a.delete(p, name, rec)
    return True


@command("gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "zstd", "unzstd")
def _compress(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "S", ("--suffix",))
    to_stdout = has(opts, "-c", "--stdout", "-l", "--list", "-t", "--test")
    decompress = name.startswith("un") or has(opts, "-d", "--decompress")
    ext = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zstd": ".zst"}.get(
        name.removeprefix("un").replace("gunzip", "gzip").replace("bunzip2", "bzip2"), ".gz"
    )
    for p in pos:
        a.read(p, name)
        if to_stdout or p is None:
            continue
        a.write(p[: -len(ext)] if decompress and p.endswith(ext) else p + ext, name)
        if not has(opts, "-k", "--keep") and name not in ("zstd", "unzstd"):
            a.delete(p, name)
    return to_stdout


# --- shell state, wrappers and interpreters -------------------------------------------


@command("cd", "pushd", "popd")
def _cd(a: Recorder, name: str, args: Args) -> bool:
    a.add("session_write", "cwd", 1)
    _, pos = options(args)
    target = pos[0] if pos else (a.home if name == "cd" else None)
    if (
        name == "popd"
        or target is None
        or target.startswith(("-", "+"))
        or (not target.startswith("/") and a.cwd is None)
    ):
        a.cwd = None
        return True
    a.cwd = posixpath.normpath(posixpath.join(a.cwd or "/", target))
    return True


@command("read", "mapfile", "readarray")
def _read_builtin(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "adinNptuCcsO" if name == "read" else "dnOsuCc")
    for v in values(opts, "-a") + pos:
        if v is not None:
            a.assigned.add(v)
    return True


@command("printf")
def _printf(a: Recorder, name: str, args: Args) -> bool:
    if len(args) >= 2 and args[0] == "-v" and args[1] is not None:
        a.assigned.add(args[1])
    return True


@command("set")
def _set(a: Recorder, name: str, args: Args) -> bool:
    if not args:
        a.env_read("*")
    return True


@command("printenv")
def _printenv(a: Recorder, name: str, args: Args) -> bool:
    _, pos = options(args)
    for v in pos or ["*"]:
        if v is None:
            a.opaque("dynamic variable name: printenv")
        else:
            a.env_read(v)
    return True


def _wrapped(a: Recorder, wrapper: str, argv: Args) -> bool:
    """Analyse the command a wrapper runs; the wrapper itself is harmless."""
    if not argv:
        return True
    if argv[0] is None:
        a.opaque(f"dynamic command after {wrapper}")
        return False
    run(a, argv)
    return True


@command("sudo", "doas")
def _sudo(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "ugpCDhrtUTRa",
        ("--user", "--group", "--prompt", "--chdir", "--host", "--role", "--type"),
        stop_at_positional=True,
    )
    if has(opts, "-e", "--edit"):
        for p in pos:
            a.write(p, name)
        return False
    if has(opts, "-s", "-i", "--shell", "--login") and not pos:
        a.opaque(f"interactive shell: {name}")
        return False
    while pos and pos[0] is not None and "=" in pos[0] and IDENT.fullmatch(pos[0].split("=")[0]):
        a.env_write(pos.pop(0).split("=")[0], persistent=False)  # type: ignore[union-attr]
    return _wrapped(a, name, pos)


@command("env")
def _env(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args, "uCS", ("--unset", "--chdir", "--split-string"), stop_at_positional=True
    )
    if has(opts, "-S", "--split-string"):
        a.opaque("env -S")
        return False
    for v in values(opts, "-u", "--unset"):
        a.env_write(v or "*", persistent=False)
    while pos and pos[0] is not None and "=" in pos[0]:
        a.env_write(pos.pop(0).split("=")[0], persistent=False)  # type: ignore[union-attr]
    if not pos:
        a.env_read("*")
        return True
    chdir = values(opts, "-C", "--chdir")
    if chdir:
        saved = a.cwd
        a.cwd = None if chdir[-1] is None or a.cwd is None else posixpath.join(a.cwd, chdir[-1])
        try:
            return _wrapped(a, name, pos)
        finally:
            a.cwd = saved
    return _wrapped(a, name, pos)


@command(
    "nice",
    "time",
    "nohup",
    "timeout",
    "stdbuf",
    "ionice",
    "setsid",
    "exec",
    "command",
    "builtin",
    "chronic",
    "caffeinate",
)
def _wrapper(a: Recorder, name: str, args: Args) -> bool:
    short = {
        "nice": "n",
        "time": "fo",
        "timeout": "sk",
        "stdbuf": "ioe",
        "ionice": "cnp",
        "exec": "a",
    }.get(name, "")
    opts, pos = options(
        args,
        short,
        ("--adjustment", "--signal", "--kill-after", "--input", "--output", "--error", "--format"),
        stop_at_positional=True,
    )
    if name == "command" and has(opts, "-v", "-V"):
        return True
    for f in values(opts, "-o", "--output") if name == "time" else []:
        a.write(f, name)
    if name == "timeout" and pos:
        pos = pos[1:]  # the duration
    return _wrapped(a, name, pos)


@command("xargs", "parallel")
def _xargs(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "adEeIiLlnPs",
        ("--arg-file", "--delimiter", "--max-args", "--max-procs", "--replace"),
        stop_at_positional=True,
    )
    for f in values(opts, "-a", "--arg-file"):
        a.read(f, name)
    a.opaque(name)
    if pos and pos[0] is not None:
        a.add("proc_spawn", pos[0])
    return False


@command("eval", "trap", "watch", "source", ".")
def _eval(a: Recorder, name: str, args: Args) -> bool:
    if name in ("source", ".") and args:
        a.read(args[0], name)
    a.opaque(name)
    return False


@command("bash", "sh", "zsh", "dash", "ksh", "fish", "busybox")
def _shell(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "oO", stop_at_positional=True)
    if has(opts, "-c"):
        a.opaque(f"{name} -c")
    elif pos:
        a.read(pos[0], name)
        a.opaque(f"{name} script")
    else:
        a.opaque(f"{name} reading a script from stdin")
    return False
