"""ClosedFlag: a connection's "closed" as a flag and as an fd a select() can wait on."""

import select
import threading

from shoal_mcp.kernel.rpc.closed_flag import ClosedFlag


def readable(flag: ClosedFlag, timeout: float = 0.0) -> bool:
    ready, _, _ = select.select([flag.fileno()], [], [], timeout)
    return bool(ready)


def test_the_fd_is_readable_exactly_once_set_and_stays_so():
    flag = ClosedFlag()
    assert not flag.is_set() and not readable(flag)
    flag.set()
    flag.set()  # a second set changes nothing
    assert flag.is_set() and flag.wait(0)
    assert readable(flag) and readable(flag)  # level-triggered: every waiter sees it


def test_a_select_blocked_on_the_fd_wakes_when_another_thread_sets_it():
    flag = ClosedFlag()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(readable(flag, timeout=60)))
    waiter.start()
    flag.set()
    waiter.join(30)
    assert woke == [True]


def test_the_fd_is_closed_with_the_flag():
    import os

    flag = ClosedFlag()
    fd = flag.fileno()
    os.fstat(fd)
    del flag
    try:
        os.fstat(fd)
    except OSError:
        return
    raise AssertionError(f"fd {fd} still open after the flag was dropped")
