"""A kernel whose token agent needs approval for any program but echo, true and sleep.

``approving_kernel()`` yields (kernel, the agent's token, a temp dir): run a facade with
``SHOAL_TOKEN`` set to the token and ``basename`` (say) asks for approval.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shoal_mcp.tokens import TokenStore

from .kernel import KernelProcess
from .tmp import short_tmp

APPROVAL_POLICY = """
[principal."agent:w"]
proc_spawn = ["echo", "true", "sleep"]
ungranted = "ask"
opaque = "ask"
[principal."agent:w".fs]
read = ["{work}/**"]
write = ["{work}/**"]
"""


@contextmanager
def approving_kernel(prefix: str = "shap") -> Iterator[tuple[KernelProcess, str, Path]]:
    with short_tmp(prefix) as tmp:
        work = tmp / "work"
        work.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(APPROVAL_POLICY.format(work=work))
        kernel = KernelProcess(tmp, "--policy", str(policy))
        token = TokenStore(kernel.state / "tokens.json").create("agent:w")[1]
        kernel.start()
        try:
            yield kernel, token, tmp
        finally:
            kernel.stop()
