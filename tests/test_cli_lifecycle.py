"""Lifecycle through the CLI: cleanup (`shoal gc`), a kernel of another version,
`shoal kernel restart`, `shoal mcp-config`. Real kernels, real CLI processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal_mcp import __version__
from shoal_mcp.client import KernelClient
from tests.support.kernel import child_env, close_client
from tests.support.procfs import kill_pids, pids_with_arg
from tests.support.tmp import short_tmp
from tests.test_cli import CLI, shoal


@pytest.fixture()
def env():
    with short_tmp("shoal-life-") as root:
        sock = root / "run" / "k.sock"
        e = child_env({"SHOAL_SOCKET": str(sock), "SHOAL_STATE_DIR": str(root / "state")})
        try:
            yield e
        finally:
            subprocess.run([*CLI, "kernel", "stop"], env=e, capture_output=True, timeout=60)
            kill_pids(pids_with_arg(str(sock)))


def _cas_bytes(env) -> int:
    cas = Path(env["SHOAL_STATE_DIR"]) / "cas"
    return sum(p.stat().st_size for p in cas.rglob("*") if p.is_file())


def test_gc_frees_space_and_keeps_what_live_sessions_reference(env):
    shared = "seq 1 300000"  # 2 MB; the same bytes in both sessions: one blob
    shoal(env, "--session", "old", "exec", shared)
    shoal(env, "--session", "old", "exec", "head -c 3000000 /dev/zero | tr '\\0' x")
    shoal(env, "--session", "live", "exec", shared)
    live = KernelClient(Path(env["SHOAL_SOCKET"]))
    try:
        live.call("session.attach", {"session": "live"})
        before = _cas_bytes(env)
        dry = json.loads(shoal(env, "gc", "--older-than", "0", "--json").stdout)
        assert dry["dry_run"] and dry["values"] == 2 and "live" in dry["live_sessions"]
        assert dry["bytes_freed"] >= 3_000_000 and dry["kept_live_values"] == 1
        assert _cas_bytes(env) == before  # a dry run deletes nothing
        assert "dry run" in shoal(env, "gc", "--older-than", "0").stdout
        # gc's own attach does not make its session live: run it from the "old" session.
        own = json.loads(shoal(env, "--session", "old", "gc", "--older-than", "0", "--json").stdout)
        assert own["values"] == 2 and "old" not in own["live_sessions"]

        done = json.loads(shoal(env, "gc", "--older-than", "0", "--delete", "--json").stdout)
        assert not done["dry_run"] and done["bytes_freed"] == dry["bytes_freed"]
        assert before - _cas_bytes(env) >= 3_000_000
        # The live session's output, and the blob the pruned one shared with it, remain.
        tail = shoal(env, "--session", "live", "get", "out:1", "--lines", "-1..").stdout
        assert tail == "300000\n"
        gone = shoal(env, "--session", "old", "get", "out:2", check=False)
        assert gone.returncode == 2 and "removed by shoal gc" in gone.stderr
        # Numbers are not reused: the next output of the pruned session is out:3.
        nxt = json.loads(shoal(env, "--session", "old", "exec", "--json", "echo new").stdout)
        assert nxt["ref"] == "out:3"
        rows = json.loads(shoal(env, "journal", "--json", "-n", "10").stdout)
        assert rows[0]["src"] == shared  # the journal (history) is kept
    finally:
        close_client(live)


def test_gc_by_total_size_prunes_oldest_first(env):
    for i in range(3):
        shoal(env, "--session", f"s{i}", "exec", f"head -c 1000000 /dev/zero | tr '\\0' {i}")
    report = json.loads(shoal(env, "gc", "--max-size", "1.5M", "--delete", "--json").stdout)
    assert report["values"] == 2 and report["bytes_after"] <= 1.5 * 1024 * 1024
    pruned = shoal(env, "--session", "s0", "get", "out:1", check=False)
    assert pruned.returncode == 2 and "removed" in pruned.stderr
    kept = shoal(env, "--session", "s2", "get", "out:1", "--format", "raw", "--path", ".out")
    assert kept.stdout.startswith("222")
    bad = shoal(env, "gc", "--older-than", "soon", check=False)
    assert bad.returncode == 2 and "7d" in bad.stderr


def _old_kernel(env) -> subprocess.Popen:
    """A real kernel that reports an older version (as one started before an upgrade)."""
    code = (
        "import sys, shoal_mcp; shoal_mcp.__version__ = '0.0.1-old'; "
        "from shoal_mcp.kernel.rpc.daemon import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "--socket",
            env["SHOAL_SOCKET"],
            "--state-dir",
            env["SHOAL_STATE_DIR"],
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    from tests.support.polling import wait_until

    wait_until(lambda: os.path.exists(env["SHOAL_SOCKET"]), timeout=20, what="the old kernel")
    return proc


def test_stale_kernel_version_reported_once_and_restart_replaces_it(env):
    old = _old_kernel(env)
    try:
        ran = shoal(env, "exec", "echo hi; echo hi >&2")
        assert ran.stderr.count("0.0.1-old") == 1 and "shoal kernel restart" in ran.stderr
        assert ran.stdout == "hi\n"
        doctor = json.loads(shoal(env, "doctor", "--json", check=False).stdout)
        check = next(c for c in doctor if c["check"] == "kernel version")
        assert check["status"] == "fail" and "0.0.1-old" in check["detail"]
        restarted = shoal(env, "kernel", "restart").stdout
        assert f"version {__version__}" in restarted and f"was pid {old.pid}" in restarted
        assert old.wait(30) == 0  # stopped cleanly by SIGTERM
        doctor = json.loads(shoal(env, "doctor", "--json").stdout)
        assert next(c for c in doctor if c["check"] == "kernel version")["status"] == "ok"
        assert "0.0.1-old" not in shoal(env, "exec", "true").stderr
    finally:
        if old.poll() is None:
            old.kill()


def test_mcp_config_prints_absolute_paths(env):
    out = shoal(env, "mcp-config").stdout
    config = json.loads(out[out.index("{") :])
    server = config["mcpServers"]["shoal"]
    command = Path(server["command"])
    assert command.is_absolute() and os.access(command, os.X_OK)
    assert "SHOAL_SESSION" not in server["env"]  # each project its own session
    assert server["env"]["SHOAL_SOCKET"] == env["SHOAL_SOCKET"]
    assert f"claude mcp add shoal -e SHOAL_SOCKET={env['SHOAL_SOCKET']}" in out
    assert f"-- {command}" in out
    named = shoal(env, "--session", "pinned", "mcp-config").stdout
    assert json.loads(named[named.index("{") :])["mcpServers"]["shoal"]["env"]["SHOAL_SESSION"]
