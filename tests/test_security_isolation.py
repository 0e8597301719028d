"""Process isolation, live (issue 25): what a sandboxed principal can reach by uid, not path.

Landlock filters paths; these attacks go around paths: metadata calls, SysV and POSIX
IPC, unix sockets and descriptor passing, signals and ``/proc``, resource limits,
network families, the trusted base inside a write grant, secrets and the kernel's state
dir, other principals' temp dirs and stored outputs, the human's shared session, the
terminal.  Each runs through a real kernel, once as root and once as an unprivileged
uid (``setpriv``; tests/support/unprivileged.py), the attack code in
tests/support/isolation_probes.py run as an opaque ``python3`` program, so the analysis
lets it through and only the OS sandbox stands in the way.

Each case asserts the attack failed, checked on disk or on the wire by the test process
where that is possible, and, where meaningful, that the same probe succeeds for the
unconfined local human: the attack works, only the sandbox stops it.  Marked
``landlock``: fails, not skips, where Landlock exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import sandbox
from shoal_mcp.kernel.config.limits import SANDBOX_MAX_PROCS
from shoal_mcp.protocol.errors import RpcError
from tests.support.isolation_world import (
    KERNEL_SECRETS,
    STEER_NAMES,
    World,
    isolation_modes,
    isolation_world,
)
from tests.support.landlock import landlock_evidence
from tests.support.polling import wait_until
from tests.support.procfs import pids_with_arg
from tests.support.unprivileged import setpriv

pytestmark = pytest.mark.landlock

NOBODY = 65534


@pytest.fixture(scope="module", params=isolation_modes())
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    try:
        sandbox.landlock.abi_version()
    except sandbox.landlock.LandlockUnavailable as e:
        pytest.skip(f"{e} (evidence of Landlock: {landlock_evidence()})")
    with isolation_world(request.param) as w:
        yield w


def escaped(results: dict[str, dict]) -> dict[str, str]:
    """The cases whose attack succeeded, with what they did."""
    return {case: r["detail"] for case, r in results.items() if r["done"]}


def failed(results: dict[str, dict]) -> dict[str, str]:
    return {case: r["detail"] for case, r in results.items() if not r["done"]}


class Findings:
    """Everything wrong in one test, reported whole at the end (an escape list cut
    short by the first assertion would hide the rest from whoever fixes them)."""

    def __init__(self, world: World) -> None:
        self.mode = world.mode
        self.items: list[str] = []

    def contained(self, who: str, got: dict[str, dict], ignore: tuple[str, ...] = ()) -> None:
        for case, detail in escaped(got).items():
            if not case.startswith(ignore):
                self.items.append(f"ESCAPED [{self.mode}] {who} {case}: {detail}")

    def works(self, who: str, got: dict[str, dict]) -> None:
        """The unconfined proof: each case must succeed for ``who``."""
        for case, detail in failed(got).items():
            self.items.append(f"NOT A WORKING ATTACK [{self.mode}] {who} {case}: {detail}")

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.items.append(f"[{self.mode}] {what}")

    def done(self) -> None:
        assert not self.items, "\n" + "\n".join(self.items)


def _snapshot(path: Path) -> tuple:
    st = os.lstat(path)
    xattrs = tuple(sorted(os.listxattr(path, follow_symlinks=False)))
    return (st.st_mode, st.st_uid, st.st_mtime_ns, st.st_size, xattrs)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


# --- metadata ---------------------------------------------------------------------------


def _metadata_cases(meta: Path, uid: int) -> list[str]:
    return [
        f"chmod:{meta}/f640=777",
        f"chown:{meta}/f640={NOBODY if uid == 0 else uid}",
        f"utime:{meta}/f640",
        f"xattr:{meta}/f640",
        f"truncate:{meta}/g640",
        f"chmod:{meta}/idcopy=4755",
        f"rename:{meta}/g640={meta}/renamed",
        f"symlink:{meta}/link",
        f"mkfifo:{meta}/fifo",
        f"hardlink:{meta}/f640={meta.parent.parent}/proj/hardlink-{meta.name}",
    ]


def test_metadata_outside_the_write_grants(world: World) -> None:
    """chmod, chown, utime, xattrs, truncate, rename, links and fifos outside the
    write grants: the issue's 640 -> 777, mtime 2001, planted ``user.*`` xattr and the
    setuid root copy of ``id``."""
    f = Findings(world)
    meta = world.paths["out"] / "meta"
    before = {p.name: _snapshot(p) for p in meta.iterdir()}
    f.contained("agent:a", world.probe("agent:a", _metadata_cases(meta, world.uid)))
    after = {p.name: _snapshot(p) for p in meta.iterdir()}
    f.check(after == before, f"out/meta changed: {before} -> {after}")

    human = world.paths["out"] / "meta-human"
    f.works("human", world.probe("human", _metadata_cases(human, world.uid)))
    f.check(stat.S_IMODE(os.stat(human / "f640").st_mode) == 0o777, "the human's chmod")
    if world.mode == "root":  # the root escape: nobody runs it and is root
        ran = subprocess.run(
            [*setpriv(NOBODY), str(human / "idcopy")], capture_output=True, text=True, check=False
        )
        f.check("euid=0(root)" in ran.stdout, f"the setuid copy did not make root: {ran}")
    f.done()


def test_setuid_bits_inside_the_write_grants(world: World) -> None:
    """No setuid/setgid file can be made even where the agent may write: on the host's
    mount it would run with the kernel's uid (root) for anyone."""
    suid = world.paths["proj"] / "suid"
    ways = ["suid-chmod", "sgid-chmod", "suid-fchmod", "suid-fchmodat", "suid-fchmodat2",
            "suid-create", "suid-mknod", "file-caps"]  # fmt: skip
    f = Findings(world)
    f.contained("agent:a", world.probe("agent:a", [f"{w}:{suid}/{w}-agent" for w in ways]))
    bits = stat.S_ISUID | stat.S_ISGID
    planted = sorted(p.name for p in suid.iterdir() if p.stat().st_mode & bits)
    planted += [p.name for p in suid.iterdir() if "security.capability" in os.listxattr(p)]
    f.check(planted == [], f"setuid/setgid/file-capability files on disk: {planted}")
    human = [w for w in ways if w != "file-caps" or world.mode != "user"]  # needs CAP_SETFCAP
    f.works("human", world.probe("human", [f"{w}:{suid}/{w}-human" for w in human]))
    for p in suid.iterdir():
        p.unlink()
    f.done()


