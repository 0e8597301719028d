"""exec (run / plan, stmt / value, background, wait budget)."""

from __future__ import annotations

from ....protocol.errors import invalid_params
from ...exec.service import RunOptions
from ...values.elision import ELIDE_SCHEMA
from ..registry import BOOL, TIMEOUT_MS, method, obj

SRC = {"type": "string", "maxLength": 1 << 20, "description": "bash source"}

EXEC_SCHEMA = obj(
    {
        "src": SRC,
        "mode": {"type": "string", "enum": ["run", "plan"]},
        "position": {"type": "string", "enum": ["stmt", "value"]},
        "background": BOOL,
        "timeout_ms": TIMEOUT_MS,
        "elide": ELIDE_SCHEMA,
    },
    ("src",),
)


@method("exec", EXEC_SCHEMA, blocking=True)
def exec_(call, params):
    src = params["src"]
    if "\x00" in src:  # bash -c cannot take a NUL byte; say so instead of failing inside spawn
        raise invalid_params("src", "must not contain NUL characters")
    opts = RunOptions.from_params(params)
    if params.get("mode", "run") == "plan":
        return call.kernel.exec.plan(call.who, src)
    return call.kernel.exec.run(call.who, src, opts, call)
