"""What programs that reach the network do, for the effect analysis.

See docs/decisions.md, Effects and policy.

Command handlers (see ``bashstate.Handler``) for network clients (``curl``, ``wget``,
``ssh``, ``scp``, ``rsync``), package managers (``pip``, ``npm`` and friends) and ``git``:
which hosts they connect to, which of those connections write (``git push``, a request
body, a remote copy), and what they read and write locally.  ``commands`` merges
``COMMANDS`` into the full handler table.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import urlsplit

from .args import Args, has, host_port, options, remote_spec, values, wordset
from .state import Handler, Recorder, registrar

COMMANDS: dict[str, Handler] = {}
"""Handlers by argv0 basename."""
command = registrar(COMMANDS)


# --- network clients ------------------------------------------------------------------


@command("curl")
def _curl(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "oDdXTFHuUAebcKxyYzmwrECtQ",
        (
            "--output",
            "--dump-header",
            "--data",
            "--data-binary",
            "--data-raw",
            "--data-ascii",
            "--data-urlencode",
            "--json",
            "--form",
            "--form-string",
            "--request",
            "--upload-file",
            "--header",
            "--user",
            "--proxy-user",
            "--user-agent",
            "--referer",
            "--cookie",
            "--cookie-jar",
            "--config",
            "--proxy",
            "--max-time",
            "--connect-timeout",
            "--retry",
            "--write-out",
            "--range",
            "--cacert",
            "--cert",
            "--key",
            "--url",
            "--output-dir",
            "--resolve",
            "--connect-to",
            "--netrc-file",
            "--limit-rate",
        ),
    )
    urls = pos + values(opts, "--url")
    method = (values(opts, "-X", "--request") or ["GET"])[-1]
    uploads = values(opts, "-T", "--upload-file")
    bodies = values(
        opts,
        "-d",
        "--data",
        "--data-binary",
        "--data-raw",
        "--data-ascii",
        "--data-urlencode",
        "--json",
        "-F",
        "--form",
        "--form-string",
    )
    writes = bool(uploads or bodies) or (method or "").upper() not in ("GET", "HEAD")
    if has(opts, "-K", "--config"):
        a.opaque("curl config file")
    for body in bodies:
        if body is not None and "@" in body:
            a.read(body.split("@", 1)[1].split(";")[0], name)
    for f in uploads + values(opts, "--cacert", "--cert", "--key", "-E", "--netrc-file"):
        a.read(f, name)
    for f in values(opts, "-D", "--dump-header", "-c", "--cookie-jar"):
        a.write(f, name)
    for f in values(opts, "-b", "--cookie"):
        if f is None or "=" not in f:
            a.read(f, name)
    for proxy in values(opts, "-x", "--proxy"):
        a.url(proxy, name)
    out_dir = (values(opts, "--output-dir") or ["."])[-1]
    for u in urls:
        a.url(u, name, write=f"{name} {method if writes else ''}".strip() if writes else None)
    for out in values(opts, "-o", "--output"):
        a.write(
            out
            if out is None or out.startswith("/") or out_dir is None
            else posixpath.join(out_dir, out),
            name,
        )
    if has(opts, "-O", "--remote-name", "--remote-name-all"):
        for u in urls:
            base = None if u is None else posixpath.basename(urlsplit(u).path) or None
            a.write(
                None if base is None or out_dir is None else posixpath.join(out_dir, base), name
            )
    return False


@command("wget")
def _wget(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "OoaPiUteTwlQADRIXe",
        (
            "--output-document",
            "--output-file",
            "--append-output",
            "--directory-prefix",
            "--input-file",
            "--user-agent",
            "--header",
            "--post-data",
            "--post-file",
            "--method",
            "--body-data",
            "--body-file",
            "--user",
            "--password",
            "--tries",
            "--timeout",
            "--wait",
            "--level",
            "--quota",
            "--accept",
            "--reject",
            "--domains",
        ),
    )
    if has(opts, "-e", "--execute"):
        a.opaque("wget -e")
    for f in values(opts, "-i", "--input-file"):
        a.read(f, name)
        a.opaque("URLs from a file: wget -i")
    for f in values(opts, "--post-file", "--body-file"):
        a.read(f, name)
    method = (values(opts, "--method") or ["GET"])[-1] or "?"
    writes = has(
        opts, "--post-data", "--post-file", "--body-data", "--body-file"
    ) or method.upper() not in ("GET", "HEAD")
    for u in pos:
        a.url(u, name, write="wget with a body" if writes else None)
    for f in values(opts, "-o", "--output-file", "-a", "--append-output"):
        a.write(f, name)
    prefix = (values(opts, "-P", "--directory-prefix") or ["."])[-1]
    outs = values(opts, "-O", "--output-document")
    if outs:
        for f in outs:
            a.write(f, name)
    elif has(opts, "-r", "--recursive", "-m", "--mirror"):
        a.write(prefix, name, subtree=True)
    else:
        for u in pos:
            base = (
                None
                if u is None or prefix is None
                else (
                    posixpath.basename(urlsplit(u if "://" in u else "http://" + u).path)
                    or "index.html"
                )
            )
            a.write(None if base is None or prefix is None else posixpath.join(prefix, base), name)
    return False


@command("ssh")
def _ssh(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "bcDEeFiIJlLmOopQRSwW", stop_at_positional=True)
    port = (values(opts, "-p") or ["22"])[-1] or "*"
    for o in values(opts, "-o"):
        if o is not None and o.lower().startswith(("proxycommand", "localcommand")):
            a.opaque("ssh -o ProxyCommand")
        elif o is not None and o.lower().startswith("port="):
            port = o.split("=", 1)[1]
    for f in values(opts, "-i", "-F"):
        a.read(f, name)
    for jump in values(opts, "-J"):
        for hop in (jump or "*").split(","):
            hp = host_port(hop if "://" in hop else f"ssh://{hop}")
            a.net(*(hp or ("*", "*")))
    if not pos:
        return False
    dest = pos[0]
    if dest is None:
        a.opaque("dynamic ssh destination")
        return False
    hp = host_port(dest if "://" in dest else f"ssh://{dest}")
    host, dport = hp or ("*", "*")
    a.net(
        host,
        port if dport in ("22", "*") else dport,
        write="ssh remote command" if len(pos) > 1 else None,
    )
    return False


@command("scp", "rsync")
def _copy_remote(a: Recorder, name: str, args: Args) -> bool:
    if name == "scp":
        opts, pos = options(args, "cFiJloPSX")
        port = (values(opts, "-P") or ["22"])[-1] or "*"
        rec = has(opts, "-r")
        if has(opts, "-S"):
            a.opaque("scp -S program")
    else:
        opts, pos = options(
            args,
            "efTB",
            (
                "--rsh",
                "--exclude",
                "--include",
                "--filter",
                "--exclude-from",
                "--include-from",
                "--files-from",
                "--port",
                "--temp-dir",
                "--backup-dir",
                "--log-file",
                "--password-file",
                "--chmod",
                "--max-size",
                "--min-size",
                "--timeout",
            ),
        )
        port = (values(opts, "--port") or ["22"])[-1] or "*"
        rec = has(opts, "-r", "-a", "--recursive", "--archive")
        for rsh in values(opts, "-e", "--rsh"):
            if rsh is None or rsh.split()[0:1] != ["ssh"]:
                a.opaque("rsync -e program")
    if len(pos) < 2:
        return False
    *srcs, dest = pos
    deletes = any(o.startswith("--delete") or o == "--remove-source-files" for o, _ in opts)
    for s in srcs:
        remote = remote_spec(s)
        if remote:
            a.net(remote[0], port if remote[1] == "22" else remote[1])
        else:
            a.read(s, name, rec)
            if has(opts, "--remove-source-files"):
                a.delete(s, name, rec)
    remote = remote_spec(dest)
    if remote:
        a.net(remote[0], port if remote[1] == "22" else remote[1], write=f"{name} to a remote")
    else:
        a.write(dest, name, rec)
        if deletes:
            a.delete(dest, name, subtree=True)
    return False


# --- package managers -----------------------------------------------------------------

_PIP_READ = frozenset(
    {
        "list",
        "show",
        "freeze",
        "check",
        "help",
        "search",
        "config",
        "debug",
        "inspect",
        "hash",
        "cache",
    }
)


@command("pip", "pip3")
def _pip(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "rcetiC",
        (
            "--requirement",
            "--constraint",
            "--editable",
            "--target",
            "--index-url",
            "--extra-index-url",
            "--python",
            "--root",
            "--prefix",
        ),
    )
    sub = pos[0] if pos else None
    if sub in _PIP_READ or has(opts, "--version", "-V", "-h", "--help"):
        return True
    if sub in ("install", "download", "wheel"):
        for f in values(opts, "-r", "--requirement", "-c", "--constraint"):
            a.read(f, name)
        for f in values(opts, "-e", "--editable") + [
            p for p in pos[1:] if p is None or p.startswith((".", "/"))
        ]:
            a.read(f, name, subtree=True)
        if not has(opts, "--no-index"):
            indexes = values(opts, "-i", "--index-url")
            if not indexes:
                a.net("pypi.org", "443")
                a.net("files.pythonhosted.org", "443")
            for u in indexes + values(opts, "--extra-index-url"):
                a.url(u, name)
        for t in values(opts, "-t", "--target"):
            a.write(t, name, subtree=True)
    elif sub is None:
        a.opaque("dynamic pip subcommand")
    return False


_NPM_NET = frozenset(
    {
        "install",
        "i",
        "ci",
        "add",
        "update",
        "up",
        "upgrade",
        "install-test",
        "it",
        "audit",
        "outdated",
        "view",
        "info",
        "show",
        "search",
        "dlx",
        "exec",
        "x",
    }
)


@command("npm", "npx", "yarn", "pnpm")
def _npm(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(args, "C", ("--registry", "--prefix", "--cwd", "--dir"))
    sub = "exec" if name == "npx" else (pos[0] if pos else ("install" if name == "yarn" else None))
    registries = values(opts, "--registry")
    if sub == "publish":
        for r in registries or ["https://registry.npmjs.org"]:
            a.url(r, name, write=f"{name} publish")
        return False
    if sub in _NPM_NET:
        for r in registries:
            a.url(r, name)
        if not registries:
            a.net("registry.yarnpkg.com" if name == "yarn" else "registry.npmjs.org", "443")
        if name != "npx" and sub not in (
            "view",
            "info",
            "show",
            "search",
            "outdated",
            "audit",
            "exec",
            "x",
            "dlx",
        ):
            a.write("node_modules", name, subtree=True)
    elif sub in ("uninstall", "remove", "rm", "un", "prune"):
        a.write("node_modules", name, subtree=True)
    return sub in ("ls", "list", "view", "info", "show", "outdated", "help", "--version", "-v")


@command("python", "python3")
def _python(a: Recorder, name: str, args: Args) -> bool:
    if len(args) >= 2 and args[0] == "-m" and args[1] in ("pip", "pip3"):
        return _pip(a, "pip", args[2:])
    return False


# --- git ------------------------------------------------------------------------------

_GIT_READ = wordset(
    "status log diff show blame grep ls-files ls-tree rev-parse rev-list describe shortlog "
    "cat-file for-each-ref show-ref merge-base name-rev count-objects var help version "
    "whatchanged check-ignore check-attr diff-tree diff-files diff-index range-diff "
    "annotate show-branch cherry"
)
_GIT_WRITE = wordset(
    "add commit checkout switch merge rebase mv stash tag branch init am apply cherry-pick "
    "revert config remote worktree submodule notes gc prune repack bisect format-patch "
    "update-index update-ref symbolic-ref reflog replace sparse-checkout maintenance "
    "restore reset clean rm"
)
_GIT_NET = frozenset({"clone", "fetch", "pull", "push", "ls-remote"})
_GIT_RISKY_CONFIG = re.compile(
    r"(pager|sshcommand|editor|^alias\.|helper|external|fsmonitor|"
    r"hookspath|askpass|textconv|program|gitproxy|uploadpack|"
    r"receivepack|proxycommand)",
    re.I,
)


def _git_is_read(sub: str, rest: Args) -> bool:
    if sub in _GIT_READ:
        return True
    flags = {x for x in rest if x is not None and x.startswith("-")}
    words = [x for x in rest if x is None or not x.startswith("-")]
    if sub == "branch":
        return not words and not flags & {
            "-d",
            "-D",
            "-m",
            "-M",
            "-c",
            "-C",
            "--delete",
            "--move",
            "--copy",
            "-u",
            "--set-upstream-to",
            "--unset-upstream",
            "--edit-description",
        }
    if sub == "tag":
        return not words or bool(flags & {"-l", "--list"})
    if sub in ("stash", "worktree", "remote", "notes", "submodule"):
        # Bare `git stash` pushes (a write); the others list.
        return (not words and sub != "stash") or (
            bool(words) and words[0] in ("list", "show", "get-url", "status")
        )
    if sub == "config":
        return bool(flags & {"--get", "--get-all", "--get-regexp", "--list", "-l"}) or (
            len(words) == 1 and not flags & {"--unset", "--unset-all", "--add"}
        )
    if sub == "reflog":
        return not words or words[0] == "show"
    return False


def _git_discards(sub: str, rest: Args) -> str | None:
    """Why a git subcommand destroys uncommitted work, if it does."""
    flags = {x for x in rest if x is not None and x.startswith("-")}
    if sub == "reset" and "--hard" in flags:
        return "git reset --hard"
    if sub == "checkout" and (flags & {"-f", "--force"} or "--" in rest or "." in rest):
        return "git checkout discards changes"
    if sub == "restore" and (flags & {"--worktree", "-W"} or not flags & {"--staged", "-S"}):
        return "git restore discards changes"
    if sub == "stash" and any(w in ("drop", "clear") for w in rest):
        return "git stash drop"
    if sub == "branch" and "-D" in flags:
        return "git branch -D"
    return None


@command("git")
def _git(a: Recorder, name: str, args: Args) -> bool:
    opts, pos = options(
        args,
        "Cc",
        ("--git-dir", "--work-tree", "--namespace", "--exec-path", "--config-env"),
        stop_at_positional=True,
    )
    for kv in values(opts, "-c", "--config-env"):
        if kv is None or _GIT_RISKY_CONFIG.search(kv.split("=", 1)[0]):
            a.opaque("git -c may run a program")
    repo: str | None = "."
    for d in values(opts, "-C"):
        repo = None if d is None or repo is None else posixpath.join(repo, d)
    for d in values(opts, "--work-tree"):
        repo = d
    if not pos:
        return True
    sub, rest = pos[0], pos[1:]
    if sub is None:
        a.opaque("dynamic git subcommand")
        return False
    if _git_is_read(sub, rest):
        a.read(repo, name, subtree=True)
        return True
    if sub in _GIT_NET:
        return _git_net(a, name, sub, rest, repo)
    if sub not in _GIT_WRITE:
        a.opaque(f"unknown git subcommand or alias: {sub}")
        return False
    if sub in ("clean", "rm"):
        sub_opts, paths = options(rest, "e", ("--exclude",))
        if sub == "clean" and has(sub_opts, "-n", "--dry-run"):
            a.read(repo, name, subtree=True)
            return True
        base = a.path(repo, name)
        for p in (paths or ["."]) if sub == "clean" else paths:
            full = p if p is None or base is None else posixpath.join(base, p)
            a.delete(full, name, subtree=sub == "clean" or has(sub_opts, "-r"))
        return False
    a.write(repo, name, subtree=True, destroys=_git_discards(sub, rest))
    return False


def _git_net(a: Recorder, name: str, sub: str, rest: Args, repo: str | None) -> bool:
    opts, pos = options(
        rest,
        "bojcuX" if sub != "push" else "o",
        (
            "--branch",
            "--origin",
            "--depth",
            "--config",
            "--reference",
            "--separate-git-dir",
            "--upload-pack",
            "--receive-pack",
            "--template",
            "--jobs",
            "--filter",
            "--shallow-since",
            "--shallow-exclude",
            "--push-option",
            "--repo",
            "--strategy",
            "--strategy-option",
        ),
    )
    remote = pos[0] if pos else None
    write = "git push" if sub == "push" else None
    if remote is None and not pos and sub != "clone":
        a.net("*", "*", write=write)
        a.bump(1, f"git {sub}: remote is not a literal URL")
    elif remote is None:
        a.opaque(f"dynamic git remote: git {sub}")
    else:
        hp = host_port(remote, None)
        if hp is not None:
            a.net(*hp, write=write)
        elif remote.startswith(("/", ".", "~")) or sub == "clone":
            a.read(remote, name, subtree=True)
        else:  # a remote name such as `origin`: its URL lives in .git/config
            a.net("*", "*", write=write)
            a.bump(1, f"git {sub}: remote {remote!r} is not a literal URL")
    if sub == "clone" and remote is not None:
        dest = (
            pos[1]
            if len(pos) > 1
            else posixpath.basename(remote.rstrip("/").split(":")[-1]).removesuffix(".git")
        )
        base = a.path(repo, name)
        a.write(
            dest if dest is None or base is None else posixpath.join(base, dest), name, subtree=True
        )
    elif sub == "fetch":
        a.write(None if repo is None else posixpath.join(repo, ".git"), name, subtree=True)
    elif sub == "pull":
        a.write(repo, name, subtree=True)
    return False