def test_state_dir_metadata_and_contents(world: World) -> None:
    """The state dir is neither readable, writable, listable nor chmod-able: the issue
    made ``tokens.key`` 0644, the state dir 0755, the journal 0666, and ``chmod 000`` on
    cas/ and spool/ broke every principal's exec."""
    state = world.kernel.state
    targets = {"tokens.key": "644", ".": "755", "journal.sqlite3": "666", "cas": "0", "spool": "0"}
    before = {t: stat.S_IMODE(os.stat(state / t).st_mode) for t in targets}
    cases = [f"chmod:{state / t}={m}" for t, m in targets.items()]
    cases += [f"read:{state}/tokens.key", f"read:{state}/tokens.json",
              f"read:{state}/journal.sqlite3", f"listdir:{state}", f"listdir:{state}/cas",
              f"listdir:{state}/spool", f"create:{state}/planted",
              f"unix-connect:{world.kernel.socket}", f"listdir:{world.kernel.socket.parent}"]  # fmt: skip
    f = Findings(world)
    f.contained("agent:a", world.probe("agent:a", cases))
    after = {t: stat.S_IMODE(os.stat(state / t).st_mode) for t in targets}
    f.check(after == before, f"state modes changed: {before} -> {after}")
    f.check(not (state / "planted").exists(), "state/planted created")
    f.check(world.text("agent:b", "after-state", "echo fine") == "fine\n", "exec broken")

    # The human reaches each (chmod to the mode it already has: proof, no damage).
    same = [f"chmod:{state / t}={before[t]:o}" for t in targets]
    f.works(
        "human",
        world.probe("human", same + [c for c in cases if c.startswith(("read:", "listdir:"))]),
    )
    f.done()


# --- secrets and other principals' files -----------------------------------------------


def test_home_secrets_are_hidden_even_under_a_home_read_grant(world: World) -> None:
    home = world.paths["home"]
    cases = [f"read:{home}/{rel}" for rel in
             (".ssh/id_ed25519", ".config/git/credentials", ".git-credentials", ".netrc",
              ".aws/credentials")] + [f"listdir:{home}/.ssh", f"listdir:{home}/.aws"]  # fmt: skip
    f = Findings(world)
    got = world.probe("agent:a", [*cases, f"read:{home}/.gitconfig"])
    f.check(got.pop(f"read:{home}/.gitconfig")["done"], "the home read grant does not work")
    f.contained("agent:a", got)
    f.works("human", world.probe("human", cases))
    f.done()


def test_environment_outside_env_read(world: World) -> None:
    """agent:tmp has no ``env_read`` grant: the values of the kernel's environment (a
    token the human had exported) stay out of its programs' reach, not only out of
    ``session.env``."""
    f = Findings(world)
    cases = [f"env-read:{name}" for name in KERNEL_SECRETS]
    f.contained("agent:tmp", world.probe("agent:tmp", cases))
    f.works("human", world.probe("human", cases))
    f.done()


def test_private_tmpdir_of_another_principal(world: World) -> None:
    """agent:tmp may write /tmp/**; neither it nor agent:a reaches agent:b's TMPDIR, its
    ``$SHOAL_OUT`` or the kernel's socket dir."""
    tmpdir, outputs = world.text(
        "agent:b",
        "tmpdir",
        'printf b-secret > "$TMPDIR/b-secret"; echo "$TMPDIR"; echo "$SHOAL_OUT"',
    ).split()
    assert Path(tmpdir, "b-secret").read_text() == "b-secret"
    world.exec("agent:b", "tmpdir", "echo b-output")
    wait_until(lambda: any(Path(outputs).iterdir()), timeout=15, what="b's $SHOAL_OUT")
    f = Findings(world)
    run = world.kernel.socket.parent
    cases = [f"read:{tmpdir}/b-secret", f"listdir:{tmpdir}", f"listdir:{outputs}",
             f"create:{tmpdir}/planted", f"create:{run}/planted", f"listdir:{run}"]  # fmt: skip
    for who in ("agent:tmp", "agent:a"):
        f.contained(who, world.probe(who, cases))
    f.check(not Path(tmpdir, "planted").exists(), "planted in b's TMPDIR")
    f.check(not (run / "planted").exists(), "planted in the kernel's socket dir")
    f.works("human", world.probe("human", [c for c in cases if not c.startswith("create:")]))
    f.done()


