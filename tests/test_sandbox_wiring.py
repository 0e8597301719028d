"""The sandbox wired into the kernel's spawners: ``runner.spawn(sandbox=...)`` for exec.

Real bash, real Landlock; nothing mocked.  Marked ``landlock``: these fail instead of
skipping on a machine that has Landlock (tests/support/landlock.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import landlock
from shoal_mcp.kernel.access.sandbox import SECCOMP_LEVEL as SECCOMP
from shoal_mcp.kernel.access.sandbox_build import build_spec
from shoal_mcp.kernel.exec.runner import spawn
from tests.support.landlock import landlock_evidence

pytestmark = pytest.mark.landlock


@pytest.fixture
def abi() -> int:
    try:
        return landlock.abi_version()
    except landlock.LandlockUnavailable as e:
        pytest.skip(f"{e} (evidence of Landlock: {landlock_evidence()})")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    paths = {n: tmp_path / n for n in ("project", "outside", "state", "tmp")}
    for p in paths.values():
        p.mkdir()
    (paths["state"] / "spool").mkdir()
    (paths["state"] / "tokens.key").write_text("KERNEL-KEY\n")
    return paths


def test_runner_spawn_applies_the_spec(abi: int, tree: dict[str, Path]) -> None:
    spec = build_spec(
        fs_read=[f"{tree['project']}/**"],
        fs_write=[f"{tree['project']}/**"],
        home=str(tree["project"]),
        tmpdir=str(tree["tmp"]),
        forbidden=[str(tree["state"])],
    )
    script = (
        f"touch {tree['outside']}/X; cat {tree['state']}/tokens.key; touch {tree['project']}/ok; "
        'echo "tmp=$TMPDIR"; echo again > /dev/stdout; export NEW=1'
    )
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}  # no LC_CTYPE: none may appear
    run = spawn(script, str(tree["project"]), env, tree["state"] / "spool", sandbox=spec)
    try:
        assert run.wait(60) == 0
        assert not (tree["outside"] / "X").exists()
        assert (tree["project"] / "ok").exists()
        err = run.err_path.read_text()
        assert err.count("Permission denied") == 2, err
        # Reopened by path, /dev/stdout is the output pipe: appended, as in a terminal
        # (a spool file there was truncated by the reopening).
        assert run.out_path.read_text() == f"tmp={tree['tmp']}\nagain\n"
        state = run.read_state()
        assert state is not None
        assert state[1]["NEW"] == "1"
        assert "LC_CTYPE" not in state[1]  # the supervisor's locale coercion does not leak
    finally:
        run.discard()


def test_runner_spawn_without_a_spec_is_unconfined(tree: dict[str, Path]) -> None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    run = spawn(f"touch {tree['outside']}/X", str(tree["project"]), env, tree["state"] / "spool")
    assert run.wait(60) == 0
    assert (tree["outside"] / "X").exists()
    run.discard()
    assert os.listdir(tree["state"] / "spool") == []


def test_required_refuses_where_nothing_enforces() -> None:
    from shoal_mcp.kernel.access.confine import Confinement, SandboxUnavailable
    from shoal_mcp.kernel.access.sandbox_probe import SandboxSupport

    none_here = SandboxSupport(reason="no Landlock in this kernel")
    with pytest.raises(SandboxUnavailable, match="no Landlock in this kernel"):
        Confinement("required", forbidden=(), support=none_here)
    auto = Confinement("auto", forbidden=(), support=none_here)
    assert auto.enforcing is False and auto.enforced() is False
    assert auto.status() == {
        "mode": "auto",
        "enforced": False,
        "reason": "no Landlock in this kernel",
    }
    with pytest.raises(ValueError, match="auto | required | off"):
        Confinement("sometimes", forbidden=())


def test_off_confines_nobody_and_opaque_falls_back_to_deny(abi: int) -> None:
    from shoal_mcp.kernel.access.confine import Confinement
    from shoal_mcp.kernel.access.policy import Policy

    pol = Policy.from_dict({"principal": {"agent:x": {"proc_spawn": ["ls"]}}}).for_principal(
        "agent:x", "uid:0"
    )
    off = Confinement("off", forbidden=())
    assert off.spec_for(pol) is None and off.status()["enforced"] is False
    assert pol.evaluate([{"kind": "opaque", "target": "eval"}], "conditional").verdict == "deny"
    on = Confinement("auto", forbidden=())
    spec = on.spec_for(pol)
    assert spec is not None and spec.private_net and os.path.isdir(spec.tmpdir)
    verdict = pol.evaluate([{"kind": "opaque", "target": "eval"}], "conditional", enforcing=True)
    assert verdict.verdict == "allow"  # opaque = "sandbox" by default where it enforces
    on.close()
    assert not os.path.exists(spec.tmpdir)


def test_long_script_runs_sandboxed(abi: int, tree: dict[str, Path]) -> None:
    """A source too long for argv is read from an unlinked file bash reopens by path:
    it must be somewhere the sandbox can read (the private temp dir, not the spool)."""
    spec = build_spec(
        home=str(tree["project"]), tmpdir=str(tree["tmp"]), forbidden=[str(tree["state"])]
    )
    src = "echo start\n" + "# padding\n" * 20000 + "echo end\n"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    run = spawn(src, str(tree["project"]), env, tree["state"] / "spool", sandbox=spec)
    try:
        assert run.wait(60) == 0, run.err_path.read_text()
        assert run.out_path.read_text() == "start\nend\n"
        assert os.listdir(tree["tmp"]) == []  # unlinked before bash ran
    finally:
        run.discard()


def test_also_read_opens_one_kernel_path_read_only(abi: int, tree: dict[str, Path]) -> None:
    """$SHOAL_OUT-style: one directory inside the state dir readable, nothing else there."""
    outs = tree["state"] / "out-view"
    outs.mkdir()
    (outs / "1").write_text("stored output\n")
    spec = build_spec(
        home=str(tree["project"]),
        tmpdir=str(tree["tmp"]),
        forbidden=[str(tree["state"])],
        also_read=[str(outs), str(tree["state"] / "missing")],
    )
    script = f"cat {outs}/1; cat {tree['state']}/tokens.key; echo x > {outs}/2"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    run = spawn(script, str(tree["project"]), env, tree["state"] / "spool", sandbox=spec)
    try:
        run.wait(60)
        assert run.out_path.read_text() == "stored output\n"
        assert run.err_path.read_text().count("Permission denied") == 2
        assert not (outs / "2").exists()
    finally:
        run.discard()


def test_specs_are_reused_briefly_and_rebuilt_when_the_tmpdir_went(abi: int) -> None:
    import shutil

    from shoal_mcp.kernel.access.confine import Confinement
    from shoal_mcp.kernel.access.policy import Policy

    pol = Policy.from_dict({"principal": {"agent:x": {}}}).for_principal("agent:x", "uid:0")
    box = Confinement("auto", forbidden=())
    try:
        first = box.spec_for(pol)
        assert first is not None and box.spec_for(pol) is first  # within the TTL
        assert box.spec_for(pol, ttys=("/dev/null",)) is not first  # another key
        shutil.rmtree(first.tmpdir)
        again = box.spec_for(pol)
        assert again is not None and again is not first and os.path.isdir(again.tmpdir)
    finally:
        box.close()


def test_a_spec_that_cannot_be_built_refuses_with_a_clear_error(
    abi: int, tree: dict[str, Path]
) -> None:
    from shoal_mcp.kernel.access.confine import Confinement
    from shoal_mcp.kernel.access.policy import Policy
    from shoal_mcp.protocol.errors import ErrorCode, RpcError

    pol = Policy.from_dict({"principal": {"agent:x": {}}}).for_principal("agent:x", "uid:0")
    box = Confinement("auto", forbidden=(str(tree["state"]),))
    try:
        with pytest.raises(RpcError) as exc:  # a read path that holds the state dir
            box.spec_for(pol, also_read=(str(tree["state"].parent),))
        assert exc.value.code == ErrorCode.DENIED
        assert "contains a kernel directory" in exc.value.data["sandbox"]
        assert exc.value.data["principal"] == "agent:x"
    finally:
        box.close()


def test_without_user_namespaces_tcp_is_still_denied(abi: int, tree: dict[str, Path]) -> None:
    """A machine where the probe could not make a network namespace: specs ask for none
    (or every exec would fail), and Landlock's TCP rules still refuse connect."""
    import socket

    from shoal_mcp.kernel.access.confine import Confinement
    from shoal_mcp.kernel.access.policy import Policy
    from shoal_mcp.kernel.access.sandbox_probe import SandboxSupport

    no_netns = SandboxSupport(abi=abi, fs=True, tcp=abi >= 4, netns=None, unix=True)
    pol = Policy.from_dict({"principal": {"agent:x": {}}}).for_principal("agent:x", "uid:0")
    box = Confinement("required", forbidden=(str(tree["state"]),), support=no_netns)
    if abi < 4:  # no TCP rules either: the network is open, and caps say so
        spec = box.spec_for(pol)
        assert spec is not None and not spec.private_net and spec.tcp_connect is None
        assert box.enforced() == {"fs": f"landlock-v{abi}", "net": False, "seccomp": SECCOMP}
        box.close()
        return
    assert box.enforced() == {"fs": f"landlock-v{abi}", "net": "landlock-tcp", "seccomp": SECCOMP}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        spec = box.spec_for(pol)
        assert spec is not None and spec.private_net is False and spec.tcp_connect == ()
        port = listener.getsockname()[1]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
        run = spawn(
            f"echo x > /dev/tcp/127.0.0.1/{port}",
            str(tree["project"]),
            env,
            tree["state"] / "spool",
            sandbox=spec,
        )
        assert run.wait(60) != 0
        assert "Permission denied" in run.err_path.read_text()
        run.discard()
    finally:
        listener.close()
        box.close()


def test_tmp_root_is_emptied_at_start_and_removed_at_close(abi: int, tmp_path: Path) -> None:
    from shoal_mcp.kernel.access.confine import Confinement
    from shoal_mcp.kernel.access.policy import Policy

    root = tmp_path / "sandbox-root"
    (root / "leftover-of-a-killed-kernel").mkdir(parents=True)
    pol = Policy.from_dict({"principal": {"agent:x": {}}}).for_principal("agent:x", "uid:0")
    box = Confinement("auto", forbidden=(), tmp_root=str(root))
    assert set(os.listdir(root)) <= {".view"}  # the namespaced view's mount point
    spec = box.spec_for(pol)
    assert spec is not None and os.path.dirname(spec.tmpdir) == str(root)
    box.close()
    assert not root.exists()
    # Not a directory of ours (a symlink planted in a shared /tmp): not used, not followed.
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    root.symlink_to(target)
    box = Confinement("auto", forbidden=(), tmp_root=str(root))
    spec = box.spec_for(pol)
    assert spec is not None and os.path.dirname(spec.tmpdir) != str(root)
    box.close()
    assert (target / "keep").exists()
