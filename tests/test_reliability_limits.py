"""Resource limits (issue #9): many tasks, many transcript values, a subscription
storm. The kernel must reap every child, keep fds and threads flat and its memory
bounded. Counts come from /proc of the live kernel; no wall-clock asserts.
"""

from __future__ import annotations

import threading

import pytest

from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import fd_count, kernel_commands, rss_kib, threads, zombies
from tests.support.wire import RawConn

TASKS = 1000
TASK_BATCH = 32  # under the local principal's max_tasks (64) running at once
VALUES = 10_000
CONNECTIONS = 4
WINDOW = 8
STORM_CYCLES = 2000
# fds/threads that may legitimately differ between two idle moments: the bounded SQLite
# pool (Database.MAX_OPEN = 8 connections, db + wal fd each) warms up lazily.
FD_SLACK = 20
THREAD_SLACK = 2
# 10,000 execs: the values live in SQLite on disk, nothing per finished exec stays in
# the kernel's memory. What may still grow is bounded: SQLite's page cache (default
# 2 MiB per connection × 8 pooled connections + the event store's) and allocator
# slack. A per-exec leak of even 3 KiB would be ~30 MiB here.
RSS_BOUND_KIB = 24 * 1024


@pytest.fixture
def kernel():
    """A fresh kernel per test: each measures its own baseline."""
    with running_kernel() as k:
        yield k


def _idle(pid: int) -> tuple[int, int]:
    wait_until(lambda: not kernel_commands(pid), timeout=60, interval=0.1)
    return fd_count(pid), threads(pid)


def _settled(pid: int, fds0: int, thr0: int) -> tuple[int, int]:
    def ok():
        now = (fd_count(pid), threads(pid))
        return (
            now
            if not kernel_commands(pid)
            and now[0] <= fds0 + FD_SLACK
            and now[1] <= thr0 + THREAD_SLACK
            else None
        )

    try:
        return wait_until(ok, timeout=60, interval=0.1)
    except AssertionError:
        raise AssertionError(
            f"kernel did not settle: fds {fds0} -> {fd_count(pid)}, threads {thr0} -> "
            f"{threads(pid)}, children {kernel_commands(pid)}"
        ) from None


def test_thousand_background_tasks_all_reaped(kernel):
    pid = kernel.pid
    with RawConn(kernel.socket) as conn:
        assert "result" in conn.call("session.attach", {"session": "tasks"})
        assert "result" in conn.call("exec", {"src": "true", "background": True})
        fds0, thr0 = _idle(pid)
        seen_zombies = 0
        peak_children = 0
        created = 0
        task_ids: list[str] = []
        while created < TASKS:
            batch = [
                conn.send("exec", {"src": "true", "background": True})
                for _ in range(min(TASK_BATCH, TASKS - created))
            ]
            handles = [conn.wait(i) for i in batch]
            assert all("result" in h for h in handles), [h for h in handles if "result" not in h][
                :3
            ]
            created += len(handles)
            peak_children = max(peak_children, len(kernel_commands(pid)))
            waits = [
                conn.send("task.await", {"task": h["result"]["task"], "timeout_ms": 30000})
                for h in handles
            ]
            for w in waits:
                record = conn.wait(w)["result"]
                assert record["done"] and record["state"] == "completed", record
                task_ids.append(record["task"])
            seen_zombies = max(seen_zombies, len(zombies(pid)))
        assert len(set(task_ids)) == TASKS
        listed = conn.call("task.list", {"state": "completed"})["result"]["tasks"]
        assert len(listed) >= TASKS
        fds1, thr1 = _settled(pid, fds0, thr0)
        assert zombies(pid) == []
    print(
        f"\n{TASKS} background tasks: kernel fds {fds0} -> {fds1}, threads {thr0} -> {thr1}, "
        f"children at end {len(kernel_commands(pid))}, peak children seen {peak_children}, "
        f"zombies seen at batch ends (transient) {seen_zombies}"
    )


def _exec_many(socket, total: int) -> None:
    conns = [RawConn(socket) for _ in range(CONNECTIONS)]
    errors: list = []
    try:
        for c in conns:
            assert "result" in c.call("session.attach", {"session": "values"})

        def worker(c: RawConn, n: int) -> None:
            pending: list[int] = []
            try:
                for _ in range(n):
                    pending.append(c.send("exec", {"src": "true"}))
                    if len(pending) >= WINDOW:
                        reply = c.wait(pending.pop(0))
                        if "result" not in reply:
                            errors.append(reply)
                for p in pending:
                    reply = c.wait(p)
                    if "result" not in reply:
                        errors.append(reply)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))

        per = total // CONNECTIONS
        ths = [threading.Thread(target=worker, args=(c, per)) for c in conns]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
    finally:
        for c in conns:
            c.close()
    assert errors == [], errors[:3]