def test_stored_outputs_cannot_be_rewritten(world: World) -> None:
    """agent:a prints the same text as agent:b (one CAS blob), then rewrites, chmods,
    re-dates and unlinks its own ``$SHOAL_OUT`` copies: b's output stays what it was."""
    text = f"17 tests passed {secrets.token_hex(4)}\n"
    b_ref = world.exec("agent:b", "blob-b", f"printf '{text}'")["ref"]
    f = Findings(world)
    n = b_ref.split(":")[1]
    via_files = world.text("agent:b", "blob-b", f'cat "$SHOAL_OUT/{n}/out"')
    f.check(via_files == text, f"b's next exec reads {via_files!r} from $SHOAL_OUT/{n}/out")
    world.exec("agent:a", "blob-a", f"printf '{text}'")
    # The rewrite must be tried on something, else it proves nothing: wait for a's copy.
    wait_until(
        lambda: text in world.text("agent:a", "blob-a", 'cat "$SHOAL_OUT"/*/out 2>/dev/null'),
        timeout=15,
        what="agent:a's $SHOAL_OUT to hold its output",
    )
    f.contained("agent:a", world.probe("agent:a", ["shoal-out-rewrite"], session="blob-a"))
    raw = world.call(
        "agent:b", "blob-b", "value.get", {"ref": b_ref, "path": ".out", "format": "raw"}
    )
    f.check(raw["raw"] == text, f"b's stored output now reads {raw['raw']!r}")
    via_files = world.text("agent:b", "blob-b", f'cat "$SHOAL_OUT/{n}/out"')
    f.check(via_files == text, f"b's $SHOAL_OUT/{n}/out now reads {via_files!r}")
    f.done()


def test_orphan_cannot_write_into_later_outputs(world: World) -> None:
    """A detached child of agent:a keeps its exec's stdout and writes for seconds after
    the exec ended; nothing of it reaches the outputs of agent:b or the human."""
    marker = f"INJECTED-BY-A-{secrets.token_hex(4)}"
    world.probe("agent:a", [f"orphan-writer:{marker}"], session="orphan")
    outs = [world.text(who, f"victim-{who}", f"echo {who}-{i}")
            for i in range(4) for who in ("agent:b", "human")]  # fmt: skip
    assert outs == [f"{who}-{i}\n" for i in range(4) for who in ("agent:b", "human")], outs
    orphan = f"orphan-writer:{marker}"
    wait_until(lambda: not pids_with_arg(orphan), timeout=20, what="the orphan to be gone")


# --- IPC --------------------------------------------------------------------------------


def _key() -> int:
    return 0x5100_0000 + secrets.randbelow(0xFFFFFF)


def test_sysv_and_posix_ipc_are_private(world: World) -> None:
    """SysV shm/msg/sem, POSIX shm in /dev/shm and mqueues: the human's are out of an
    agent's reach; an agent's (held by a background task, or left behind by an ended
    exec) reach neither another agent nor the host."""
    k_human, k_held, k_left = _key(), _key(), _key()
    name = f"shoal-iso-{secrets.token_hex(4)}"
    made = world.probe("human", [f"sysv-create:{k_human}", f"posix-shm-create:{name}-h",
                                 f"mq-create:{name}-h"])  # fmt: skip
    f = Findings(world)
    f.works("human", made)
    try:
        reads = [f"sysv-read:{k_human}", f"posix-shm-read:{name}-h", f"mq-read:{name}-h"]
        f.contained("agent:a", world.probe("agent:a", reads))
        f.works("human", world.probe("human", reads))  # the human's own objects are there

        with world.background("agent:a", f"hold-sysv:{k_held}") as held:
            f.contained("agent:b", world.probe("agent:b", [f"sysv-read:{k_held}"]))
            f.contained("human", world.probe("human", [f"sysv-read:{k_held}"]))
        f.check(bool(held.outcome and held.outcome["done"]), f"a held nothing: {held.outcome}")

        # Left behind by an exec that ended (an agent's IPC may work inside its own
        # namespaces or not at all; either way it must not outlive them).
        world.probe("agent:a", [f"sysv-create:{k_left}", f"posix-shm-create:{name}-a",
                                f"mq-create:{name}-a"])  # fmt: skip
        later = [f"sysv-read:{k_left}", f"posix-shm-read:{name}-a", f"mq-read:{name}-a"]
        f.contained("agent:b", world.probe("agent:b", later))
        f.contained("human", world.probe("human", later))
        f.check(not Path(f"/dev/shm/{name}-a").exists(), "a's POSIX shm is in the host's /dev/shm")
        f.done()
    finally:
        world.probe("human", [f"sysv-remove:{k_human}", f"mq-remove:{name}-h",
                              f"sysv-remove:{k_left}", f"mq-remove:{name}-a"])  # fmt: skip
        Path(f"/dev/shm/{name}-h").unlink(missing_ok=True)
        Path(f"/dev/shm/{name}-a").unlink(missing_ok=True)


