"""PTYs through a live ``shoal-mcp`` (docs/protocol.md, PTYs): issue #7 evidence.

A real kernel on a temporary socket and a real ``python -m shoal_mcp.facade`` driven
by the official MCP SDK client over stdio (``tests.support.sdk_client.McpStdioClient``). Real
programs run in real pseudoterminals: a Python REPL, a curses TUI, bash with a job to
interrupt, programs that exit, a 1000x1000 screen, and resource subscriptions.
No fixed sleeps except where the test proves that *nothing* arrives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from shoal_mcp.kernel.config.limits import PTY_EVENT_INTERVAL_S
from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.limits import TEXT_LIMIT, VALUE_HARD_CAP
from tests.support.facade import facade_env
from tests.support.kernel import running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import children, pid_alive, proc_comm, proc_gone
from tests.support.sdk_client import MCPError, McpStdioClient

CURSES_BOX = Path(__file__).resolve().parent / "support" / "curses_box.py"
DEADLINE_S = 15.0
UPDATED = "notifications/resources/updated"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def mcp():
    """One kernel + one facade (SDK client over stdio) for the whole module."""
    with running_kernel(prefix="shoal-mp-") as kernel:
        client = McpStdioClient(
            facade_env(kernel), cwd=kernel.tmp, stderr_path=kernel.tmp / "facade.stderr"
        )
        try:
            client.start()
            yield client
        finally:
            client.close()


@pytest.fixture
def ptys(mcp):
    """Open PTYs through the facade; whatever a test leaves open is closed afterwards."""
    opened: list[str] = []

    def open_(cmd: str, *args: str, **kw) -> dict:
        result = mcp.tool("shoal_pty_open", {"cmd": cmd, "args": list(args), **kw})
        opened.append(result["pty_id"])
        return result

    yield open_
    for pty_id in opened:
        mcp.call_tool("shoal_pty_close", {"pty_id": pty_id})  # already closed: isError, fine


# --------------------------------------------------------------------------- helpers


def read(mcp: McpStdioClient, pty_id: str, **kw) -> dict:
    return mcp.tool("shoal_pty_read", {"pty_id": pty_id, **kw})


def wait_screen(mcp: McpStdioClient, pty_id: str, pred: Callable[[dict], object], what: str,
                timeout: float = DEADLINE_S) -> dict:  # fmt: skip
    """Poll ``shoal_pty_read`` until ``pred(result)`` holds; the last screen on failure."""
    deadline = time.monotonic() + timeout
    while True:
        result = read(mcp, pty_id)
        if pred(result):
            return result
        if time.monotonic() > deadline:
            screen = "\n".join(r for r in result.get("screen", []) if r)
            raise AssertionError(f"timed out waiting for {what}; last read: alive={result.get('alive')} "
                                 f"exit={result.get('exit')}\n{screen[-3000:]}")  # fmt: skip
        time.sleep(0.03)


def wait_for(pred: Callable[[], object], what: str, timeout: float = DEADLINE_S):
    return wait_until(pred, timeout, what=what)


def proc_children(ppid: int, name: str) -> list[int]:
    """Pids of live processes named ``name`` whose parent is ``ppid``."""
    return [p for p in children(ppid) if proc_comm(p) == name and pid_alive(p)]


def pty_num(pty_id: str) -> str:
    return pty_id.split(":", 1)[1]


def text_of(result) -> str:
    assert result.content and result.content[0].type == "text", result
    return result.content[0].text


# --------------------------------------------------------------------------- 1. REPL


def test_python_repl_answers(mcp, ptys):
    opened = ptys("python3", "-q")
    assert opened["pty_id"].startswith("pty:") and opened["pid"] > 0
    assert (opened["cols"], opened["rows"]) == (80, 24)
    pty_id = opened["pty_id"]
    wait_screen(
        mcp, pty_id, lambda r: any(row.startswith(">>>") for row in r["screen"]), "the >>> prompt"
    )

    sent = mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": ["6*7", {"key": "Enter"}]})
    assert not sent.get("dropped"), sent

    def answered(r: dict) -> bool:  # "42", then the next prompt with the cursor on it
        rows = r["screen"]
        return "42" in rows and rows[rows.index("42") + 1 :][:1] == [">>>"] and r["cursor"] == {
            "row": rows.index("42") + 1, "col": 4, "hidden": False
        }  # fmt: skip

    result = wait_screen(mcp, pty_id, answered, "42 and the next prompt")
    assert result["alive"] is True and "exit" not in result
    rows = result["screen"]
    assert rows[rows.index("42") - 1].endswith("6*7")  # the echoed input line
    assert len(rows) == 24  # one entry per terminal row

    # The text content carries the same screen for clients that ignore structuredContent.
    raw = mcp.call_tool("shoal_pty_read", {"pty_id": pty_id})
    assert raw.is_error is False
    assert '"42"' in text_of(raw)
    assert raw.structured_content["changed"] is False  # nothing happened since the last read


# --------------------------------------------------------------------------- 2. curses + resize


def box(w: int, h: int) -> Callable[[dict], bool]:
    edge = "+" + "-" * (w - 2) + "+"

    def check(r: dict) -> bool:
        s = r["screen"]
        return (
            (r["cols"], r["rows"]) == (w, h) and len(s) == h and s[0] == edge and s[h - 1] == edge
            and all(row.startswith("|") and row.endswith("|") and len(row) == w for row in s[2 : h - 1])
            and s[1] == f"|size {w}x{h}".ljust(w - 1) + "|"
        )  # fmt: skip

    return check


def test_curses_box_redraws_on_resize(mcp, ptys):
    opened = ptys("python3", str(CURSES_BOX), cols=40, rows=12)
    pty_id = opened["pty_id"]
    wait_screen(mcp, pty_id, box(40, 12), "the 40x12 box")

    for cols, rows in ((100, 30), (20, 5), (57, 19)):
        resized = mcp.tool("shoal_pty_resize", {"pty_id": pty_id, "cols": cols, "rows": rows})
        assert resized == {"pty_id": pty_id, "cols": cols, "rows": rows}
        wait_screen(mcp, pty_id, box(cols, rows), f"the {cols}x{rows} box")

    listed = {p["pty_id"]: p for p in mcp.tool("shoal_pty_list")["ptys"]}
    assert (listed[pty_id]["cols"], listed[pty_id]["rows"]) == (57, 19)

    mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": "q"})
    done = wait_screen(mcp, pty_id, lambda r: not r["alive"], "curses_box to quit on q")
    assert done["exit"] == {"status": 0}


# --------------------------------------------------------------------------- 3. Ctrl-C


def test_ctrl_c_interrupts_foreground_job(mcp, ptys):
    opened = ptys("bash", "--noprofile", "--norc", env={"PS1": "shoal$ "})
    pty_id, bash_pid = opened["pty_id"], opened["pid"]

    def prompt_after(marker: str | None) -> Callable[[dict], bool]:
        def check(r: dict) -> bool:
            rows = [row.rstrip() for row in r["screen"]]
            start = next((i for i, row in enumerate(rows) if marker in row), None) if marker else -1
            return start is not None and any(row == "shoal$" for row in rows[start + 1 :])

        return check

    wait_screen(mcp, pty_id, prompt_after(None), "the bash prompt")
    mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": ["sleep 100", {"key": "Enter"}]})
    (sleep_pid,) = wait_for(lambda: proc_children(bash_pid, "sleep"), "a sleep child of bash")

    mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": {"key": "Ctrl-C"}})
    wait_for(lambda: proc_gone(sleep_pid), "the sleep process to be gone")
    result = wait_screen(mcp, pty_id, prompt_after("sleep 100"), "the prompt after ^C")
    assert result["alive"] is True  # the shell survives, only its job was interrupted
    assert proc_children(bash_pid, "sleep") == []

    # The shell still works after the interrupt.
    mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": ["echo $((40+2))", {"key": "Enter"}]})
    wait_screen(mcp, pty_id, lambda r: "42" in r["screen"], "echo output")


# --------------------------------------------------------------------------- 4. exit status


def test_exited_program_reports_status(mcp, ptys):
    opened = ptys("sh", "-c", "exit 3")
    pty_id = opened["pty_id"]
    result = wait_screen(mcp, pty_id, lambda r: not r["alive"], "sh to exit")
    assert result["exit"] == {"status": 3}
    assert result["pid"] == opened["pid"]
    # An exited PTY stays listed (its last screen readable) until closed.
    listed = {p["pty_id"]: p for p in mcp.tool("shoal_pty_list")["ptys"]}
    assert listed[pty_id]["alive"] is False and listed[pty_id]["exit"] == {"status": 3}
    # Typing into a PTY whose program is gone is an error the model can read.
    sent = wait_for(
        lambda: (
            (r := mcp.call_tool("shoal_pty_send", {"pty_id": pty_id, "input": "x"})).is_error and r
        ),
        "send to an exited PTY to fail",
    )
    assert sent.structured_content["error"]["code"] == ErrorCode.INVALID_PARAMS
    closed = mcp.tool("shoal_pty_close", {"pty_id": pty_id})
    assert closed["closed"] is True and closed["exit"] == {"status": 3}


# --------------------------------------------------------------------------- 5. close


def test_close_leaves_no_process(mcp, ptys):
    opened = ptys("sleep", "1000")
    pty_id, pid = opened["pty_id"], opened["pid"]
    proc = Path(f"/proc/{pid}")
    assert (proc / "comm").read_text().strip() == "sleep"
    assert pty_id in {p["pty_id"] for p in mcp.tool("shoal_pty_list")["ptys"]}
    listing = mcp._run(mcp.session.list_resources)
    assert f"shoal://pty/{pty_num(pty_id)}" in {str(r.uri) for r in listing.resources}

    closed = mcp.tool("shoal_pty_close", {"pty_id": pty_id})
    assert closed["pty_id"] == pty_id and closed["closed"] is True
    assert closed["exit"] == {"signal": 1}  # SIGHUP, like closing a terminal window
    assert not proc.exists(), "close returned but the process is still there (or unreaped)"
    assert pty_id not in {p["pty_id"] for p in mcp.tool("shoal_pty_list")["ptys"]}

    again = mcp.call_tool("shoal_pty_read", {"pty_id": pty_id})
    assert again.is_error is True
    assert again.structured_content["error"]["code"] == ErrorCode.UNKNOWN_PTY


# --------------------------------------------------------------------------- 6. 64 KiB bound

BIG = 1000
FILL = (
    "import sys, time\n"
    "for i in range(1200):\n"
    "    sys.stdout.write((f'{i:05d} ' + 'abcdefghijklmnopqrstuvwxyz' * 40)[:1000])\n"
    "sys.stdout.write('DONE'); sys.stdout.flush(); time.sleep(120)\n"
)


def check_bounds(result) -> dict:
    assert result.is_error is False
    text = text_of(result)
    assert len(text.encode()) <= TEXT_LIMIT
    assert len(orjson.dumps(result.structured_content)) <= VALUE_HARD_CAP
    return result.structured_content


def test_huge_screen_reads_stay_under_64_kib(mcp, ptys):
    opened = ptys("python3", "-c", FILL, cols=BIG, rows=BIG)
    assert (opened["cols"], opened["rows"]) == (BIG, BIG)
    pty_id = opened["pty_id"]

    deadline = time.monotonic() + 30
    reads = 0
    while True:  # every read on the way, while the screen fills, is bounded
        out = check_bounds(mcp.call_tool("shoal_pty_read", {"pty_id": pty_id}))
        reads += 1
        if any(row.startswith("DONE") for row in out["screen"]):
            break
        assert time.monotonic() < deadline, "the 1000x1000 screen did not fill in time"
        time.sleep(0.05)
    assert out["alive"] is True
    # A full 1000x1000 screen is ~1 MB: the result is a window of rows around the cursor.
    win = out["window"]
    assert out["cursor"]["row"] == BIG - 1
    assert win["top"] + len(out["screen"]) - 1 >= out["cursor"]["row"] >= win["top"]
    assert len(out["screen"]) == win["rows"] >= 24
    assert out["screen"][-1] == "DONE" and out["screen"][-2].startswith("01199 abc")
    assert (out["cols"], out["rows"]) == (BIG, BIG)

    # With scrollback asked for, still bounded; scrollback is the newest lines above the screen.
    sb = check_bounds(mcp.call_tool("shoal_pty_read", {"pty_id": pty_id, "scrollback": 10000}))
    assert sb["scrollback"] and sb["scrollback_total"] >= 200
    assert sb["scrollback"][-1].startswith(f"{1200 - BIG:05d} ")

    # The resource view of the same screen is bounded too.
    resource = mcp.read_resource(f"shoal://pty/{pty_num(pty_id)}")
    assert all(len(c.text.encode()) <= TEXT_LIMIT for c in resource.contents)
    assert reads >= 1


# --------------------------------------------------------------------------- 7. subscriptions


def test_subscription_updates_and_unsubscribe(mcp, ptys):
    pty_id = ptys("cat")["pty_id"]
    uri = f"shoal://pty/{pty_num(pty_id)}"
    mcp.subscribe(uri)
    before = len(mcp.received(UPDATED, uri=uri))

    mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": ["hello-sub", {"key": "Enter"}]})
    mcp.wait_for(UPDATED, count=before + 1, uri=uri)

    def resource_screen() -> list[str]:
        res = mcp.read_resource(uri)
        (content,) = res.contents
        assert str(content.uri) == uri and content.mime_type == "application/json"
        return orjson.loads(content.text)["screen"]

    wait_for(lambda: resource_screen().count("hello-sub") == 2, "echo + cat output on the resource")

    # Quiesce (the throttled trailing-edge event), then unsubscribe: nothing more arrives.
    def quiet() -> bool:
        last = mcp.received(UPDATED, uri=uri)
        return bool(last) and time.monotonic() - last[-1].at > 3 * PTY_EVENT_INTERVAL_S

    wait_for(quiet, "updates to settle")
    mcp.unsubscribe(uri)
    settled = len(mcp.received(UPDATED, uri=uri))
    mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": ["after-unsub", {"key": "Enter"}]})
    wait_screen(mcp, pty_id, lambda r: r["screen"].count("after-unsub") == 2, "cat output")
    time.sleep(1.0)  # proving a negative: give a stray update every chance to arrive
    assert len(mcp.received(UPDATED, uri=uri)) == settled

    # Subscribing again works (the silence above was the unsubscribe, not a dead pipeline).
    mcp.subscribe(uri)
    mcp.tool("shoal_pty_send", {"pty_id": pty_id, "input": ["resub", {"key": "Enter"}]})
    mcp.wait_for(UPDATED, count=settled + 1, uri=uri)
    mcp.unsubscribe(uri)


# --------------------------------------------------------------------------- 8. errors


@pytest.mark.parametrize(
    "tool", ["shoal_pty_read", "shoal_pty_send", "shoal_pty_resize", "shoal_pty_close"]
)
def test_unknown_pty_is_an_error_result(mcp, tool):
    args = {"pty_id": "pty:999999"}
    if tool == "shoal_pty_send":
        args["input"] = "x"
    if tool == "shoal_pty_resize":
        args.update(cols=10, rows=10)
    result = mcp.call_tool(tool, args)
    assert result.is_error is True
    error = result.structured_content["error"]
    assert error["code"] == ErrorCode.UNKNOWN_PTY == -32022
    assert "pty:999999" in text_of(result)


@pytest.mark.parametrize("dims", [{"cols": 0}, {"cols": 1001}, {"rows": 0}, {"rows": 1001}])
def test_bad_dimensions_are_invalid_params(mcp, ptys, dims):
    with pytest.raises(MCPError) as info:
        mcp.call_tool("shoal_pty_open", {"cmd": "cat", **dims})
    assert info.value.code == ErrorCode.INVALID_PARAMS == -32602
    assert next(iter(dims)) in info.value.message

    pty_id = ptys("cat", cols=10, rows=10)["pty_id"]
    with pytest.raises(MCPError) as info:
        mcp.call_tool("shoal_pty_resize", {"pty_id": pty_id, "cols": 10, "rows": 10, **dims})
    assert info.value.code == -32602
    assert read(mcp, pty_id)["cols"] == 10  # nothing was resized


def test_unknown_pty_resource_is_not_found(mcp):
    with pytest.raises(MCPError) as info:
        mcp.read_resource("shoal://pty/999999")
    assert info.value.code == -32002


def test_unknown_pty_subscription_is_not_found(mcp):
    for uri in ("shoal://pty/999999", "shoal://pty/not-a-pty"):
        with pytest.raises(MCPError) as info:
            mcp.subscribe(uri)
        assert info.value.code == -32002, (uri, info.value.code, info.value.message)


def test_spawn_failure_is_an_error_result(mcp):
    result = mcp.call_tool("shoal_pty_open", {"cmd": "/nonexistent/shoal-no-such-program"})
    assert result.is_error is True
    assert result.structured_content["error"]["code"] == ErrorCode.PTY_SPAWN == -32023