def test_ten_thousand_transcript_values_memory_bounded(kernel):
    pid = kernel.pid
    _exec_many(kernel.socket, 400)  # warm: pool, page caches, parsers
    fds0, thr0 = _idle(pid)
    rss0 = rss_kib(pid)
    _exec_many(kernel.socket, VALUES)
    fds1, thr1 = _settled(pid, fds0, thr0)
    rss1 = rss_kib(pid)
    with RawConn(kernel.socket) as c:
        c.call("session.attach", {"session": "values"})
        last = c.call("value.get", {"ref": f"out:{VALUES + 400}", "path": ".status"})
        assert last["result"]["value"] == {"$": "int", "v": 0}, last
        assert "error" in c.call("value.get", {"ref": f"out:{VALUES + 401}"})
    print(
        f"\n{VALUES} transcript values: kernel VmRSS {rss0} -> {rss1} KiB (+{rss1 - rss0}), "
        f"fds {fds0} -> {fds1}, threads {thr0} -> {thr1}"
    )
    assert rss1 - rss0 < RSS_BOUND_KIB


def test_subscription_storm(kernel):
    pid = kernel.pid
    with RawConn(kernel.socket) as pub, RawConn(kernel.socket) as sub:
        for c in (pub, sub):
            assert "result" in c.call("session.attach", {"session": "storm"})
        # Warm the event bus (rings, the durable store) before the baseline.
        s = sub.call("events.subscribe", {"channel": "user.warm"})["result"]["subscription"]
        pub.call("events.publish", {"channel": "user.warm", "payload": {"i": 0}})
        sub.call("events.unsubscribe", {"subscription": s})
        fds0, thr0 = _idle(pid)
        rss0 = rss_kib(pid)
        for i in range(STORM_CYCLES):
            channel = f"user.storm.{i % 300}"  # more channels than the kernel keeps rings for
            ids = [
                sub.send("events.subscribe", {"channel": channel}),
                sub.send("events.subscribe", {"channel": "user.shared"}),
            ]
            subs = [sub.wait(x)["result"]["subscription"] for x in ids]
            p = [
                pub.send("events.publish", {"channel": c, "payload": {"i": i, "pad": "x" * 200}})
                for c in (channel, "user.shared", "user.nobody")
            ]
            for x in p:
                assert "result" in pub.wait(x)
            un = [sub.send("events.unsubscribe", {"subscription": s}) for s in subs]
            for x in un:
                assert "result" in sub.wait(x)
        # Subscriptions left open on connections that then vanish.
        for _ in range(50):
            with RawConn(kernel.socket) as gone:
                gone.call("session.attach", {"session": "storm"})
                for k in range(5):
                    gone.call("events.subscribe", {"channel": f"user.left.{k}"})
                pub.call("events.publish", {"channel": "user.left.0", "payload": {}})
        pub.call("events.publish", {"channel": "user.shared", "payload": {"last": True}})
        fds1, thr1 = _settled(pid, fds0, thr0)
        rss1 = rss_kib(pid)
    print(
        f"\nsubscription storm ({STORM_CYCLES} cycles x 2 subscriptions, 3 publishes each, "
        f"250 abandoned): threads {thr0} -> {thr1}, fds {fds0} -> {fds1}, VmRSS {rss0} -> {rss1} KiB"
    )
    assert thr1 <= thr0 + THREAD_SLACK
    # Rings are bounded (256 channels × 1,024 events of ~300 bytes at worst); allow that.
    assert rss1 - rss0 < 96 * 1024


def test_subscription_storm_through_the_facade(kernel):
    pid = kernel.pid
    pipe = McpPipe(facade_env(kernel, "storm-mcp"))
    try:
        pipe.initialize()
        with RawConn(kernel.socket) as pub:
            pub.call("session.attach", {"session": "storm-mcp"})
            assert "result" in pipe.request(
                "resources/subscribe", {"uri": "shoal://events/user.warm"}
            )
            assert "result" in pipe.request(
                "resources/unsubscribe", {"uri": "shoal://events/user.warm"}
            )
            fds0, thr0 = _idle(pid)
            for i in range(300):
                uri = f"shoal://events/user.mcp.{i % 20}"
                assert "result" in pipe.request("resources/subscribe", {"uri": uri})
                pub.call("events.publish", {"channel": f"user.mcp.{i % 20}", "payload": {"i": i}})
                assert "result" in pipe.request("resources/unsubscribe", {"uri": uri})
            # After unsubscribing, publishing no longer reaches the client.
            before = len(pipe.notifications)
            pub.call("events.publish", {"channel": "user.mcp.0", "payload": {"late": True}})
            assert "result" in pipe.request("ping", {})
            late = [
                n
                for n in pipe.notifications[before:]
                if n.get("params", {}).get("uri") == "shoal://events/user.mcp.0"
            ]
            assert late == []
            fds1, thr1 = _settled(pid, fds0, thr0)
        assert pipe.alive()
    finally:
        assert pipe.close() == 0
    print(
        f"\nfacade subscription storm (300 cycles): kernel threads {thr0} -> {thr1}, fds {fds0} -> {fds1}"
    )