class UnixListeners:
    """An abstract and a pathname stream listener and a pathname datagram receiver,
    recording what reaches them."""

    def __init__(self, world: World) -> None:
        ipc = world.paths["out"] / "ipc"
        self.abstract = f"shoal-iso-{secrets.token_hex(6)}"
        self.stream_path = ipc / "stream.sock"
        self.dgram_path = ipc / "dgram.sock"
        self.accepted: list[str] = []
        self.socks = []
        for addr in ("\0" + self.abstract, str(self.stream_path)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(addr)
            s.listen(16)
            self.socks.append(s)
            threading.Thread(target=self._accept, args=(s, addr), daemon=True).start()
        self.dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dgram.bind(str(self.dgram_path))
        self.dgram.setblocking(False)
        world.owned(self.stream_path, self.dgram_path)

    def _accept(self, s: socket.socket, addr: str) -> None:
        while True:
            try:
                s.accept()[0].close()
            except OSError:
                return
            self.accepted.append("abstract" if addr.startswith("\0") else "path")

    def received(self) -> list[tuple[bytes, int]]:
        """Datagrams so far, with how many descriptors each carried (closed here)."""
        got = []
        while True:
            try:
                msg, anc, _, _ = self.dgram.recvmsg(256, socket.CMSG_SPACE(64))
            except BlockingIOError:
                return got
            fds = 0
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    for i in range(0, len(data) - len(data) % 4, 4):
                        os.close(int.from_bytes(data[i : i + 4], "little"))
                        fds += 1
            got.append((msg, fds))

    def close(self) -> None:
        for s in (*self.socks, self.dgram):
            s.close()
        for p in (self.stream_path, self.dgram_path):
            p.unlink(missing_ok=True)


@pytest.fixture
def unix_listeners(world: World) -> Iterator[UnixListeners]:
    u = UnixListeners(world)
    try:
        yield u
    finally:
        u.close()


def test_unix_sockets_and_descriptor_passing(world: World, unix_listeners: UnixListeners) -> None:
    """Abstract and pathname sockets, and the issue's descriptor theft: a socketpair's
    datagram end sent to a pathname socket with the exec's stdout attached."""
    u = unix_listeners
    cases = [f"abstract-connect:{u.abstract}", f"unix-connect:{u.stream_path}",
             f"dgram-send:{u.dgram_path}", f"dgram-pair-send:{u.dgram_path}",
             "socketpair-dgram"]  # fmt: skip
    f = Findings(world)
    f.contained("agent:a", world.probe("agent:a", cases))
    got = u.received()
    f.check(u.accepted == [], f"the agent connected to the listeners: {u.accepted}")
    f.check(got == [], f"the agent's datagrams arrived (message, fds passed): {got}")
    f.works("human", world.probe("human", cases))
    wait_until(lambda: len(u.accepted) >= 2, timeout=10, what="the human's connections")
    got = u.received()
    f.check(sorted(fds for _, fds in got) == [0, 1], f"the human's datagrams: {got}")
    f.done()


# --- signals, scheduling, /proc, ptrace ---------------------------------------------------

PROCESS_ATTACKS = ("kill0", "sigcont", "prlimit", "renice", "ionice", "taskset", "proc-files")


def _sleeper(world: World, who: str, marker: str) -> tuple[str, str, int]:
    session = f"sleeper-{who.replace(':', '-')}"
    task = world.exec(who, session, f"{'/usr/bin/python3'} -c 'import time; time.sleep(60)' {marker}",
                      background=True)["task"]  # fmt: skip
    wait_until(lambda: pids_with_arg(marker), timeout=30, what=f"{who}'s sleeper")
    return session, task, max(pids_with_arg(marker))


def test_signals_limits_and_proc_of_others(world: World) -> None:
    """kill, prlimit (the issue lowered the kernel's RLIMIT_NOFILE and SIGKILLed it
    with --cpu), renice, ionice, taskset and /proc of the kernel, of another principal's
    task and of the human's; ptrace, pidfd_getfd and process_vm_readv on the exec's own
    supervisor, its init, a child, the kernel."""
    mark_b, mark_h = f"sleeper-b-{secrets.token_hex(4)}", f"sleeper-h-{secrets.token_hex(4)}"
    b_session, b_task, b_pid = _sleeper(world, "agent:b", mark_b)
    h_session, h_task, h_pid = _sleeper(world, "human", mark_h)
    kpid = world.kernel.pid
    try:
        cases = [f"{a}:{pid}" for a in PROCESS_ATTACKS for pid in (kpid, b_pid, h_pid)]
        cases += [f"proc-scan:{m[::-1]}" for m in (mark_b, mark_h, "shoal_mcp.kernel")]
        cases += [f"foreign-fds:{world.kernel.state}"]
        cases += [f"{a}:{t}" for a in ("ptrace", "pidfd-getfd", "process-vm-readv")
                  for t in ("ppid", "1", "child", str(kpid), str(b_pid), str(h_pid))]  # fmt: skip
        f = Findings(world)
        f.contained("agent:a", world.probe("agent:a", cases))
        limits = Path(f"/proc/{kpid}/limits").read_text()
        human = [f"{a}:{kpid}" for a in PROCESS_ATTACKS] + [f"proc-scan:{mark_b[::-1]}"]
        human += [f"{a}:child" for a in ("ptrace", "pidfd-getfd", "process-vm-readv")]
        f.works("human", world.probe("human", human))
        f.check(Path(f"/proc/{kpid}/limits").read_text() == limits, "the kernel's limits moved")
        f.done()
    finally:
        world.call("agent:b", b_session, "task.cancel", {"task": b_task})
        world.call("human", h_session, "task.cancel", {"task": h_task})


def test_killing_its_own_init_harms_no_one_else(world: World) -> None:
    """An exec SIGTERMs and SIGKILLs pid 1 of its namespace (its init or zygote): the
    kernel, the same principal's next exec and another principal's go on."""
    world.probe("agent:a", ["kill-term:1", "sigcont:1"], session="init-killer")
    world.exec("agent:a", "init-killer", "kill -KILL 1; kill -TERM 1; true")
    f = Findings(world)
    for who, session in (("agent:a", "init-killer"), ("agent:a", "other"), ("agent:b", "x")):
        got = world.text(who, session, "echo alive")
        f.check(got == "alive\n", f"{who}/{session} after the init was killed: {got!r}")
    f.done()


def test_inotify_on_the_state_dir(world: World) -> None:
    """A watch on state/, cas/ and spool/ sees nothing of other principals' execs."""
    state = world.kernel.state
    dirs = ",".join(str(state / d) for d in ("", "cas", "spool", "tmp", "outputs"))
    with (
        world.background("agent:a", f"watch-inotify:{dirs}") as agent_watch,
        world.background("human", f"watch-inotify:{dirs}") as human_watch,
    ):
        for i in range(3):
            world.exec("agent:b", f"inotify-victim-{i}", f"seq {i} 20000")
            world.exec("human", f"inotify-victim-{i}", f"seq {i} 20000")
    f = Findings(world)
    f.contained("agent:a", {"watch-inotify": agent_watch.outcome or {"done": False}})
    f.works("human", {"watch-inotify": human_watch.outcome or {"done": False, "detail": "none"}})
    f.done()


# --- limits -------------------------------------------------------------------------------


def test_fork_bomb_and_rlimits(world: World) -> None:
    """A fork bomb stops at the tree's own bound (not the uid's), hard limits cannot be
    raised, and an exec that lowers its own RLIMIT_NOFILE harms nothing after it."""
    cases = [f"nproc-limit:{SANDBOX_MAX_PROCS}", f"fork-bomb:{SANDBOX_MAX_PROCS + 64}",
             "raise-limit:NOFILE", "raise-limit:NPROC", "lower-nofile"]  # fmt: skip
    f = Findings(world)
    got = world.probe("agent:a", cases)
    lowered = got.pop("lower-nofile")
    f.contained("agent:a", got)
    f.check(lowered["done"], f"lowering its own limit failed: {lowered}")
    f.check(world.text("agent:a", "probe-agent-a", "echo a") == "a\n", "agent:a's next exec")
    f.check(world.text("human", "after-bomb", "echo h") == "h\n", "the human's next exec")
    f.done()


def test_per_uid_limits_are_not_exhausted_for_others(world: World) -> None:
    """An agent holding every inotify instance it can get (``fs.inotify.max_user_instances``
    counts per uid) leaves the human able to make one."""
    limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    f = Findings(world)
    f.works("human", world.probe("human", ["inotify-init"]))  # the control: it can before
    with world.background("agent:a", f"hold-inotify:{limit + 16}") as held:
        got = world.probe("human", ["inotify-init"])
    f.check(got["inotify-init"]["done"], f"the human got none while agent:a held {held.ready_text}: "
            f"{got['inotify-init']['detail']}")  # fmt: skip
    f.check(bool(held.outcome and held.outcome["done"]), f"the agent's probe: {held.outcome}")
    f.done()


# --- network ------------------------------------------------------------------------------


class NetTargets:
    def __init__(self) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(64)
        self.tcp.settimeout(0.2)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.setblocking(False)
        self.tcp_port, self.udp_port = self.tcp.getsockname()[1], self.udp.getsockname()[1]

    def drain(self) -> tuple[int, int]:
        """(TCP connections, UDP datagrams) that arrived since the last call."""
        conns = grams = 0
        while True:
            try:
                self.tcp.accept()[0].close()
                conns += 1
            except OSError:
                break
        while True:
            try:
                self.udp.recv(64)
                grams += 1
            except BlockingIOError:
                break
        return conns, grams

    def close(self) -> None:
        self.tcp.close()
        self.udp.close()


def _mptcp_here() -> bool:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).close()
        return True
    except OSError:
        return False


