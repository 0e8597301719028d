"""The world tests/test_security_isolation.py attacks: one real kernel per mode.

``root``: the kernel runs as root (the venv's interpreter, the package and its
dependencies imported from the copies on ``PYTHONPATH``, so that a trusted-base escape
cannot touch the checkout or the venv).  ``user``: the kernel
runs as :data:`~.unprivileged.UNPRIVILEGED_UID` from a world-readable runtime, every
file of the world owned by that uid (so each attack is one the uid could do unconfined).

``self`` (a run that is not root, which cannot start the other two): the kernel runs as
the current uid, like ``root`` otherwise.

Layout of ``tmp`` (0711)::

    rt/       the runtime: src/shoal_mcp (the trusted base), site/ (user mode's packages)
    home/     the kernel's $HOME, with secrets in it
    cfg/      policy.toml (agent:a may write cfg/**, never the policy itself)
    attacks/  isolation_probes.py (read by everyone)
    proj/     a git work tree with a nested one (repo/); results/ of the probes
    out/      read-granted, never write-granted: targets of the metadata attacks
    k/        the kernel's run/ and state/
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal_mcp.client import KernelClient
from shoal_mcp.tokens import TokenStore

from .kernel import KernelProcess, child_env, close_client
from .polling import wait_until
from .tmp import short_tmp
from .unprivileged import (
    UNPRIVILEGED_UID,
    UidCaller,
    UnprivilegedKernel,
    build_runtime,
    check_runtime,
    chown_tree,
)

PROBES = Path(__file__).with_name("isolation_probes.py")
PYTHON = "/usr/bin/python3"
AGENTS = ("agent:a", "agent:b", "agent:tmp", "agent:ask", "agent:net")
STEER_NAMES = (
    "PATH",
    "LD_PRELOAD",
    "BASH_ENV",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_KEY_0",
    "GIT_CONFIG_VALUE_0",
    "GIT_DIR",
)
"""Granted to agent:a by exact name: the test is whether they reach the *human*."""

POLICY = """
[principal."agent:a"]
proc_spawn = ["*"]
opaque = "allow"
env_read = ["*"]
env_write = ["*", {steer}]
[principal."agent:a".fs]
read = [{reads}]
write = ["{proj}/**", "{rt}/**", "{cfg}/**"]
delete = ["{proj}/**", "{rt}/**", "{cfg}/**"]

[principal."agent:b"]
proc_spawn = ["*"]
opaque = "allow"
env_read = ["*"]
env_write = ["*", "PATH"]
[principal."agent:b".fs]
read = [{reads}]
write = ["{proj}/**"]

[principal."agent:ask"]
proc_spawn = ["*"]
opaque = "allow"
ungranted = "ask"
[principal."agent:ask".fs]
read = [{reads}]
write = ["{proj}/**", "{rt}/**"]

[principal."agent:net"]
proc_spawn = ["*"]
opaque = "allow"
net_connect = ["127.0.0.1:{granted_port}"]
[principal."agent:net".fs]
read = [{reads}]
write = ["{proj}/**"]

[principal."agent:tmp"]
proc_spawn = ["*"]
opaque = "allow"
[principal."agent:tmp".fs]
read = [{reads}]
write = ["{proj}/**", "/tmp/**"]
"""

SECRETS = {
    ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY----- secret\n",
    ".config/git/credentials": "https://u:secret@example.com\n",
    ".git-credentials": "https://u:secret@example.com\n",
    ".netrc": "machine example.com login u password secret\n",
    ".aws/credentials": "[default]\naws_secret_access_key = secret\n",
}

KERNEL_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "kernel-env-secret-aws",
    "GITHUB_TOKEN": "kernel-env-secret-gh",
}
"""In the kernel's environment (the human started it from a shell that had them)."""


