"""A kernel on another host over ssh (issue 29), against plain ``ssh host cmd``.

A real sshd on a loopback port (tests/support/sshd.py) stands for the other host.

* ``echo hi`` latency, side by side in one run: a tool call through ``shoal-mcp --host``
  (its ssh link stays open) and through the bare ``RemoteKernelClient``, against
  ``ssh host echo hi`` reusing a ControlMaster connection (ControlPath in tmp,
  ControlPersist): the fastest way to run a command with plain ssh. Goal: shoal's p50 ≤
  1.0× ssh's.
* ``seq 1 20000000`` (~169 MB of output) through the facade: the bytes that crossed the
  link, counted by the bridge on the remote side (``SHOAL_BRIDGE_STATS``). Goal: ≤ 64 KiB.

``SHOAL_BENCH_QUICK=1``: fewer rounds, smaller output, no assertions (numbers printed).
Results go to stdout and bench/.results/remote.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from shoal_mcp.client_transport import connect_remote, parse_host
from tests.support.facade import RawFacade
from tests.support.polling import wait_until
from tests.support.sshd import SSHD, SSHD_MISSING, remote_side, running_sshd

pytestmark = pytest.mark.skipif(not SSHD.exists(), reason=SSHD_MISSING)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / ".results" / "remote.json"
QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
ROUNDS = 20 if QUICK else 200
WARMUP = 3
RATIO_GOAL = 1.0
SEQ_N = 2_000_000 if QUICK else 20_000_000
LINK_BYTES_GOAL = 64 * 1024


def _record(name: str, values: dict) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[name] = values
    RESULTS.write_text(json.dumps(data, indent=2))


def _p50_ms(run, rounds: int = ROUNDS) -> float:
    for _ in range(WARMUP):
        run()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


@pytest.fixture(scope="module")
def side():
    with running_sshd() as server, remote_side(server) as remote:
        yield remote


def test_echo_hi_over_the_link_against_ssh_with_a_control_master(side):
    env = side.client_env()
    control = side.dir / "cm-%C"
    ssh = [
        *side.server.ssh_argv(),
        "-o", "ControlMaster=auto", "-o", f"ControlPath={control}", "-o", "ControlPersist=60",
    ]  # fmt: skip
    subprocess.run([*ssh, "true"], check=True, timeout=60)  # the master comes up

    def plain_ssh() -> None:
        done = subprocess.run([*ssh, "echo", "hi"], capture_output=True, timeout=60)
        assert done.stdout == b"hi\n", done

    facade = RawFacade(env)
    try:
        facade.initialize()

        def through_facade() -> None:
            reply = facade.tool("shoal_exec", {"command": "echo hi"}, timeout=60)
            assert reply["result"]["isError"] is False, reply

        # Interleaved in one run, so both see the same machine load.
        ssh_ms = _p50_ms(plain_ssh)
        facade_ms = _p50_ms(through_facade)
        ssh_ms = min(ssh_ms, _p50_ms(plain_ssh))
    finally:
        facade.close()
        subprocess.run([*ssh, "-O", "exit"], capture_output=True, timeout=30)

    saved = {k: os.environ.get(k) for k in ("SHOAL_SSH", "SHOAL_REMOTE_COMMAND")}
    os.environ.update(SHOAL_SSH=env["SHOAL_SSH"], SHOAL_REMOTE_COMMAND=env["SHOAL_REMOTE_COMMAND"])
    try:
        client = connect_remote(parse_host(env["SHOAL_HOST"]))
        client.call("session.attach", {"client": {"kind": "cli"}, "session": "bench"})
        client_ms = _p50_ms(lambda: client.call("exec", {"src": "echo hi"}))
        client.close()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    ratio = facade_ms / ssh_ms
    print(
        f"\necho hi p50 over {ROUNDS} rounds: shoal-mcp --host {facade_ms:.2f} ms, "
        f"RemoteKernelClient {client_ms:.2f} ms, ssh with ControlMaster {ssh_ms:.2f} ms; "
        f"shoal-mcp/ssh {ratio:.2f}x, client/ssh {client_ms / ssh_ms:.2f}x (goal <= {RATIO_GOAL})"
    )
    _record(
        "echo_hi",
        {"facade_p50_ms": facade_ms, "client_p50_ms": client_ms, "ssh_cm_p50_ms": ssh_ms,
         "ratio": ratio, "rounds": ROUNDS},
    )  # fmt: skip
    if not QUICK:
        assert ratio <= RATIO_GOAL


def test_big_output_stays_on_the_remote_host(side, tmp_path):
    stats = side.dir / "bridge-stats.json"
    env = side.client_env(
        SHOAL_REMOTE_COMMAND=side.remote_command({"SHOAL_BRIDGE_STATS": str(stats)})
    )
    facade = RawFacade(env)
    try:
        facade.initialize()
        reply = facade.tool("shoal_exec", {"command": f"seq 1 {SEQ_N}"}, timeout=300)
        assert reply["result"]["isError"] is False, reply
    finally:
        facade.close()
    wait_until(stats.exists, timeout=30, what="the bridge's byte counts")
    counted = json.loads(stats.read_text())
    moved = counted["up_bytes"] + counted["down_bytes"]
    produced = sum(len(f"{i}\n") for i in range(1, SEQ_N + 1))
    print(
        f"\nseq 1 {SEQ_N}: {produced} bytes of output stored on the remote host, "
        f"{moved} bytes crossed the link ({counted['up_bytes']} up, {counted['down_bytes']} "
        f"down; goal <= {LINK_BYTES_GOAL})"
    )
    _record("seq", {"n": SEQ_N, "output_bytes": produced, "link_bytes": moved, **counted})
    assert moved <= LINK_BYTES_GOAL  # a byte count, not a time: holds in quick mode too
