"""PTYs of vanished clients are reaped after a grace period (issue 31), live.

An agent that opened a busy PTY and vanished held ``max_ptys`` for the next agent of its
principal, and its program burned a core that nobody was charged for. With ``[kernel]
pty_orphan_grace_ms`` short, the PTY is closed once its owner has had no connection for
that long, its CPU is charged, and the next agent can open one; a PTY whose owner is
still connected is kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess, close_client
from tests.support.polling import wait_until
from tests.support.procfs import pid_alive, proc_gone
from tests.support.tmp import short_tmp

GRACE_MS = 300
WAIT_S = 30.0
POLICY = f"""
[principal."agent:pty"]
proc_spawn = ["bash"]
max_ptys = 1

[kernel]
pty_orphan_grace_ms = {GRACE_MS}
"""
BUSY = {"cmd": "bash", "args": ["-c", "while :; do :; done"]}


@pytest.fixture()
def kernel():
    with short_tmp("shpo") as tmp:
        policy = Path(tmp) / "policy.toml"
        policy.write_text(POLICY)
        k = KernelProcess(tmp, "--policy", str(policy))
        token = TokenStore(k.state / "tokens.json").create("agent:pty")[1]
        k.start()
        try:
            yield k, token
        finally:
            k.stop()


def test_a_vanished_clients_pty_is_reaped_charged_and_its_slot_freed(kernel) -> None:
    k, token = kernel
    operator = k.client("ops")
    keeper = k.client("keeper")  # stays connected the whole time: its PTY is kept
    gone = k.client("gone-agent", token=token)
    try:
        kept = keeper.call("pty.open", {"cmd": "bash"}, timeout=WAIT_S)
        busy = gone.call("pty.open", BUSY, timeout=WAIT_S)
        assert pid_alive(busy["pid"])
        nxt = k.client("next-agent", token=token)
        try:
            with pytest.raises(RpcError) as held:  # max_ptys = 1, held by the busy one
                nxt.call("pty.open", BUSY, timeout=WAIT_S)
            assert held.value.code == ErrorCode.QUOTA
        finally:
            close_client(nxt)

        close_client(gone)  # the agent vanishes without pty.close
        wait_until(
            lambda: operator.call("kernel.status", timeout=WAIT_S)["ptys_reaped"] == 1,
            WAIT_S,
            what="the orphaned PTY reaped",
        )
        wait_until(lambda: proc_gone(busy["pid"]), WAIT_S, what="its program gone")
        assert f"{busy['pty_id']} of agent:pty closed" in k.log()
        charged = k.log().split(f"{busy['pty_id']} of agent:pty closed", 1)[1]
        assert float(charged.split("used ", 1)[1].split(" s of CPU", 1)[0]) > 0

        # The slot is free again for the next agent of that principal.
        nxt = k.client("next-agent", token=token)
        try:
            reopened = nxt.call("pty.open", BUSY, timeout=WAIT_S)
            assert pid_alive(reopened["pid"])
            nxt.call("pty.close", {"pty_id": reopened["pty_id"]}, timeout=WAIT_S)
        finally:
            close_client(nxt)
        # The connected owner's PTY was never touched.
        listed = keeper.call("pty.list", {}, timeout=WAIT_S)["ptys"]
        assert [p["pty_id"] for p in listed] == [kept["pty_id"]] and listed[0]["alive"]
        assert pid_alive(kept["pid"])
    finally:
        for c in (keeper, operator):
            close_client(c)