def test_network_families(world: World) -> None:
    """No grant: TCP, MPTCP, UDP, /dev/tcp, raw and packet sockets, the host's
    interfaces and sockets through netlink and /proc/net, and ``listen()`` without
    ``bind()`` reachable from the host."""
    net = NetTargets()
    try:
        cases = [f"tcp-connect:{net.tcp_port}", f"mptcp-connect:{net.tcp_port}",
                 f"udp-send:{net.udp_port}", "raw-socket", "packet-socket", "netlink-links",
                 f"proc-net:{world.kernel.socket}={net.tcp_port}"]  # fmt: skip
        f = Findings(world)
        # A UDP sendto "works" into a private network namespace too: the datagram has
        # nowhere to go there.  Whether it left is what the receiver saw.
        f.contained("agent:a", world.probe("agent:a", cases), ignore=("udp-send",))
        devtcp = world.paths["proj"] / "devtcp.sh"  # a script: opaque, so it reaches the OS
        devtcp.write_text('echo hi > "/dev/tcp/127.0.0.1/$1"\n')
        world.owned(devtcp)
        world.exec("agent:a", "devtcp", f"bash {devtcp} {net.tcp_port}")
        with world.background("agent:a", "listen-nobind") as listener:
            if listener.ready_text:  # it listened: try to come in from the host
                try:
                    socket.create_connection(("127.0.0.1", int(listener.ready_text)), 2).close()
                except OSError:
                    pass
        f.contained("agent:a", {"listen-nobind": listener.outcome or {"done": False}})
        drained = net.drain()
        f.check(drained == (0, 0), f"(TCP connections, UDP datagrams) from the agent: {drained}")

        human = [c for c in cases if not c.startswith(("raw", "packet", "mptcp"))]
        human += ["raw-socket", "packet-socket"] if world.mode == "root" else []
        human += [f"mptcp-connect:{net.tcp_port}"] if _mptcp_here() else []
        f.works("human", world.probe("human", human))
        conns, grams = net.drain()
        f.check(conns >= 1 and grams == 1, f"the human's traffic: {conns} TCP, {grams} UDP")
        f.done()
    finally:
        net.close()


def test_network_with_a_tcp_grant(world: World, unix_listeners: UnixListeners) -> None:
    """agent:net may connect to one TCP port, through the egress proxy (issue 27): its
    tree still has a network namespace of its own, so a direct connect to the granted
    port finds no route, nor does another port, MPTCP, a listener, raw sockets or the
    host's abstract unix sockets; caps say ``proxy+netns``.  (tests/test_egress.py
    covers the proxy path itself.)"""
    assert world.granted is not None
    port = world.granted.getsockname()[1]
    net = NetTargets()
    try:
        f = Findings(world)
        cases = [f"tcp-connect:{port}", f"tcp-connect:{net.tcp_port}", f"mptcp-connect:{port}",
                 "raw-socket", "packet-socket", f"abstract-connect:{unix_listeners.abstract}",
                 f"dgram-send:{unix_listeners.dgram_path}", "socketpair-dgram"]  # fmt: skip
        got = world.probe("agent:net", cases)
        f.contained("agent:net", got)
        with world.background("agent:net", "listen-nobind") as listener:
            if listener.ready_text:
                try:
                    socket.create_connection(("127.0.0.1", int(listener.ready_text)), 2).close()
                except OSError:
                    pass
        f.contained("agent:net", {"listen-nobind": listener.outcome or {"done": False}})
        f.check(net.drain()[0] == 0, "a connection reached the ungranted port")
        f.check(unix_listeners.accepted == [], f"unix connections: {unix_listeners.accepted}")
        attach = {"session": "net-caps", "token": world.tokens["agent:net"]}
        caps = world.call("agent:net", "net-caps", "session.attach", attach)["caps"]["enforced"]
        f.check(caps.get("net") == "proxy+netns", f"caps for agent:net: {caps}")
        f.done()
    finally:
        net.close()


