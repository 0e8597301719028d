"""The kernel's table lock stays a leaf (kernel/owner/tables.py).

``TABLES`` is shared by twenty tables, so one section that waits, or takes another
lock, would stall or deadlock every other: a thread holding a session's lock and
wanting ``TABLES`` against one holding ``TABLES`` and wanting that session's lock.
This test reads every ``with TABLES:`` block in ``kernel/`` and refuses what would
break the rule: a nested ``with`` (another lock or a transaction), an ``acquire``, and
calls that wait (the database, socket writes, joins, sleeps). A condition of
``TABLES`` itself may wait inside it, since its wait releases ``TABLES``
(``threading.Condition(TABLES)``: the ready shells, the server's worker count, a
subscription's queue, the database's free connections, the ref file's writer).
"""

from __future__ import annotations

import ast
from pathlib import Path

KERNEL = Path(__file__).resolve().parents[1] / "src" / "shoal_mcp" / "kernel"

WAITING_CALLS = frozenset(
    {
        "acquire",
        "query",
        "transaction",
        "claim",
        "sendall",
        "recv",
        "join",
        "sleep",
        "select",
        "communicate",
        "result",
        "fsync",
    }
)
"""Calls that can wait for another thread, a process or the disk's flush."""

CONDITIONS_OF_TABLES = frozenset({"_made", "_workers_done", "_cond", "_free"})
"""Attributes holding ``threading.Condition(TABLES)``: their ``wait`` releases it."""


def _is_tables(item: ast.withitem) -> bool:
    return isinstance(item.context_expr, ast.Name) and item.context_expr.id == "TABLES"


def _is_suppress(item: ast.withitem) -> bool:
    """``with contextlib.suppress(...)``: no lock, no wait."""
    expr = item.context_expr
    return isinstance(expr, ast.Call) and _called_name(expr)[0] == "suppress"


def _called_name(call: ast.Call) -> tuple[str | None, str | None]:
    """(the method or function name, the attribute it was called on, if any)."""
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value.attr if isinstance(func.value, ast.Attribute) else None
        return func.attr, owner
    if isinstance(func, ast.Name):
        return func.id, None
    return None, None


def violations(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.With) and any(_is_tables(i) for i in node.items)):
            continue
        for inner in (n for stmt in node.body for n in ast.walk(stmt)):
            line = f"{where}:{getattr(inner, 'lineno', node.lineno)}"
            if isinstance(inner, ast.With | ast.AsyncWith):
                if all(_is_suppress(i) for i in inner.items):
                    continue
                found.append(f"{line}: a `with` inside `with TABLES:`")
            elif isinstance(inner, ast.Await):
                found.append(f"{line}: an await inside `with TABLES:`")
            elif isinstance(inner, ast.Call):
                name, owner = _called_name(inner)
                if name in ("wait", "wait_for") and owner in CONDITIONS_OF_TABLES:
                    continue
                if name == "join" and owner == "path":
                    continue  # os.path.join
                if name in WAITING_CALLS or name in ("wait", "wait_for"):
                    found.append(f"{line}: `{name}()` may wait inside `with TABLES:`")
    return found


def test_every_tables_section_is_a_leaf() -> None:
    found = []
    sections = 0
    for path in sorted(KERNEL.rglob("*.py")):
        source = path.read_text()
        sections += source.count("with TABLES:")
        found += violations(source, path.relative_to(KERNEL).as_posix())
    assert sections >= 60, "the test no longer sees the sections it guards"
    assert not found, "\n".join(found)


def test_the_check_sees_what_it_refuses() -> None:
    source = (
        "def f(self):\n"
        "    with TABLES:\n"
        "        with self.other_lock:\n"
        "            pass\n"
        "        with contextlib.suppress(OSError):\n"
        "            os.unlink(os.path.join('a', 'b'))\n"
        "        self.db.query('SELECT 1')\n"
        "        self._made.wait(1)\n"
        "        self.sock.sendall(b'x')\n"
        "        self.table[1] = 2\n"
    )
    found = violations(source, "m.py")
    assert [f.split(": ", 1)[0] for f in found] == ["m.py:3", "m.py:7", "m.py:9"]
