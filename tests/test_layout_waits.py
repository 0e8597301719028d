"""No sleep or timeout-poll loop on the request path (issue 30).

A wait that wakes every so often to look whether something happened costs a wake-up
per period and answers up to a period late; a wait on the thing itself (an fd in
``select()``, an event, a future) costs neither. This test finds the polling forms in
``src/`` but the human CLI (``cli/``: a terminal program's waits, not the request
path; the owner loop does not reach it) (a ``time.sleep``, a socket timeout, a ``.wait`` on a literal number, a knob
named ``*_POLL_S``/``*_SLICE_S``/``*_RETRY_S``) and holds them to the list below: each
allowed one is named with why it stays. A new one fails the test, and so does an
allowance that no longer matches anything (the list cannot go stale).
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "shoal_mcp"

POLLING = re.compile(
    r"time\.sleep\("
    r"|\.settimeout\((?!None\))"
    r"|\.wait\(\s*[0-9.]"
    r"|\b(?:[A-Z][A-Z0-9_]*_)?(?:POLL|SLICE|RETRY)_S\b(?!\s*[:=])"
)
"""The polling forms; a knob's own definition (``NAME = …``) is not a use."""

ALLOWED: dict[tuple[str, str], str] = {
    # The CLI and the client start a kernel and wait for its socket to appear: nothing
    # to wait on before the kernel exists. Not the kernel's request path.
    ("client.py", "time.sleep("): "autostart: waiting for a kernel's socket to appear",
    ("client.py", "AUTOSTART_POLL_S"): "autostart: waiting for a kernel's socket",
    ("client.py", ".settimeout("): "a client call's own deadline on its socket",
    # The kernel.
    ("kernel/rpc/server.py", ".settimeout("): (
        "a deadline for the pre-attach read, and for a refusal sent to a peer that does"
        " not read: timeouts on one operation, not a loop that looks again"
    ),
    ("kernel/rpc/loop_reading.py", "CPU_WAIT_SLICE_S"): (
        "a timer on the owner loop, not a wait: a connection paused for its principal's"
        " CPU rate is looked at again after a slice (a policy reload may lift the limit)"
    ),
    ("kernel/exec/spool_relay.py", "time.sleep("): (
        "in the supervisor process, not the kernel: a full disk is retried until the"
        " output's deadline"
    ),
    ("kernel/exec/spool_relay.py", "RETRY_S"): "the supervisor's full-disk retry (above)",
    ("kernel/exec/supervise.py", "RETRY_S"): "the supervisor's full-disk retry (above)",
    ("kernel/access/namespaces.py", "time.sleep("): (
        "a relay's cgroup is removed once its last process is reaped, a few tries apart;"
        " the next kernel removes a leftover"
    ),
    ("kernel/pty/terminal.py", "time.sleep("): (
        "closing a PTY where os.pidfd_open is missing or refused: its supervisor's exit is"
        " looked for every so often (as Popen.wait does), with no lock held"
    ),
    ("kernel/exec/runner.py", ".wait(0"): (
        "check_exit: a read of what a readable report socket already holds, timeout 0: never a wait"
    ),
    ("kernel/exec/keeper.py", ".wait(0"): (
        "a discarded ready shell's report, read once its socket is readable, timeout 0:"
        " never a wait"
    ),
    ("kernel/pty/screen_io.py", "PTY_IDLE_POLL_S"): (
        "only where os.pidfd_open is missing (not Linux): a PTY's reader then looks every"
        " so often for a program that ended while something else holds the tty; and once"
        " the terminal is closed, the period at which the wait on the program's pidfd"
        " looks whether the PTY is being closed"
    ),
    # The facade.
    ("facade/mcp_tasks.py", "MCP_TASK_RESULT_POLL_S"): (
        "a tasks/result waiting for a task also looks whether its own call was cancelled"
    ),
    ("facade/client_requests.py", "MCP_TASK_RESULT_POLL_S"): (
        "an elicitation waiting for the client's answer looks whether its call was cancelled"
    ),
    ("facade/inflight.py", "time.sleep("): (
        "a cancel that overtook its exec at the kernel is asked again, briefly"
    ),
    ("facade/inflight.py", "CANCEL_RETRY_S"): "the same",
}


def _normalized(found: str) -> str:
    return ".wait(0" if found.startswith(".wait(") else found


def polling_sites() -> dict[tuple[str, str], list[int]]:
    sites: dict[tuple[str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("cli/"):
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for match in POLLING.finditer(code):
                if code.lstrip().startswith(("import ", "from ")):
                    continue
                sites.setdefault((rel, _normalized(match.group(0))), []).append(lineno)
    return sites


def test_no_polling_outside_the_named_exceptions():
    sites = polling_sites()
    new = {site: lines for site, lines in sites.items() if site not in ALLOWED}
    assert not new, f"a sleep or timeout-poll on the request path: {new}"


def test_every_allowance_still_matches_a_site():
    stale = sorted(set(ALLOWED) - set(polling_sites()))
    assert not stale, f"allowed polling that no longer exists (drop it from ALLOWED): {stale}"


def test_the_detector_sees_each_polling_form():
    samples = {
        "time.sleep(0.1)": "time.sleep(",
        "sock.settimeout(ACCEPT_WAIT)": ".settimeout(",
        "done.wait(0.25)": ".wait(0",
        "step = DISCONNECT_POLL_S": "DISCONNECT_POLL_S",
        "cond.wait(min(debt, CPU_WAIT_SLICE_S))": "CPU_WAIT_SLICE_S",
        "time.monotonic() + RETRY_S": "RETRY_S",
    }
    for line, form in samples.items():
        assert [m.group(0) for m in POLLING.finditer(line)] == [form], line
    for quiet in ("sock.settimeout(None)", "DISCONNECT_POLL_S = 0.25", "event.wait(timeout)"):
        assert not POLLING.search(quiet), quiet