# --- the kernel surface -------------------------------------------------------------------

SURFACE = ["realtime", "nice-negative", "keyring", "bpf", "perf", "userfaultfd", "io-uring", "unshare-user",
           "setns-host:1", "open-by-handle:/etc/hostname", "dmesg", "sethostname",
           "open-wo:/proc/sysrq-trigger", "open-wo:/proc/sys/kernel/core_pattern"]  # fmt: skip


CGROUP_FILES = (
    "/sys/fs/cgroup/cgroup.procs",
    "/sys/fs/cgroup/pids/cgroup.procs",
    "/sys/fs/cgroup/pids/release_agent",
    "/sys/fs/cgroup/memory/release_agent",
)
"""Moving a process out of its cgroup, or the v1 ``release_agent`` escape: opened only."""


def test_kernel_surface_syscalls(world: World) -> None:
    """Keyrings, bpf, perf, userfaultfd, io_uring, nested namespaces and mounts, file
    handles (the "shocker" escape), the kernel log, the hostname, sysrq and core_pattern
    (opened only, never written)."""
    mnt = world.paths["proj"] / "mnt"
    mnt.mkdir(exist_ok=True)
    world.owned(mnt)
    cgroup = [f"open-wo:{p}" for p in CGROUP_FILES if os.path.exists(p)]
    f = Findings(world)
    f.contained("agent:a", world.probe("agent:a", [*SURFACE, *cgroup, f"mount-tmpfs:{mnt}"]))
    f.works("human", world.probe("human", ["perf", "unshare-user", "userfaultfd", "keyring"]))
    if world.mode == "root":
        root_only = ["open-by-handle:/etc/hostname", "dmesg", "realtime", "nice-negative"]
        f.works("human", world.probe("human", root_only))
    f.done()


# --- the trusted base ---------------------------------------------------------------------


def _trusted_targets(world: World) -> list[Path]:
    pkg, proj = world.paths["pkg"], world.paths["proj"]
    return [pkg / "kernel" / "exec" / "supervise.py", pkg / "__init__.py",
            pkg / "kernel" / "access" / "sandbox_run.py", world.paths["policy"],
            proj / ".git" / "config", proj / "repo" / ".git" / "config",
            proj / ".git" / "hooks" / "pre-commit", proj / "repo" / ".git" / "hooks" / "pre-commit",
            pkg / "kernel" / "exec" / "planted.py", world.paths["rt"] / "site" / "orjson" / "__init__.py",
            world.paths["rt"] / "site" / "sitecustomize.py"]  # fmt: skip


def _restore_git(repo: Path) -> None:
    swapped = repo / ".git-swapped"
    if swapped.exists():
        subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)
        swapped.rename(repo / ".git")


def test_trusted_base_inside_a_write_grant(world: World) -> None:
    """agent:a may write the runtime's tree, the policy's dir and the project: the
    package (the next supervisor would run it before confinement), the packages the
    kernel imports from its ``PYTHONPATH`` (and a ``sitecustomize`` there), the policy,
    and the hooks and config of the project's git work trees (and of a nested one) stay
    out of reach, also by moving ``.git`` aside and making a new one."""
    pkg, proj, site = world.paths["pkg"], world.paths["proj"], world.paths["rt"] / "site"
    targets = _trusted_targets(world)
    before = {t: _digest(t) for t in targets}
    saved = {t: (t.read_bytes(), t.stat().st_mode) for t in targets if t.is_file()}
    git_ids = {r: os.stat(r / ".git").st_ino for r in (proj, proj / "repo")}
    cases = [f"append:{pkg}/kernel/exec/supervise.py", f"replace:{pkg}/__init__.py",
             f"create:{pkg}/kernel/exec/planted.py", f"rename:{pkg}/kernel/access/sandbox_run.py"
             f"={pkg}/kernel/access/moved.py", f"append:{world.paths['policy']}",
             f"replace:{world.paths['policy']}",
             f"append:{proj}/.git/config", f"create:{proj}/.git/hooks/pre-commit",
             f"replace:{proj}/.git/config", f"append:{proj}/repo/.git/config",
             f"create:{proj}/repo/.git/hooks/pre-commit", f"git-swap:{proj}/repo",
             f"git-swap:{proj}", f"append:{site}/orjson/__init__.py",
             f"create:{site}/sitecustomize.py"]  # fmt: skip
    try:
        got = world.probe("agent:a", cases)
        after = {t: _digest(t) for t in targets}
        ids = {r: os.stat(r / ".git").st_ino for r in (proj, proj / "repo")}
    finally:  # an escape must not break the rest of the run: put everything back
        for repo in (proj, proj / "repo"):
            _restore_git(repo)
        moved = pkg / "kernel" / "access" / "moved.py"
        if moved.exists():
            moved.rename(pkg / "kernel" / "access" / "sandbox_run.py")
        for t, (data, mode) in saved.items():
            if _digest(t) != hashlib.sha256(data).hexdigest():
                t.write_bytes(data)
                t.chmod(mode)
                world.owned(t)
        (pkg / "kernel" / "exec" / "planted.py").unlink(missing_ok=True)
        (site / "sitecustomize.py").unlink(missing_ok=True)
    f = Findings(world)
    f.contained("agent:a", got)
    changed = sorted(str(t) for t in targets if after[t] != before[t])
    f.check(changed == [], f"changed on disk: {changed}")
    f.check(ids == git_ids, f".git replaced: {git_ids} -> {ids}")
    f.check(world.text("human", "after-trusted", "echo ok") == "ok\n", "the kernel broke")

    planted = [pkg / "human-planted.py", proj / ".git" / "hooks" / "human-hook",
               site / "human-planted.py"]  # fmt: skip
    f.works("human", world.probe("human", [f"create:{p}" for p in planted]))
    for p in planted:
        p.unlink(missing_ok=True)
    f.done()


