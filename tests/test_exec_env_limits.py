"""A state that cannot be exec'd is refused when it is made (issue 31, "a poisoned session").

Live: a real kernel. ``export BIG=<1 MiB>`` (one string over Linux's MAX_ARG_STRLEN) and
24 × 100 KiB (the total over ``ENV_TOTAL_MAX``) are refused with a clear warning and never
stored, so the next exec, and one after a kernel restart, still starts. A session stored
poisoned (by an older shoal) is repaired when it is loaded.
"""

from __future__ import annotations

import sqlite3

from shoal_mcp.kernel.config.limits import ENV_STRING_MAX, ENV_TOTAL_MAX
from shoal_mcp.kernel.store.sessions import encode_env
from shoal_mcp.protocol.limits import KiB, MiB
from tests.support.kernel import close_client
from tests.support.results import out_text

BIG = f"export BIG=$(head -c {MiB} /dev/zero | tr '\\0' x)"
MANY = f"for i in $(seq 1 24); do export V$i=$(head -c {100 * KiB} /dev/zero | tr '\\0' y); done"


def _exec(c, src: str) -> dict:
    return c.call("exec", {"src": src}, timeout=120)


def test_an_export_over_the_string_limit_is_refused_and_not_stored(kernel_factory):
    k = kernel_factory()
    c = k.client("big")
    try:
        made = _exec(c, f"export KEEP=1; {BIG}")
        value = made["value"]
        assert value["ok"] is True and "BIG" in value["env_refused"]
        warning = " ".join(value["warnings"])
        assert "export BIG refused" in warning and str(ENV_STRING_MAX) in warning
        after = _exec(c, 'echo "${#BIG} $KEEP"')
        assert after["value"]["status"] == 0 and out_text(after) == "0 1\n"
        names = c.call("session.env", {}, timeout=10)["names"]
        assert "BIG" not in names and "KEEP" in names
    finally:
        close_client(c)
    k.stop()
    k.start()
    c = k.client("big")
    try:
        assert _exec(c, "true")["value"]["status"] == 0  # not poisoned across a restart
    finally:
        close_client(c)


def test_exports_over_the_total_limit_are_refused_largest_first(kernel_factory):
    k = kernel_factory()
    c = k.client("many")
    try:
        made = _exec(c, MANY)
        value = made["value"]
        refused = value["env_refused"]
        assert refused and all(n.startswith("V") for n in refused)
        assert str(ENV_TOTAL_MAX) in " ".join(value["warnings"])
        after = _exec(c, "env | wc -c")
        assert after["value"]["status"] == 0, after
        assert int(out_text(after)) <= ENV_TOTAL_MAX
        assert _exec(c, "unset V1")["value"]["status"] == 0
    finally:
        close_client(c)


def test_a_poisoned_stored_session_is_repaired_on_load(kernel_factory):
    k = kernel_factory()
    c = k.client("poisoned")
    try:
        _exec(c, "export SMALL=kept")
    finally:
        close_client(c)
    k.stop()
    db = sqlite3.connect(k.state / "journal.sqlite3")
    with db:
        (raw,) = db.execute("SELECT env FROM sessions WHERE name = 'poisoned'").fetchone()
        env = dict(item.split("=", 1) for item in bytes(raw).decode().split("\0") if item)
        env["BIG"] = "x" * MiB  # what shoal 0.1 stored after `export BIG=<1 MiB>`
        db.execute("UPDATE sessions SET env = ? WHERE name = 'poisoned'", (encode_env(env),))
    db.close()
    k.start()
    c = k.client("poisoned")
    try:
        ran = _exec(c, 'echo "${#BIG} $SMALL"')
        assert ran["value"]["status"] == 0 and out_text(ran) == "0 kept\n", ran
        assert any("dropped BIG" in w for w in ran["value"]["warnings"]), ran["value"]
    finally:
        close_client(c)
