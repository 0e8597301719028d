"""Approvals mean what was approved (issue 13): bound to cwd and env, renewable after an
apply, and shown to the approver whole, with control characters escaped.

A real kernel, a token agent whose writes need approval, the local human approving.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal_mcp.client import KernelClient
from shoal_mcp.kernel.access.plans import escape_controls, plan_display
from shoal_mcp.protocol.errors import RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess, child_env
from tests.support.tmp import short_tmp

APPROVAL_REQUIRED = -32011

POLICY = """
[principal."agent:w"]
proc_spawn = ["make", "echo", "true", "cp"]
env_write = ["PATH"]
env_read = ["PATH"]
ungranted = "ask"
opaque = "ask"
[principal."agent:w".fs]
read = ["{work}/**"]
write = ["{work}/**"]
"""


@dataclass
class Env:
    kernel: KernelProcess
    token: str
    work: Path

    def agent(self, session: str) -> KernelClient:
        return self.kernel.client(session, token=self.token)

    def human(self) -> KernelClient:
        return self.kernel.client("approver")


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with short_tmp("shap") as tmp:
        work = tmp / "work"
        work.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(POLICY.format(work=work))
        kernel = KernelProcess(tmp, "--policy", str(policy))
        token = TokenStore(kernel.state / "tokens.json").create("agent:w")[1]
        kernel.start()
        try:
            yield Env(kernel, token, work)
        finally:
            kernel.stop()


def _ask(c: KernelClient, src: str) -> dict:
    with pytest.raises(RpcError) as exc:
        c.call("exec", {"src": src}, timeout=60)
    assert exc.value.code == APPROVAL_REQUIRED, exc.value
    return exc.value.data


def _approve(env: Env, ref: str) -> None:
    h = env.human()
    try:
        h.call("cap.decide", {"plan_ref": ref, "approve": True})
    finally:
        h.close()


def test_a_changed_env_asks_again(env: Env) -> None:
    """Approve `make > log`, then `export PATH=$PWD/bin:$PATH`: the fake make must not run."""
    fake = env.work / "bin"
    fake.mkdir()
    (fake / "make").write_text(f"#!/bin/sh\ntouch {env.work}/fake-make-ran\n")
    (fake / "make").chmod(0o755)
    c = env.agent("env-bound")
    try:
        c.call("exec", {"src": f"cd {env.work}"}, timeout=60)
        src = "make --version > /dev/null 2>&1 > /tmp/shoal-approvals-log"
        ref = _ask(c, src)["plan_ref"]
        attached_hash = c.call("session.env")["env_hash"]
        assert c.call("plan.get", {"plan_ref": ref})["env_hash"] == attached_hash
        c.call("cap.request", {"plan_ref": ref})
        _approve(env, ref)
        c.call("exec", {"src": f"export PATH={fake}:$PATH"}, timeout=60)
        with pytest.raises(RpcError) as exc:
            c.call("plan.apply", {"plan_ref": ref}, timeout=60)
        assert exc.value.code == APPROVAL_REQUIRED
        assert exc.value.data["env_hash"] != exc.value.data["plan_env_hash"]
        assert not (env.work / "fake-make-ran").exists()
        # Planned again under the new env it is a different plan, to approve afresh.
        again = _ask(c, src)["plan_ref"]
        assert again != ref
    finally:
        c.close()


def test_an_applied_source_can_be_approved_again(env: Env) -> None:
    c = env.agent("renew")
    target = env.work / "renew.txt"
    src = f"echo hi > /tmp/shoal-approvals-renew; true {target}"
    try:
        c.call("exec", {"src": "true"}, timeout=60)  # the session env as exec leaves it
        ref = _ask(c, src)["plan_ref"]
        c.call("cap.request", {"plan_ref": ref})
        _approve(env, ref)
        c.call("plan.apply", {"plan_ref": ref}, timeout=60)
        assert (
            c.call("session.env")["env_hash"] == c.call("plan.get", {"plan_ref": ref})["env_hash"]
        )
        # The same source again: a fresh ref (the applied one is never reused) ...
        fresh = _ask(c, src)["plan_ref"]
        assert fresh != ref
        assert c.call("plan.get", {"plan_ref": fresh})["state"] == "pending"
        # ... and cap.request on the applied ref also files a fresh plan.
        renewed = c.call("cap.request", {"plan_ref": ref})
        assert renewed["plan_ref"] not in (ref,) and renewed["state"] == "approval_pending"
        _approve(env, renewed["plan_ref"])
        c.call("plan.apply", {"plan_ref": renewed["plan_ref"]}, timeout=60)
        assert c.call("plan.get", {"plan_ref": ref})["state"] == "applied"
    finally:
        c.close()


# On a terminal, the \r brings "echo hello" over the start of the line: the cp is hidden.
HIDDEN = "cp f ../.bashrc #" + " " * 80 + "\recho hello\x1b[K\u202e"


def test_approver_views_show_the_whole_source_escaped(env: Env) -> None:
    c = env.agent("hidden")
    try:
        ref = _ask(c, HIDDEN)["plan_ref"]
        c.call("cap.request", {"plan_ref": ref})
    finally:
        c.close()
    h = env.human()
    try:
        record = h.call("plan.get", {"plan_ref": ref})
        listed = [p for p in h.call("plan.list", {"all": True})["plans"] if p["plan_ref"] == ref]
    finally:
        h.close()
    shown = "cp f ../.bashrc #" + " " * 80 + "\\recho hello\\e[K\\u{202e}"
    assert record["src_display"] == shown and listed[0]["src_display"] == shown
    assert record["src"] == HIDDEN  # the exact source stays available as data
    cli = subprocess.run(
        [sys.executable, "-c", "from shoal_mcp.cli import run; run()", "plans"],
        env=child_env(
            {
                "SHOAL_SOCKET": str(env.kernel.socket),
                "SHOAL_STATE_DIR": str(env.kernel.state),
                "NO_COLOR": "1",
            }
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert "\r" not in cli.stdout and "\x1b" not in cli.stdout
    assert f"src: {shown}" in cli.stdout  # whole, not cut at a column
    assert "fs_write" in cli.stdout and "/.bashrc" in cli.stdout  # effects with targets


def test_escape_is_unambiguous_and_bounded() -> None:
    assert escape_controls("a\\rb") == "a\\\\rb" != escape_controls("a\rb")
    assert escape_controls("\x00\x7f\x85\t\n") == "\\x00\\x7f\\x85\\t\\n"
    assert escape_controls("\u200b\ufeff") == "\\u{200b}\\u{feff}"
    assert escape_controls("naïve ✓") == "naïve ✓"
    long = "x" * 5000 + "\r; rm -rf ~"
    shown = plan_display(long, limit=100)
    assert shown.startswith("x" * 100) and "more characters" in shown
    assert str(len(escape_controls(long)) - 100) in shown


def test_cli_tables_escape_controls(env: Env) -> None:
    """`shoal journal` (a table) shows a command's \\r and ESC escaped, not interpreted."""
    c = env.kernel.client("journal-view")
    try:
        c.call("exec", {"src": "echo ok # \r\x1b[2Kinnocent", "position": "value"}, timeout=60)
    finally:
        c.close()
    cli = subprocess.run(
        [sys.executable, "-c", "from shoal_mcp.cli import run; run()", "journal"],
        env=child_env(
            {"SHOAL_SOCKET": str(env.kernel.socket), "SHOAL_STATE_DIR": str(env.kernel.state)}
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert "\r" not in cli.stdout and "\x1b" not in cli.stdout
    assert "echo ok # \\r\\e[2K" in cli.stdout
