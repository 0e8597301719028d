"""Who may preempt the owner loop (docs/decisions.md, "Foreground execs on the owner loop").

Every agent waits on the kernel's owner loop, so the processes it wakes (a facade with
its reply, an exec supervisor with its next job) run as ``SCHED_BATCH``: the same share
of the CPU, but their wake-ups do not preempt it. The commands the supervisors run are
scheduled as they always were (``SCHED_OTHER``), and so is the kernel. Live: a real
kernel and facade, the policies read from ``/proc``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import close_client, running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import children, is_exec_supervisor, stat_fields

SCHED_OTHER = 0
SCHED_BATCH = 3
POLICY_FIELD = 41  # of /proc/PID/stat (man 5 proc)


def _policy(path: str) -> int | None:
    """The scheduling policy of ``/proc/<path>`` (a pid, or ``pid/task/tid``)."""
    fields = stat_fields(path)
    return None if fields is None else int(fields[POLICY_FIELD - 3])  # from the state on


@pytest.fixture(scope="module")
def kernel():
    with running_kernel(prefix="shsp-") as kernel:
        yield kernel


def test_supervisors_yield_and_the_command_is_scheduled_as_ever(kernel) -> None:
    client = kernel.client("sched")
    try:
        reply = client.call("exec", {"src": "awk '{print $41}' /proc/self/stat"}, timeout=60)
    finally:
        close_client(client)
    assert reply["value"]["out"] == {"$": "str", "v": f"{SCHED_OTHER}\n"}, reply
    supervisors = [pid for pid in children(kernel.pid) if is_exec_supervisor(pid)]
    assert supervisors, "no exec supervisor (warm zygote) under the kernel"
    assert {_policy(str(pid)) for pid in supervisors} == {SCHED_BATCH}
    assert _policy(str(kernel.pid)) == SCHED_OTHER  # the kernel is not the one that yields


def test_every_thread_of_the_facade_yields(kernel) -> None:
    facade = RawFacade(facade_env(kernel, "sched-facade"))
    try:
        facade.initialize()
        threads = wait_until(
            lambda: [f"{facade.pid}/task/{tid}" for tid in _tids(facade.pid)],
            timeout=30,
            what="the facade's threads",
        )
        assert len(threads) > 1  # its readers had started: they inherit the policy
        policies = {_policy(t) for t in threads} - {None}  # None: a thread that ended since
        assert policies == {SCHED_BATCH}
    finally:
        facade.close()


def _tids(pid: int) -> list[str]:
    try:
        return sorted(p.name for p in Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return []
