"""A shared session: a sandboxed principal's cd and export are its own (issue 25).

The human's ``shoal`` in a project lands in the agent's session.  Before, an agent could
``cd`` into its temp dir and leave a Makefile there for the human's next ``shoal exec
make``, or export ``GIT_CONFIG_*`` into the human's ``git status``.  Now a sandboxed
principal's changes go to its own overlay: it sees them, nobody else does, the human
sees them listed (``kernel.status``) and can take them over (``session.adopt``).
Live, through a real kernel, sandboxed agents and the unconfined local human.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.protocol.errors import RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess
from tests.support.results import out_text
from tests.support.tmp import short_tmp

pytestmark = pytest.mark.landlock

POLICY = """
[principal."agent:dev"]
proc_spawn = ["*"]
env_write = ["*", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0", "PATH"]
env_read = ["*"]
opaque = "allow"
ungranted = "ask"
[principal."agent:dev".fs]
read = ["{proj}/**"]
write = ["{proj}/**"]

[principal."agent:other"]
proc_spawn = ["*"]
env_write = ["*"]
env_read = ["*"]
opaque = "allow"
ungranted = "ask"
[principal."agent:other".fs]
read = ["{proj}/**"]
write = ["{proj}/**"]
"""
SESSION = "shared-proj"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[KernelProcess, dict[str, str], Path]]:
    with short_tmp("shss") as tmp:
        proj = tmp / "proj"
        proj.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(POLICY.format(proj=proj))
        kernel = KernelProcess(tmp, "--policy", str(policy), "--sandbox", "required")
        store = TokenStore(kernel.state / "tokens.json")
        tokens = {p: store.create(p)[1] for p in ("agent:dev", "agent:other")}
        kernel.start()
        try:
            yield kernel, tokens, proj
        finally:
            kernel.stop()


def _exec(kernel: KernelProcess, token: str | None, src: str, session: str = SESSION) -> str:
    c = kernel.client(session, token=token)
    try:
        return out_text(c.call("exec", {"src": src, "position": "value"}, timeout=60))
    finally:
        c.close()


def test_agent_changes_stay_its_own_until_the_human_adopts_them(world) -> None:
    kernel, tokens, proj = world
    human_cwd = _exec(kernel, None, f"cd {proj} && pwd").strip()
    assert human_cwd == str(proj)
    agent = tokens["agent:dev"]
    # The agent moves into its private temp dir, plants a Makefile, and exports what
    # would make the human's git run its code.
    planted = _exec(
        kernel,
        agent,
        'cd "$TMPDIR" && printf "all:\\n\\ttouch PWNED\\n" > Makefile && '
        "export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.fsmonitor "
        "GIT_CONFIG_VALUE_0='touch PWNED; false' FOO=agent PATH=$TMPDIR:$PATH && pwd",
    ).strip()
    assert planted != str(proj)
    # The agent sees its own state in its next exec ...
    seen = _exec(kernel, agent, 'pwd; echo "$FOO"; echo "$GIT_CONFIG_COUNT"').split()
    assert seen == [planted, "agent", "1"]
    # ... the human and another sandboxed agent do not.
    for token in (None, tokens["agent:other"]):
        got = _exec(kernel, token, 'pwd; echo "foo=$FOO git=$GIT_CONFIG_COUNT"; echo "$PATH"')
        lines = got.splitlines()
        assert lines[0] == str(proj), got
        assert lines[1] == "foo= git=", got
        assert planted not in lines[2], got
    human = kernel.client(SESSION)
    try:
        status = human.call("kernel.status")
        overlay = status["overlays"][SESSION]
        assert [o["principal"] for o in overlay] == ["agent:dev"]
        assert overlay[0]["cwd"] == planted
        assert {"FOO", "GIT_CONFIG_COUNT", "PATH"} <= set(overlay[0]["set"])
        # Only an approver adopts; an agent cannot push its changes onto the session.
        dev = kernel.client(SESSION, token=agent)
        try:
            with pytest.raises(RpcError) as refused:
                dev.call("session.adopt", {"principal": "agent:dev"})
            assert refused.value.code == -32010
        finally:
            dev.close()
        with pytest.raises(RpcError) as none:
            human.call("session.adopt", {"principal": "agent:other"})
        assert none.value.code == -32602
        adopted = human.call("session.adopt", {"principal": "agent:dev"})
        assert adopted["cwd"] == planted and "FOO" in adopted["set"]
        assert SESSION not in human.call("kernel.status")["overlays"]
    finally:
        human.close()
    # Taken over: now everyone's state (the human chose it), and the agent's view is the
    # session's again.  Another sandboxed principal still cannot enter agent:dev's
    # private temp dir: it is not in its view.
    assert _exec(kernel, None, 'pwd; echo "$FOO"').split() == [planted, "agent"]
    assert _exec(kernel, agent, "pwd").strip() == planted
    assert _exec(kernel, tokens["agent:other"], "pwd").strip() != planted


def test_overlays_survive_a_kernel_restart(world) -> None:
    kernel, tokens, proj = world
    agent, session = tokens["agent:other"], "restart-proj"
    _exec(kernel, None, f"cd {proj}", session)
    _exec(kernel, agent, "mkdir -p sub && cd sub && export ONLY_MINE=yes", session)
    kernel.stop()
    kernel.start()
    mine = _exec(kernel, agent, 'pwd; echo "$ONLY_MINE"', session).split()
    assert mine == [f"{proj}/sub", "yes"]
    assert _exec(kernel, None, 'pwd; echo "[$ONLY_MINE]"', session).split() == [str(proj), "[]"]