# --- the human's session ------------------------------------------------------------------


def test_agent_does_not_steer_the_human_in_a_shared_session(world: World) -> None:
    """In a session the human shares, agent:a cds into its TMPDIR and writes a
    Makefile, exports PATH/GIT_CONFIG_*/LD_PRELOAD/BASH_ENV/PYTHON* (granted to it by
    name) and forges its reported cwd: none of it applies to the human's commands."""
    proj, steer = world.paths["proj"], world.paths["out"] / "steer"
    for name in ("git", "make"):
        fake = proj / "evilbin" / name
        fake.write_text(f"#!/bin/sh\ntouch {steer}/path-{name}\n")
        fake.chmod(0o755)
    (proj / "evilpy" / "sitecustomize.py").write_text(f"open('{steer}/pythonpath', 'w')\n")
    (proj / "evil-env.sh").write_text(f"touch {steer}/bash-env\n")
    (proj / "startup.py").write_text(f"open('{steer}/pythonstartup', 'w')\n")
    world.owned(*(proj / "evilbin").iterdir(), proj / "evilpy" / "sitecustomize.py",
                proj / "evil-env.sh", proj / "startup.py")  # fmt: skip
    exports = {
        "PATH": f"{proj}/evilbin:/usr/bin:/bin",
        "BASH_ENV": f"{proj}/evil-env.sh",
        "PYTHONPATH": f"{proj}/evilpy",
        "PYTHONSTARTUP": f"{proj}/startup.py",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.fsmonitor",
        "GIT_CONFIG_VALUE_0": f"touch {steer}/fsmonitor; false",
    }
    assert set(exports) <= set(STEER_NAMES)
    session = f"shared-{world.mode}"
    tmpdir = world.text(
        "agent:a", session,
        "cd \"$TMPDIR\" && printf 'all:\\n\\ttouch %s/make\\n' " + f"{steer} > Makefile && pwd",
    ).strip()  # fmt: skip
    world.exec("agent:a", session, " ".join(f"export {k}='{v}';" for k, v in exports.items()))
    human_src = (f"pwd; /usr/bin/make -s 2>/dev/null; git --version; /usr/bin/git -C {proj}/repo status -s; "
                 f"/usr/bin/python3 -c 'import os; print(os.environ.get(\"PYTHONPATH\"))'")  # fmt: skip
    first = world.text("human", session, human_src)
    world.exec("agent:a", session, f"PWD={world.paths['out']}/forged")
    second = world.text("human", session, "pwd")
    f = Findings(world)
    ran = sorted(p.name for p in steer.iterdir())
    f.check(ran == [], f"the human's commands ran the agent's payloads: {ran}")
    f.check(first.splitlines()[0] != tmpdir, f"the human's cwd is the agent's TMPDIR {tmpdir}")
    f.check(second.strip() != f"{world.paths['out']}/forged", "the forged cwd was applied")
    for p in steer.iterdir():
        p.unlink()

    # The payloads work: the human steering its own session runs every one of them.
    proof = f"steer-proof-{world.mode}"
    world.exec(
        "human",
        proof,
        f"cd {tmpdir}; " + " ".join(f"export {k}='{v}';" for k, v in exports.items()),
    )
    world.text("human", proof, human_src)
    ran = sorted(p.name for p in steer.iterdir())
    for p in steer.iterdir():
        p.unlink()
    f.check(ran == ["bash-env", "fsmonitor", "make", "path-git", "pythonpath"], f"proof: {ran}")
    f.done()


def test_reef_cache_is_per_principal(world: World) -> None:
    """One ``bash`` on both agents' PATH that prints what its caller's TMPDIR holds:
    agent:b's probe sees b's secret; agent:a's reef must come from a's own probe, not
    from a cache filled inside b's sandbox."""
    fake = world.paths["proj"] / "evilbin-shared"
    fake.mkdir(exist_ok=True)
    (fake / "bash").write_text(
        '#!/bin/sh\necho "fake $(cat "$TMPDIR/reef-secret" 2>/dev/null || echo none) 1"\n'
    )
    (fake / "bash").chmod(0o755)
    world.owned(fake, fake / "bash")
    secret = f"b-only-{secrets.token_hex(4)}"
    world.exec("agent:b", "reef-b", f'printf {secret} > "$TMPDIR/reef-secret"')
    versions = {}
    for who in ("agent:b", "agent:a"):
        session = f"reef-{who[-1]}"
        world.exec(who, session, f"export PATH={fake}:$PATH")
        got = world.call(who, session, "session.reef", {})
        versions[who] = next(t for t in got["tools"] if t["name"] == "bash").get("version")
    assert versions["agent:b"] == f"fake {secret} 1", versions  # the probe really ran in b
    assert versions["agent:a"] != versions["agent:b"], versions
    assert secret not in str(versions["agent:a"]), versions


# --- every kind of sandboxed tree ---------------------------------------------------------

APPROVAL_REQUIRED = -32011


