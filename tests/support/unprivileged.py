"""A real ``shoal-kernel`` running as an unprivileged uid, started from a root test run.

CI runs as root, yet the sandbox must hold for a user's kernel too.  The venv's
interpreter lives under ``/root`` (0700), which other uids cannot traverse, so
:func:`build_runtime` makes a world-readable runtime: the system ``/usr/bin/python3``
(same ABI as the venv's, checked: :func:`abi_problem`) with ``PYTHONPATH`` on a copy of
``src/shoal_mcp`` and of the third-party packages the kernel imports (with their
compiled modules).  :class:`UnprivilegedKernel` starts it under ``setpriv``;
:class:`UidCaller` talks to it as that uid (a kernel refuses every other uid, root
included) through ``uid_client.py``.  Where the runtime cannot work, these raise with
the reason: a test needing them fails loudly rather than skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from shoal_mcp.protocol.errors import RpcError

from .kernel import KernelProcess

UNPRIVILEGED_UID = 1000
SYSTEM_PYTHON = "/usr/bin/python3"


def _third_party() -> tuple[str, ...]:
    """The top-level modules of shoal-mcp's runtime dependencies and theirs (read from
    the installed metadata, so a new dependency is copied without a change here)."""
    from importlib import metadata

    by_dist: dict[str, list[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(dist.lower().replace("_", "-"), []).append(module)
    seen: set[str] = set()
    todo = ["shoal-mcp"]
    while todo:
        name = todo.pop()
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            dep = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    modules = {m for d in seen for m in by_dist.get(d, []) if not m.startswith("_")}
    return tuple(sorted(modules))


THIRD_PARTY = _third_party()
PACKAGE = Path(__file__).resolve().parents[2] / "src" / "shoal_mcp"
CLIENT_MODULE = "shoal_uid_client"


def setpriv(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def abi_problem(python: str = SYSTEM_PYTHON) -> str | None:
    """Why ``python`` cannot load the venv's compiled modules, or None."""
    if not os.access(python, os.X_OK):
        return f"{python} does not exist or is not executable"
    probe = "import sysconfig, sys; print(sysconfig.get_config_var('SOABI'), sys.version_info[:2])"
    got = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    ours = f"{sysconfig.get_config_var('SOABI')} {tuple(sys.version_info[:2])}"
    if got.returncode != 0 or got.stdout.strip() != ours:
        return f"{python} reports {got.stdout.strip() or got.stderr.strip()!r}, the venv {ours!r}"
    return None


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"), symlinks=False)


def build_runtime(dest: Path) -> Path:
    """A world-readable runtime in ``dest``: ``src/shoal_mcp`` and ``site/`` (third-party
    packages and the uid client).  Returns the ``PYTHONPATH`` value for it."""
    problem = abi_problem()
    if problem:
        raise RuntimeError(f"no unprivileged runtime: {problem}")
    _copy_tree(PACKAGE, dest / "src" / "shoal_mcp")
    site = dest / "site"
    site.mkdir(parents=True)
    for name in THIRD_PARTY:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"no unprivileged runtime: {name} is not importable here")
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            _copy_tree(origin.parent, site / name)
        else:  # a single-file module or extension
            shutil.copy2(origin, site / origin.name)
    shutil.copy2(Path(__file__).with_name("uid_client.py"), site / f"{CLIENT_MODULE}.py")
    for root, dirs, files in os.walk(dest):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            path = os.path.join(root, f)
            os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)
    os.chmod(dest, 0o755)
    return f"{dest / 'src'}:{site}"


def check_runtime(pythonpath: str, uid: int, home: Path) -> None:
    """The runtime imports the kernel and every dependency as ``uid``; raises otherwise."""
    imports = "import shoal_mcp.kernel.__main__, shoal_mcp.client, " + ", ".join(THIRD_PARTY)
    got = subprocess.run(
        [*setpriv(uid), SYSTEM_PYTHON, "-c", imports],
        env={"PYTHONPATH": pythonpath, "HOME": str(home), "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        raise RuntimeError(f"the unprivileged runtime does not import as uid {uid}: {got.stderr}")


def chown_tree(path: Path, uid: int) -> None:
    """``path`` and everything below it owned by ``uid`` (its gid = its uid)."""
    os.chown(path, uid, uid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


class UnprivilegedKernel(KernelProcess):
    """``python -m shoal_mcp.kernel`` as ``uid`` under ``setpriv``, from the runtime."""

    def __init__(self, tmp: Path, *args: str, uid: int, env: dict[str, str]) -> None:
        super().__init__(tmp, *args, env=env)
        self.uid = uid

    def start(self, wait: bool = True) -> UnprivilegedKernel:
        self.proc = subprocess.Popen(
            [
                *setpriv(self.uid),
                SYSTEM_PYTHON,
                "-m",
                "shoal_mcp.kernel",
                "--socket",
                str(self.socket),
                "--state-dir",
                str(self.state),
                *self.args,
            ],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if wait:
            self.wait_ready()
        return self


class UidCaller:
    """Kernel calls made as ``uid`` through a ``uid_client`` child (JSON lines)."""

    def __init__(self, socket_path: Path, uid: int, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*setpriv(uid), SYSTEM_PYTHON, "-m", CLIENT_MODULE, str(socket_path)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _send(self, req: dict) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"uid client exited {self.proc.poll()}")
        reply = json.loads(line)
        if "error" in reply:
            e = reply["error"]
            raise RpcError(e["code"], e["message"], e["data"])
        return reply["result"]

    def call(
        self,
        conn: str,
        session: str,
        token: str | None,
        method: str,
        params: dict,
        timeout: float,
    ) -> Any:
        req = {"conn": conn, "session": session, "token": token}
        return self._send({**req, "method": method, "params": params, "timeout": timeout})

    def close_conn(self, conn: str) -> None:
        self._send({"close": conn})

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