@dataclass
class World:
    mode: str  # root | user
    tmp: Path
    kernel: KernelProcess
    uid: int
    tokens: dict[str, str]
    paths: dict[str, Path]
    _clients: dict[tuple[str, str], KernelClient] = field(default_factory=dict)
    granted: socket.socket | None = None  # agent:net's one granted TCP port listens here
    _uid_caller: UidCaller | None = None
    _seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # -- talking to the kernel ------------------------------------------------------------

    def call(self, who: str, session: str, method: str, params: dict, timeout: float = 60) -> Any:
        token = self.tokens.get(who)
        if self._uid_caller is not None:
            return self._uid_caller.call(
                f"{who}/{session}", session, token, method, params, timeout
            )
        key = (who, session)
        c = self._clients.get(key)
        if c is None:
            c = self.kernel.client(session, token=token)
            self._clients[key] = c
        return c.call(method, params, timeout=timeout)

    def exec(self, who: str, session: str, src: str, **params: Any) -> dict:
        return self.call(who, session, "exec", {"src": src, "position": "value", **params})

    def text(self, who: str, session: str, src: str) -> str:
        """stdout of ``src`` run as ``who``."""
        ref = self.exec(who, session, src)["ref"]
        got = self.call(
            who, session, "value.get", {"ref": ref, "path": ".out", "format": "raw"}, timeout=30
        )
        return str(got["raw"])

    # -- probes ---------------------------------------------------------------------------

    def result_path(self) -> Path:
        return self.paths["proj"] / "results" / f"r{next(self._seq)}.json"

    def probe_src(self, result: Path, cases: list[str]) -> str:
        quoted = " ".join("'" + c.replace("'", "'\\''") + "'" for c in cases)
        return f"{PYTHON} {self.paths['attacks'] / PROBES.name} {result} {quoted}"

    def probe(self, who: str, cases: list[str], session: str = "") -> dict[str, dict]:
        """Run the probe cases as ``who`` in one exec; {case: {"done", "detail"}}."""
        result = self.result_path()
        session = session or f"probe-{who.replace(':', '-')}"
        out = self.exec(who, session, self.probe_src(result, cases))
        if not result.exists():
            raise AssertionError(f"the probe left no result; exec gave {out.get('render')!r}")
        return json.loads(result.read_text())

    @contextmanager
    def background(self, who: str, case: str, session: str = "") -> Iterator[BackgroundProbe]:
        """A background probe (``hold-*``/``watch-*``/``listen-*``) while the body runs."""
        result = self.result_path()
        session = session or f"bg-{who.replace(':', '-')}-{result.stem}"
        got = self.exec(who, session, self.probe_src(result, [case]), background=True)
        bg = BackgroundProbe(self, who, session, got["task"], result, case)
        ready = Path(str(result) + ".ready")
        try:
            wait_until(
                lambda: ready.exists() or result.exists(), timeout=30, what=f"{case} to set up"
            )
            bg.ready_text = ready.read_text() if ready.exists() else ""
            yield bg
        finally:
            bg.stop()

    def owned(self, *paths: Path) -> None:
        """Give paths the test made to the kernel's uid (user mode; ours already else)."""
        if self.uid == os.geteuid():
            return
        for p in paths:
            os.chown(p, self.uid, self.uid, follow_symlinks=False)

    def close(self) -> None:
        for c in self._clients.values():
            close_client(c)
        if self._uid_caller is not None:
            self._uid_caller.close()


@dataclass
class BackgroundProbe:
    world: World
    who: str
    session: str
    task: str
    result_file: Path
    case: str
    ready_text: str = ""
    outcome: dict | None = None

    def stop(self) -> dict:
        if self.outcome is None:
            Path(str(self.result_file) + ".stop").touch()
            wait_until(self.result_file.exists, timeout=60, what=f"{self.case} to finish")
            self.outcome = json.loads(self.result_file.read_text())[self.case]
            self.world.call(
                self.who, self.session, "task.await", {"task": self.task, "timeout_ms": 30000}
            )
        return self.outcome


