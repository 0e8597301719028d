"""exec (run / plan, stmt / value, background, wait budget)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....protocol.errors import invalid_params
from ....protocol.params import EXEC
from ...exec.calls import RunOptions
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


@method("exec", EXEC, blocking=True)
def exec_(call: Call, params: dict) -> dict:
    src = params["src"]
    if "\x00" in src:  # bash -c cannot take a NUL byte; say so instead of failing inside spawn
        raise invalid_params("src", "must not contain NUL characters")
    opts = RunOptions.from_params(params)
    call.kernel.state_budget.check()  # a clear -32031 before the state dir fills the disk
    if params.get("mode", "run") == "plan":
        return call.kernel.exec.plan(call.who, src)
    return call.kernel.exec.run(call.who, src, opts, call)
