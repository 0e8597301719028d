"""Issue 13, "State reports are untrusted", live: a token principal's exec can change
only the env its ``env_write`` grants cover, never the code-running names unless granted
by name, reports what it refused, changes nothing when it fails, and a report forged on
the state descriptor can do no more. See docs/decisions.md, Session state.
"""

from __future__ import annotations

import secrets

import pytest

from shoal_mcp.client import KernelClient
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess, close_client
from tests.support.results import out_text
from tests.support.tmp import short_tmp

POLICY = """
[principal."agent:narrow"]
proc_spawn = ["*"]
opaque = "allow"
env_write = ["SHOAL_T_OK*"]

[principal."agent:star"]
proc_spawn = ["*"]
opaque = "allow"
env_write = ["*", "PS4"]
"""
# ``eval`` is opaque to the analysis, which ``opaque = "allow"`` lets run: the gate
# predicts nothing here, so only the state-report filter stands between the script and
# the session (which is the point).

# The fd of the state report is visible to the script (``type __shoal_exit``).
STATE_FD = "$(type __shoal_exit | grep -o '>&[0-9]*' | head -n1 | tr -d '>&')"


@pytest.fixture(scope="module")
def kernel():
    with short_tmp("shsr") as tmp:
        policy = tmp / "policy.toml"
        policy.write_text(POLICY)
        k = KernelProcess(tmp, "--policy", str(policy))
        store = TokenStore(k.state / "tokens.json")
        k.tokens = {p: store.create(p)[1] for p in ("agent:narrow", "agent:star")}
        k.start()
        try:
            yield k
        finally:
            k.stop()


@pytest.fixture
def agent(kernel):
    made: list[KernelClient] = []

    def make(principal: str) -> KernelClient:
        c = kernel.client(f"sr-{secrets.token_hex(4)}", token=kernel.tokens[principal])
        made.append(c)
        return c

    yield make
    for c in made:
        close_client(c)


def run(c: KernelClient, src: str) -> dict:
    return c.call("exec", {"src": src, "position": "value"}, timeout=60)


def names(c: KernelClient) -> set[str]:
    return set(c.call("session.env", {}, timeout=10)["names"])


def test_only_granted_names_apply_and_refusals_are_reported(agent):
    a = agent("agent:narrow")
    r = run(a, "eval 'export SHOAL_T_OK_1=yes SHOAL_T_NOPE=no'")
    assert r["value"]["ok"] is True
    assert r["value"]["env_refused"] == ["SHOAL_T_NOPE"]
    env = names(a)
    assert "SHOAL_T_OK_1" in env and "SHOAL_T_NOPE" not in env
    # Unsetting an ungranted name is refused too (PATH stays).
    r = run(a, "eval 'unset PATH'")
    assert r["value"]["env_refused"] == ["PATH"] and "PATH" in names(a)


@pytest.mark.parametrize(
    "name",
    ["BASH_ENV", "ENV", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "LD_PRELOAD", "LD_AUDIT"],
)
def test_code_running_names_need_a_grant_by_name(agent, name):
    star = agent("agent:star")  # env_write = ["*", "PS4"]
    # SHELLOPTS and BASHOPTS are read-only in bash: exporting them exports their value.
    value = "" if name in ("SHELLOPTS", "BASHOPTS") else "=/tmp/shoal-t-x"
    r = run(star, f"eval 'export {name}{value} SHOAL_T_FINE=1'")
    assert r["value"]["ok"] is True
    assert name in r["value"]["env_refused"]
    env = names(star)
    assert name not in env and "SHOAL_T_FINE" in env


def test_a_name_granted_exactly_applies(agent):
    star = agent("agent:star")
    r = run(star, "eval 'export PS4=+x'")
    assert "env_refused" not in r["value"]
    assert "PS4" in names(star)


def test_a_failed_exec_changes_nothing(agent, tmp_path):
    a = agent("agent:narrow")
    before = a.call("session.cwd", {}, timeout=10)["cwd"]
    r = run(a, f"eval 'cd {tmp_path}; export SHOAL_T_OK_FAIL=1'; false")
    assert r["value"]["ok"] is False
    assert "SHOAL_T_OK_FAIL" not in names(a)
    assert a.call("session.cwd", {}, timeout=10)["cwd"] == before


def test_a_forged_report_can_do_no_more_than_the_grants(agent, tmp_path):
    star = agent("agent:star")
    marker = tmp_path / "pwned"
    forged = (
        f"printf '/\\0BASH_FUNC_true%%%%=() {{ touch {marker}; }}\\0LD_PRELOAD=/x.so\\0"
        f"SHOAL_T_FORGED=ok\\0' >&{STATE_FD}"
    )
    r = run(star, forged)
    assert r["value"]["ok"] is True
    refused = r["value"]["env_refused"]
    assert "BASH_FUNC_true%%" in refused and "LD_PRELOAD" in refused
    env = names(star)
    assert "BASH_FUNC_true%%" not in env and "LD_PRELOAD" not in env
    assert "SHOAL_T_FORGED" in env  # within the grants: the same as `export` would do
    assert out_text(run(star, "true; echo done")) == "done\n"
    assert not marker.exists()
    narrow = agent("agent:narrow")
    r = run(narrow, forged)
    assert "SHOAL_T_FORGED" in r["value"]["env_refused"]
    assert "SHOAL_T_FORGED" not in names(narrow)
