"""A kernel with token principals that have no grants, for the budget tests and the soak.

``token_kernel()`` yields a ``BudgetEnv``: the kernel (started with a policy file that
gives ``agent:small`` tiny budgets and a ``[kernel]`` table when asked), the bearer of
each principal, and ``raw(session, principal)`` for an attached ``RawConn``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from shoal_mcp.protocol.limits import MiB
from shoal_mcp.tokens import TokenStore

from .kernel import KernelProcess
from .tmp import short_tmp
from .wire import RawConn

PRINCIPALS = ("agent:flood", "agent:small", "agent:other", "agent:wide", "agent:slow")
SMALL_POLICY = f"""
[principal."agent:small"]
ungranted = "ask"
max_channel_bytes = {1 * MiB}
max_plans = 4
max_plan_bytes = {2 * MiB}
max_connections = 3

[principal."agent:wide"]
max_channel_bytes = {16 * MiB}
"""


class BudgetEnv:
    def __init__(self, kernel: KernelProcess, tokens: dict[str, str]) -> None:
        self.kernel = kernel
        self.tokens = tokens

    @contextlib.contextmanager
    def raw(self, session: str, principal: str | None = "agent:flood") -> Iterator[RawConn]:
        """An attached raw connection of ``principal`` (the local human when None)."""
        conn = RawConn(self.kernel.socket, keep_frames=False)
        try:
            params: dict = {"session": session}
            if principal is not None:
                params["token"] = self.tokens[principal]
            reply = conn.call("session.attach", params)
            assert "result" in reply, reply
            yield conn
        finally:
            conn.close()


@contextlib.contextmanager
def token_kernel(
    prefix: str = "shbu", kernel_table: str = "", *args: str, extra_policy: str = ""
) -> Iterator[BudgetEnv]:
    """A kernel whose policy defines only ``agent:small`` (tiny budgets, no grants);
    ``kernel_table`` is the body of an optional ``[kernel]`` table, ``extra_policy`` more
    principal tables (e.g. for ``agent:slow``)."""
    with short_tmp(prefix) as tmp:
        policy = Path(tmp) / "policy.toml"
        text = (
            SMALL_POLICY + extra_policy + (f"\n[kernel]\n{kernel_table}\n" if kernel_table else "")
        )
        policy.write_text(text)
        kernel = KernelProcess(tmp, "--policy", str(policy), *args)
        store = TokenStore(kernel.state / "tokens.json")
        tokens = {p: store.create(p)[1] for p in PRINCIPALS}
        kernel.start()
        try:
            yield BudgetEnv(kernel, tokens)
        finally:
            kernel.stop()
