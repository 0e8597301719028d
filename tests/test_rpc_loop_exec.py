"""A foreground exec started, watched and answered on the owner loop (rpc/loop_exec.py).

Live, on a real kernel. Each exec here is made when its session's ready shell waits, so
the loop takes it (``kernel.status`` ``execs_on_loop`` counts it, and each test checks
that count): the ways an exec's watch ends must be the thread path's ones, answered the
same way. The loop never waits: a database another process has locked sends the
exec's finalize to a worker, and the other clients go on meanwhile.
"""

from __future__ import annotations

import sqlite3
import threading

import pytest

from tests.support.kernel import close_client, running_kernel
from tests.support.polling import wait_until
from tests.support.wire import RawConn, jsonrpc_frame

SESSION = "loop"


@pytest.fixture(scope="module")
def kernel():
    with running_kernel(prefix="shle-") as kernel:
        yield kernel


@pytest.fixture(scope="module")
def client(kernel):
    c = kernel.client(SESSION)
    try:
        c.call("exec", {"src": "true"}, timeout=60)  # the session's first shell
        yield c
    finally:
        close_client(c)


def _status(client) -> dict:
    return client.call("kernel.status", timeout=30)


def _shell_waits(client) -> int:
    """Wait for the session's next ready shell (the only session here); the loop count.
    An exec that was not answered (timed out, hung up) made none: one exec makes it."""
    if _status(client)["warm"]["ready_waiting"] == 0:
        client.call("exec", {"src": "true"}, timeout=60)
    wait_until(lambda: _status(client)["warm"]["ready_waiting"] >= 1, timeout=30, interval=0.02)
    return _status(client)["execs_on_loop"]["started"]


def _finished_here(client) -> int:
    """Execs finalized on the loop so far (the rest were finalized on a worker)."""
    return _status(client)["execs_on_loop"]["finished"]


def test_an_exec_whose_shell_waits_is_run_on_the_loop(client) -> None:
    before = _shell_waits(client)
    finished = _finished_here(client)
    reply = client.call("exec", {"src": "echo hi; echo err >&2"}, timeout=60)
    assert reply["value"]["out"] == {"$": "str", "v": "hi\n"}, reply
    assert reply["value"]["ok"] is True and reply["ref"].startswith("out:")
    assert _status(client)["execs_on_loop"]["started"] == before + 1
    assert _finished_here(client) == finished + 1


def test_a_failure_on_the_loop_is_answered_like_on_a_thread(client) -> None:
    before = _shell_waits(client)
    with pytest.raises(Exception) as failed:  # stmt position: a failed command is -32002
        client.call("exec", {"src": "exit 3"}, timeout=60)
    assert getattr(failed.value, "code", None) == -32002, failed.value
    assert _status(client)["execs_on_loop"]["started"] == before + 1


def test_past_its_budget_on_the_loop_it_goes_on_as_a_task(client) -> None:
    before = _shell_waits(client)
    handle = client.call("exec", {"src": "sleep 0.5; echo late", "timeout_ms": 50}, timeout=60)
    assert handle["timed_out"] is True, handle
    assert _status(client)["execs_on_loop"]["started"] == before + 1
    listed = client.call("task.list", {}, timeout=10)["tasks"]
    assert handle["task"] in [t["task"] for t in listed]
    done = client.call("task.await", {"task": handle["task"], "timeout_ms": 20_000}, timeout=30)
    assert done["done"] is True and done["state"] == "completed", done
    value = client.call("value.get", {"ref": done["result_ref"]}, timeout=10)["value"]
    assert value["out"] == {"$": "str", "v": "late\n"}


def test_a_caller_that_hangs_up_on_the_loop_leaves_a_listed_task(kernel, client) -> None:
    before = _shell_waits(client)
    known = {t["task"] for t in client.call("task.list", {}, timeout=10)["tasks"]}
    gone = RawConn(kernel.socket, keep_frames=False)
    try:
        assert "result" in gone.call("session.attach", {"session": SESSION})
        gone.send_raw(jsonrpc_frame("exec", {"src": "sleep 0.5; echo after"}, "left"))
        wait_until(lambda: _status(client)["execs_on_loop"]["started"] == before + 1, timeout=30)
    finally:
        gone.close()

    def left_behind() -> list[dict]:
        tasks = client.call("task.list", {}, timeout=10)["tasks"]
        return [t for t in tasks if t["task"] not in known]

    (task,) = wait_until(left_behind, timeout=30, interval=0.05, what="the task left behind")
    done = client.call("task.await", {"task": task["task"], "timeout_ms": 20_000}, timeout=30)
    assert done["state"] == "completed", done
    value = client.call("value.get", {"ref": done["result_ref"]}, timeout=10)["value"]
    assert value["out"] == {"$": "str", "v": "after\n"}


def test_a_large_output_is_stored_whole_off_the_loop(client) -> None:
    size = 3 * 1024 * 1024  # past LOOP_FINALIZE_MAX_BYTES: finalized on a worker
    before = _shell_waits(client)
    finished = _finished_here(client)
    reply = client.call("exec", {"src": f"head -c {size} /dev/zero | tr '\\0' x"}, timeout=120)
    assert reply["value"]["ok"] is True, str(reply)[:300]
    assert _status(client)["execs_on_loop"]["started"] == before + 1
    assert _finished_here(client) == finished
    out = client.call("value.get", {"ref": reply["ref"]}, timeout=30)["value"]["out"]
    assert out["bytes"] == size and out["lines"] == 1, str(out)[:300]


def test_back_to_back_execs_wait_for_their_shell_on_the_loop(client) -> None:
    """Each exec's reply goes out before its session's next shell is made; the next
    exec, sent at once, waits for that shell on the loop (a callback, no thread) and
    runs there too."""
    before = _shell_waits(client)
    for n in range(20):
        reply = client.call("exec", {"src": f"echo {n}"}, timeout=60)
        assert reply["value"]["out"] == {"$": "str", "v": f"{n}\n"}, reply
    assert _status(client)["execs_on_loop"]["started"] == before + 20


def test_a_database_locked_by_another_process_stalls_no_client(kernel, client, tmp_path) -> None:
    """The exec starts on the loop; while it runs another process takes the database's
    write lock. Its finalize would wait for that lock: it goes to a worker instead, and
    the loop goes on answering another client meanwhile. Once the lock is let go the
    exec is stored and answered whole."""
    go, ran = tmp_path / "go", tmp_path / "ran"
    before = _shell_waits(client)
    finished = _finished_here(client)
    src = f"while [ ! -e {go} ]; do sleep 0.01; done; echo stored; touch {ran}"
    replies: list = []
    caller = threading.Thread(
        target=lambda: replies.append(client.call("exec", {"src": src}, timeout=120))
    )
    other = kernel.client("loop-other")
    lock = sqlite3.connect(kernel.state / "journal.sqlite3", isolation_level=None)
    try:
        caller.start()
        wait_until(lambda: _status(other)["execs_on_loop"]["started"] == before + 1, timeout=30)
        lock.execute("BEGIN IMMEDIATE")  # another process's write lock, held
        go.touch()
        wait_until(ran.exists, timeout=30, what="the command's end")
        for _ in range(20):  # the loop answers while the exec's finalize waits
            assert other.call("ping", timeout=10)["pong"] is True
        assert caller.is_alive() and not replies, "answered while the database was locked"
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        caller.join(timeout=120)
        close_client(other)
    (reply,) = replies
    assert reply["value"]["out"] == {"$": "str", "v": "stored\n"}, reply
    assert _finished_here(client) == finished  # finalized on a worker