def _core_cases(world: World) -> list[str]:
    """One attack per family, for the trees other than a plain exec."""
    state, out, proj = world.kernel.state, world.paths["out"], world.paths["proj"]
    return [f"read:{state}/tokens.key", f"listdir:{state}", f"chmod:{out}/meta/f640=777",
            f"utime:{out}/meta/f640", f"suid-chmod:{proj}/suid/core", f"kill0:{world.kernel.pid}",
            f"prlimit:{world.kernel.pid}", f"proc-scan:{'shoal_mcp.kernel'[::-1]}",
            f"read:{world.paths['home']}/.ssh/id_ed25519", "socketpair-dgram", "keyring",
            f"append:{world.paths['pkg']}/kernel/exec/supervise.py", "ptrace:ppid",
            "unshare-user", f"unix-connect:{world.kernel.socket}"]  # fmt: skip


def _via_pty(world: World, result: Path, cases: list[str]) -> None:
    script = str(world.paths["attacks"] / "isolation_probes.py")
    params = {"cmd": "/usr/bin/python3", "args": [script, str(result), *cases]}
    pty = world.call("agent:a", "tree-pty", "pty.open", params)["pty_id"]
    wait_until(result.exists, timeout=30, what="the PTY program's result")
    try:
        world.call("agent:a", "tree-pty", "pty.close", {"pty_id": pty})
    except RpcError:
        pass  # it had ended


def _via_plan_apply(world: World, result: Path, cases: list[str]) -> None:
    """agent:ask's command touches a path outside its grants: approved by the human,
    then applied (the whole source runs under plan.apply, in the sandbox widened by
    exactly that path: the probe's attacks are refused as in an exec)."""
    src = f"touch {world.paths['out']}/asked; " + world.probe_src(result, cases)
    with pytest.raises(RpcError) as exc:
        world.exec("agent:ask", "tree-plan", src)
    assert exc.value.code == APPROVAL_REQUIRED, exc.value
    ref = exc.value.data["plan_ref"]
    world.call("agent:ask", "tree-plan", "cap.request", {"plan_ref": ref})
    world.call("human", "approver", "cap.decide", {"plan_ref": ref, "approve": True})
    world.call("agent:ask", "tree-plan", "plan.apply", {"plan_ref": ref, "position": "value"})


def _via_reef(world: World, result: Path, cases: list[str]) -> None:
    """A ``bash`` planted on the session PATH runs the probe when reef asks its version."""
    fake = world.paths["proj"] / f"reef-{result.stem}"
    fake.mkdir()
    quoted = " ".join(f"'{c}'" for c in cases)
    (fake / "bash").write_text(
        f"#!/bin/sh\n/usr/bin/python3 {world.paths['attacks']}/isolation_probes.py {result} "
        f"{quoted} >/dev/null 2>&1\necho reef-attack 1\n"
    )
    (fake / "bash").chmod(0o755)
    world.owned(fake, fake / "bash")
    world.exec("agent:a", "tree-reef", f"export PATH={fake}:$PATH")
    world.call("agent:a", "tree-reef", "session.reef", {})


@pytest.mark.parametrize("tree", ["pty", "plan.apply", "reef"])
def test_every_sandboxed_tree_is_isolated(world: World, tree: str) -> None:
    """PTY programs, applied plans and reef probes get the same isolation as an exec."""
    meta = world.paths["out"] / "meta"
    before = _snapshot(meta / "f640")
    result = world.result_path()
    cases = _core_cases(world)
    {"pty": _via_pty, "plan.apply": _via_plan_apply, "reef": _via_reef}[tree](world, result, cases)
    wait_until(result.exists, timeout=30, what=f"the probe run by {tree}")
    f = Findings(world)
    f.contained(f"agent ({tree})", json.loads(result.read_text()))
    f.check(_snapshot(meta / "f640") == before, "out/meta/f640 changed")
    f.check(not (world.paths["proj"] / "suid" / "core").exists()
            or not os.stat(world.paths["proj"] / "suid" / "core").st_mode & stat.S_ISUID,
            "a setuid file in the project")  # fmt: skip
    if tree == "plan.apply":  # it ran; the approval granted exactly the named target (#26)
        f.check((world.paths["out"] / "asked").exists(), "the approved target was not granted")
    f.done()


# --- terminals ----------------------------------------------------------------------------


def test_terminal_injection_and_other_terminals(world: World) -> None:
    """TIOCSTI on the PTY the agent's program runs on, and opening another terminal of
    the same uid (one the test holds) read-write."""
    master, slave = os.openpty()
    other = os.ttyname(slave)
    world.owned(Path(other))
    try:
        outcomes = {}
        for who in ("agent:a", "human"):
            result = world.result_path()
            script = world.paths["attacks"] / "isolation_probes.py"
            pty = world.call(who, f"pty-{who.replace(':', '-')}", "pty.open", {
                "cmd": "/usr/bin/python3",
                "args": [str(script), str(result), "tiocsti", f"open-rw:{other}"],
            })["pty_id"]  # fmt: skip
            wait_until(result.exists, timeout=30, what=f"{who}'s PTY probe")
            world.call(who, f"pty-{who.replace(':', '-')}", "pty.close", {"pty_id": pty})
            outcomes[who] = json.loads(result.read_text())
        f = Findings(world)
        f.contained("agent:a", outcomes["agent:a"])
        f.works("human", outcomes["human"])
        f.done()
    finally:
        os.close(master)
        os.close(slave)


def test_caps_report_the_namespaces(world: World) -> None:
    enforced = world.call("agent:a", "caps", "ping", {})["kernel"]["sandbox"]["enforced"]
    assert {"user", "mnt", "pid", "ipc"} <= set(enforced["ns"]), enforced
    assert enforced["fs"].startswith("ro-root"), enforced
