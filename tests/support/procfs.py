"""Readings from ``/proc``: process state, children, groups, fds, threads, memory, argv.

Linux only, like the kernel's own process handling. Every reader tolerates a process
that disappears between listing ``/proc`` and reading its files.
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

from shoal_mcp.kernel.exec.ready import GO_FD as READY_GO_FD


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: [state, ppid, pgrp, session, tty_nr,
    tpgid, ...]; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def proc_state(pid: int) -> str | None:
    """The state letter (R, S, T, Z…), or None when gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def proc_gone(pid: int) -> bool:
    """True once ``pid`` no longer exists at all (reaped: not even a zombie)."""
    return proc_state(pid) is None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    state = proc_state(pid)
    return state is not None and state != "Z"


def proc_comm(pid: int) -> str | None:
    """The command name (``/proc/PID/comm``), or None when gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def proc_ids(pid: int) -> dict[str, int]:
    """ppid, process group, session, controlling tty and its foreground group."""
    fields = stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    names = ("ppid", "pgrp", "session", "tty_nr", "tpgid")
    return dict(zip(names, map(int, fields[1:6]), strict=True))


def children(pid: int) -> list[int]:
    """Pids of every direct child of ``pid`` (zombies included)."""
    return [p for p in _pids() if (f := stat_fields(p)) and int(f[1]) == pid]


SUPERVISOR_SCRIPT = "supervise.py"
"""The supervisor programs (kernel/exec/supervise.py; kernel/pty/supervise.py for a PTY's
program): their processes sit between the kernel and the commands it runs
(docs/architecture.md, Processes)."""


def argv_of(pid: int | str) -> list[bytes]:
    """``pid``'s argv; empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def is_exec_supervisor(pid: int) -> bool:
    return any(arg.endswith(SUPERVISOR_SCRIPT.encode()) for arg in argv_of(pid))


def is_waiting_ready_shell(pid: int | str) -> bool:
    """A bash the kernel started ahead for a session's next exec (kernel/exec/ready.py)
    that has not been given a source: its loader still holds the go pipe open."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        return b"__shoal_go" in argv and os.path.exists(f"/proc/{pid}/fd/{READY_GO_FD}")
    except OSError:
        return False


def kernel_commands(kernel_pid: int) -> list[int]:
    """The processes the kernel runs for its callers, zombies included: below the kernel
    and its exec supervisors, the first process that is not a supervisor (each exec's
    bash, which leads its own process group; a PTY's program).  What ``children`` meant
    before exec supervisors: empty once every command is gone and reaped.  A ready shell
    still waiting for a source runs nothing for anyone and is not counted (bounded by
    ``READY_SHELLS_MAX``, gone after ``WARM_POOL_IDLE_S``)."""
    parent: dict[int, list[int]] = {}
    for pid in _pids():
        fields = stat_fields(pid)
        if fields:
            parent.setdefault(int(fields[1]), []).append(pid)
    found: list[int] = []
    todo = [kernel_pid]
    while todo:
        for child in parent.get(todo.pop(), []):
            if is_exec_supervisor(child):
                todo.append(child)
            elif not is_waiting_ready_shell(child):
                found.append(child)
    return found


def zombies(pid: int) -> list[int]:
    """Direct children of ``pid`` that exited and were not reaped."""
    return [p for p in children(pid) if proc_state(p) == "Z"]


def pgid_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    return [p for p in _pids() if (f := stat_fields(p)) and int(f[2]) == pgid and f[0] != "Z"]


def pgid_gone(pgid: int) -> bool:
    """True when no process (zombies included) is left in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` if it still exists (cleanup after a failed test)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def pids_with_arg(arg: str) -> list[int]:
    """Pids whose argv contains ``arg`` as one exact argument (a per-test marker)."""
    needle = arg.encode()
    return [pid for pid in _pids() if needle in argv_of(pid)]


def kill_pids(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fd_count(pid: int) -> int:
    """Open file descriptors of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def status_field(pid: int, name: str) -> int:
    """A numeric field of ``/proc/PID/status`` (the first number: kB for memory)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise KeyError(name)


def threads(pid: int) -> int:
    return status_field(pid, "Threads")


def rss_kib(pid: int) -> int:
    """Resident set size now, in KiB."""
    return status_field(pid, "VmRSS")


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set size (VmHWM), in KiB."""
    return status_field(pid, "VmHWM")


def reset_peak_rss(pid: int) -> None:
    """Set ``pid``'s VmHWM back to its current RSS (``clear_refs`` 5, Linux >= 4.0), so a
    later VmHWM reading is the peak of what happened since."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_growth_kib(pid: int, base_rss_kib: int) -> int:
    """Peak RSS since the last ``reset_peak_rss`` above ``base_rss_kib`` (its RSS then)."""
    return vm_hwm_kib(pid) - base_rss_kib


def sleep_marker() -> str:
    """A ``sleep`` duration no other process on the machine uses: its argv names it, so
    ``pids_with_arg`` finds exactly the processes a test started."""
    return f"300.{secrets.randbelow(10**8):08d}"


def alive_with_marks(marks: list[str]) -> list[int]:
    """Pids of the processes started with any of ``marks``: the ``sleep`` processes, and
    a ``setsid`` or ``nohup`` that has not exec'd its ``sleep`` yet."""
    return [p for m in marks for p in pids_with_arg(m)]


def sleeping_with_marks(marks: list[str]) -> list[int]:
    """Pids of the processes with any of ``marks`` that are ``sleep`` already: a
    ``setsid sleep`` found by its mark before the exec may not have left its session."""
    return [p for p in alive_with_marks(marks) if _program(argv_of(p)) == b"sleep"]


def _program(argv: list[bytes]) -> bytes:
    """The file name of argv[0] (empty for a process that is gone)."""
    return argv[0].rsplit(b"/", 1)[-1] if argv else b""


def descendants_of(root: int) -> set[int]:
    """Every live pid whose chain of parents reaches ``root`` (``root`` excluded)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(entry)):
            parent[int(entry)] = int(fields[1])
    found = set()
    for pid in parent:
        p, hops = pid, 0
        while p in parent and hops < 4096:  # a bound in case pids were reused mid-walk
            p, hops = parent[p], hops + 1
            if p == root:
                found.add(pid)
                break
    return found
