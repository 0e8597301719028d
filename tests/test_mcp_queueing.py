"""The facade's pipelined calls past the kernel's MAX_BLOCKING_CALLS queue (issue 31).

An MCP client may pipeline up to MCP_INPUT_QUEUE requests; the facade sends them on its
one kernel connection, which runs MAX_BLOCKING_CALLS at once. The 65th was answered
-32031; now it waits in the connection's queue and runs when a running call ends.
"""

from __future__ import annotations

import json

from shoal_mcp.kernel.config.limits import MAX_BLOCKING_CALLS
from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import alive_with_marks, kill_pids, sleep_marker

QUEUED = 8


def test_pipelined_calls_past_the_blocking_limit_queue_instead_of_failing():
    with running_kernel(prefix="shmq-") as k:
        f = RawFacade(facade_env(k))
        try:
            f.initialize()
            marks = [sleep_marker() for _ in range(MAX_BLOCKING_CALLS + QUEUED)]
            ids = [
                f.send(
                    "tools/call",
                    {"name": "shoal_exec", "arguments": {"command": f"sleep {m}"}},
                )
                for m in marks
            ]
            # The first MAX_BLOCKING_CALLS run; the rest wait (no reply, no refusal).
            wait_until(
                lambda: len(alive_with_marks(marks)) == MAX_BLOCKING_CALLS,
                60,
                what=f"{MAX_BLOCKING_CALLS} sleeps running",
            )
            replies: dict = {}
            started: set[str] = set()

            def drain() -> bool:
                while not f.messages.empty():
                    message = f.messages.get()
                    if message.get("id") in ids and "method" not in message:
                        replies[message["id"]] = message
                alive = {m: alive_with_marks([m]) for m in marks}
                started.update(m for m, pids in alive.items() if pids)
                # Each ended call lets a queued one run; only the pids seen are killed.
                kill_pids([p for pids in alive.values() for p in pids])
                return len(replies) == len(ids)

            wait_until(drain, 120, interval=0.1, what="every pipelined call answered")
            # Refused: a JSON-RPC error, or a tool result carrying the kernel's -32031.
            refused = [r for r in replies.values() if "blocking_calls" in json.dumps(r)]
            assert refused == []
            assert all("result" in r for r in replies.values()), list(replies.values())[:2]
            assert len(started) == len(marks)  # the queued ones ran too
        finally:
            f.close()