def _git(repo: Path, *args: str) -> None:
    base = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*base, *args], check=True, capture_output=True)


def _make_repo(path: Path) -> None:
    path.mkdir(exist_ok=True)
    _git(path, "init", "-q")
    (path / "h.txt").write_text("hello\n")
    _git(path, "add", "h.txt")
    _git(path, "commit", "-qm", "x")


def _populate(tmp: Path) -> dict[str, Path]:
    p = {n: tmp / n for n in ("home", "cfg", "attacks", "proj", "out", "k")}
    for d in p.values():
        d.mkdir(mode=0o755)
    (p["k"] / "run").mkdir()
    for rel, text in SECRETS.items():
        f = p["home"] / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (p["home"] / ".gitconfig").write_text("[user]\n\tname = t\n\temail = t@t\n")
    shutil.copy(PROBES, p["attacks"] / PROBES.name)
    _make_repo(p["proj"])
    _make_repo(p["proj"] / "repo")
    for sub in ("results", "suid", "evilbin", "evilpy"):
        (p["proj"] / sub).mkdir()
    for sub in ("meta", "meta-human", "ipc", "steer"):
        (p["out"] / sub).mkdir()
    for meta in ("meta", "meta-human"):
        for name in ("f640", "g640"):
            (p["out"] / meta / name).write_text("precious\n")
            (p["out"] / meta / name).chmod(0o640)
        shutil.copy("/usr/bin/id", p["out"] / meta / "idcopy")
        (p["out"] / meta / "idcopy").chmod(0o755)
    (p["out"] / "forged").mkdir()
    p["rt"] = tmp / "rt"
    p["pkg"] = p["rt"] / "src" / "shoal_mcp"
    p["policy"] = p["cfg"] / "policy.toml"
    return p


def isolation_modes() -> tuple[str, ...]:
    """The kernels this run can start: root and an unprivileged uid as root (CI), else
    one as ourselves."""
    return ("root", "user") if os.geteuid() == 0 else ("self",)


@contextmanager
def isolation_world(mode: str) -> Iterator[World]:
    """A running kernel (``root``, ``user`` or ``self``) with the policy above and its
    world."""
    with short_tmp("shiso") as tmp:
        tmp.chmod(0o711)
        paths = _populate(tmp)
        pythonpath = build_runtime(paths["rt"])
        granted = socket.socket()
        granted.bind(("127.0.0.1", 0))
        granted.listen(16)
        granted.setblocking(False)
        reads = ", ".join(
            f'"{paths[n]}/**"' for n in ("proj", "home", "out", "attacks", "rt", "cfg")
        )
        paths["policy"].write_text(
            POLICY.format(
                steer=", ".join(f'"{n}"' for n in STEER_NAMES),
                granted_port=granted.getsockname()[1],
                reads=reads,
                **{n: paths[n] for n in ("proj", "rt", "cfg")},
            )
        )
        uid = UNPRIVILEGED_UID if mode == "user" else os.geteuid()
        env = {"HOME": str(paths["home"]), "PYTHONPATH": pythonpath, **KERNEL_SECRETS}
        args = ("--policy", str(paths["policy"]), "--sandbox", "required")
        kernel: KernelProcess
        if mode != "user":
            kernel = KernelProcess(paths["k"], *args, env=env)
        else:
            kernel = UnprivilegedKernel(paths["k"], *args, uid=uid, env=env)
        store = TokenStore(kernel.state / "tokens.json")
        tokens = {p: store.create(p)[1] for p in AGENTS}
        if mode == "user":
            chown_tree(tmp, uid)
            check_runtime(pythonpath, uid, paths["home"])
        world = World(mode, tmp, kernel, uid, tokens, paths, granted=granted)
        try:
            kernel.start()
            if mode == "user":
                world._uid_caller = UidCaller(kernel.socket, uid, child_env(env))
            yield world
        finally:
            world.close()
            kernel.stop()
            granted.close()
