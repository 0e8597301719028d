"""Find across runs, live (issue 33; docs/protocol.md, Find across runs): a real kernel
with a policy file and token principals, driven through ``shoal-mcp`` and the ``shoal``
CLI. 200 runs in one session; one unique line in run 137; failed runs; time bounds;
other principals' outputs; pruned outputs; continuations that visit every hit once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import orjson
import pytest

from shoal_mcp.tokens import TokenStore
from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import KernelProcess, child_env, close_client, running_kernel
from tests.support.results import structured
from tests.support.tmp import short_tmp
from tests.test_cli import shoal

SESSION = "find-200"
RUNS = 200
UNIQUE = "unique line 4f2a-137"
FAILED = tuple(i for i in range(1, RUNS + 1) if i % 25 == 0)
TWO_HITS = tuple(i for i in range(1, RUNS + 1) if i % 10 == 3)
ECON_BYTES = 4096
"""The whole ``tools/call`` result for 50 hits (issue 33, Economy)."""

GRANTS = """
proc_spawn = ["echo", "printf", "true", "false"]
ungranted = "deny"
opaque = "deny"
"""
POLICY = """
[principal."agent:a"]
{grants}
journal_read = "own"
[principal."agent:a".fs]
read = ["{work}/**"]
write = ["{work}/**"]

[principal."agent:b"]
{grants}
journal_read = "own"
[principal."agent:b".fs]
read = ["{work}/**"]
write = ["{work}/**"]

[principal."agent:watcher"]
proc_spawn = ["true"]
journal_read = "all"
"""
PRINCIPALS = ("agent:a", "agent:b", "agent:watcher")


def source(i: int) -> str:
    """Run ``i`` of the 200: one "ok" line (two for TWO_HITS), a failure, or the unique line."""
    if i == 137:
        return f"echo '{UNIQUE}'"
    if i in FAILED:
        return f"echo 'run {i} bad' >&2; exit 3"
    if i in TWO_HITS:
        return f"printf 'run {i} ok\\nsecond ok\\n'"
    return f"echo 'run {i} ok'"


def ok_hits() -> set[tuple[int, int]]:
    """(run, line) of every line matching "ok" in the 200 runs."""
    hits = {(i, 1) for i in range(1, RUNS + 1) if i != 137 and i not in FAILED}
    return hits | {(i, 2) for i in TWO_HITS}


class Env:
    def __init__(self, kernel: KernelProcess, tokens: dict[str, str], mid: float) -> None:
        self.kernel = kernel
        self.tokens = tokens
        self.mid = mid  # between run 100 and run 101
        self.cli = child_env(
            {
                "SHOAL_SOCKET": str(kernel.socket),
                "SHOAL_STATE_DIR": str(kernel.state),
                "SHOAL_NO_AUTOSTART": "1",
            }
        )

    def mcp(self, session: str = SESSION, token: str | None = None) -> McpPipe:
        extra = {"SHOAL_TOKEN": self.tokens[token]} if token else {}
        pipe = McpPipe(facade_env(self.kernel, session, **extra))
        pipe.initialize()
        return pipe

    def grep(self, *args: str, session: str = SESSION, check: bool = True):
        return shoal(self.cli, "--session", session, "grep", *args, check=check)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with short_tmp("shfind") as tmp:
        work = tmp / "work"
        work.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(POLICY.format(grants=GRANTS, work=work))
        kernel = KernelProcess(tmp, "--policy", str(policy))
        store = TokenStore(kernel.state / "tokens.json")
        tokens = {p: store.create(p)[1] for p in PRINCIPALS}
        kernel.start()
        try:
            mid = _make_runs(kernel)
            yield Env(kernel, tokens, mid)
        finally:
            kernel.stop()


def _make_runs(kernel: KernelProcess) -> float:
    """The 200 runs, made through ``shoal-mcp`` one after another (out:i is run i)."""
    mcp = McpPipe(facade_env(kernel, SESSION))
    mid = 0.0
    try:
        mcp.initialize()
        for i in range(1, RUNS + 1):
            got = mcp.tool("shoal_exec", {"command": source(i)})["result"]
            assert f"out:{i}" in orjson.dumps(got).decode(), got
            if i == RUNS // 2:
                mid = time.time()  # run 101 is stored after this instant
    finally:
        mcp.close()
    return mid


def find(mcp: McpPipe, **args) -> dict:
    """A ``shoal_get`` search across runs: (the whole tools/call result)."""
    return mcp.tool("shoal_get", {"ref": "outputs", **args})["result"]


def read_find(mcp: McpPipe, link: str) -> dict:
    """The kernel reply behind a ``shoal://outputs?…`` resource (JSON contents)."""
    got = mcp.request("resources/read", {"uri": link})["result"]["contents"][0]
    assert got["mimeType"] == "application/json"
    return json.loads(got["text"])


def test_one_call_finds_the_unique_line_of_run_137(env: Env) -> None:
    mcp = env.mcp()
    try:
        got = find(mcp, match="4f2a-137")
        meta = got["structuredContent"]
        text = got["content"][0]["text"]
        assert meta["total"] == 1 and meta["complete"] and not meta["truncated"]
        assert meta["searched"]["runs"] == RUNS
        assert "out:137 exit 0" in text and f"  1:{UNIQUE}" in text
        assert "echo '" + UNIQUE in text  # the run's command head
        # No output byte twice: the text carries the hits, structuredContent the counts.
        assert "hits" not in meta and UNIQUE not in orjson.dumps(meta).decode()
        assert len(orjson.dumps(got)) < 1024
        # The same search as a resource: the kernel's reply, hits included.
        reply = read_find(mcp, "shoal://outputs?match=4f2a-137")
        (hit,) = reply["hits"]
        assert (hit["ref"], hit["uri"], hit["line"], hit["text"]) == (
            "out:137",
            "shoal://out/137",
            1,
            UNIQUE,
        )
        (head,) = reply["runs"]
        assert head["ref"] == "out:137" and head["status"] == 0 and head["ok"] is True
        assert head["cmd"].startswith("echo '") and abs(head["ts"] - time.time()) < 3600
        templates = mcp.request("resources/templates/list")["result"]["resourceTemplates"]
        assert any(t["uriTemplate"].startswith("shoal://outputs{?match") for t in templates)
    finally:
        mcp.close()


def test_fifty_hits_fit_in_4_kib_with_the_exact_next_call(env: Env) -> None:
    mcp = env.mcp()
    try:
        got = find(mcp, match="ok")
        meta = got["structuredContent"]
        text = got["content"][0]["text"]
        assert meta["total"] == len(ok_hits()) and meta["complete"] and meta["truncated"]
        assert text.count("\n  ") == 50  # fifty hit lines, each under its run's head
        assert text.splitlines()[1].startswith(f"out:{RUNS - 1} exit 0")  # newest first
        size = len(orjson.dumps(got))
        assert size <= ECON_BYTES, size
        call = meta["next_call"]
        assert call == {"ref": "outputs", "match": "ok", "cursor": meta["cursor"]}
        assert "shoal_get " + orjson.dumps(call).decode() in text
        # The hint is the next call: it starts right after the last hit shown.
        after = find(mcp, **{k: v for k, v in call.items() if k != "ref"})
        assert after["structuredContent"]["total"] == len(ok_hits()) - 50
    finally:
        mcp.close()


def _walk(first: dict, more) -> list[tuple[int, str, int]]:
    """Every hit of a search and its continuations: (run, stream, line), in order."""
    seen, reply = [], first
    while True:
        seen += [(int(h["ref"][4:]), h["stream"], h["line"]) for h in reply["hits"]]
        if not reply["truncated"]:
            return seen
        reply = more(reply)


def test_continuation_walks_every_hit_exactly_once(env: Env) -> None:
    mcp = env.mcp()
    kernel = env.kernel.client(SESSION)
    try:
        # Through shoal-mcp: follow each reply's `next` URI as a resource.
        first = read_find(mcp, "shoal://outputs?match=ok&max=37")
        seen = _walk(first, lambda r: read_find(mcp, r["next"]))
        assert len(seen) == len(set(seen)) == len(ok_hits())
        assert {(n, line) for n, _, line in seen} == ok_hits()
        assert seen == sorted(seen, key=lambda h: (-h[0], h[2]))  # newest first, then by line
        # Through the kernel: follow next_call, with context lines around each hit.
        params = {"ref": "outputs", "match": {"regex": "ok", "max": 45, "context": 1}}
        reply = kernel.call("value.get", params, timeout=60)
        again = _walk(reply, lambda r: kernel.call("value.get", r["next_call"], timeout=60))
        assert again == seen
    finally:
        mcp.close()
        close_client(kernel)


def test_ok_false_finds_only_failed_runs_and_stream_err_their_stderr(env: Env) -> None:
    mcp = env.mcp()
    try:
        reply = read_find(mcp, "shoal://outputs?match=run&ok=false")
        assert reply["searched"]["runs"] == len(FAILED)
        assert {h["ref"] for h in reply["hits"]} == {f"out:{i}" for i in FAILED}
        assert {h["stream"] for h in reply["hits"]} == {"err"}
        assert all(h["uri"].endswith("?path=.err") for h in reply["hits"])
        assert all(r["ok"] is False and r["status"] == 3 for r in reply["runs"])
        text = find(mcp, match="bad", ok=False)["content"][0]["text"]
        assert f"out:{FAILED[-1]} exit 3" in text and f"err 1:run {FAILED[-1]} bad" in text
        assert find(mcp, match="bad", ok=True)["structuredContent"]["total"] == 0
        only_out = find(mcp, match="bad", stream="out")["structuredContent"]
        assert only_out["total"] == 0 and only_out["searched"]["runs"] == RUNS
    finally:
        mcp.close()


def test_since_and_until_bound_by_time(env: Env) -> None:
    mcp = env.mcp()
    try:
        late = read_find(mcp, f"shoal://outputs?match=run&since={env.mid}&max=1000")
        assert late["searched"]["runs"] == RUNS // 2
        assert min(int(h["ref"][4:]) for h in late["hits"]) == RUNS // 2 + 1
        early = find(mcp, match="run", until=env.mid)["structuredContent"]
        assert early["searched"]["runs"] == RUNS // 2
        none = find(mcp, match="4f2a-137", since=time.time() + 3600)["structuredContent"]
        assert none["total"] == 0 and none["searched"]["runs"] == 0
    finally:
        mcp.close()


def test_cli_grep_finds_filters_and_continues(env: Env) -> None:
    found = env.grep("4f2a-137").stdout
    assert "out:137 exit 0" in found and f"  1:{UNIQUE}" in found
    assert "1 hit for /4f2a-137/ in 200 runs searched" in found
    failed = json.loads(env.grep("bad", "--failed", "--json").stdout)
    assert {h["ref"] for h in failed["hits"]} == {f"out:{i}" for i in FAILED}
    recent = json.loads(env.grep("run", "--since", str(env.mid), "--json").stdout)
    assert recent["searched"]["runs"] == RUNS // 2
    missing = env.grep("no-such-line-5c7e", check=False)
    assert missing.returncode == 1 and "0 hits" in missing.stdout
    # The continuation a person types: the same search with --cursor; each hit once.
    page = env.grep("ok", "-m", "120")
    last = page.stdout.splitlines()[-1]
    assert last.startswith("── more: shoal grep ok -m 120 --cursor ")
    rest = json.loads(env.grep("ok", "-m", "120", "--cursor", last.split()[-1], "--json").stdout)
    assert rest["total"] == len(ok_hits()) - 120 and not rest["truncated"]
    bad = env.grep("ok", "--cursor", "nonsense", check=False)
    assert bad.returncode == 2 and "cursor" in bad.stderr


def test_other_principals_outputs_are_found_only_with_journal_read_all(env: Env) -> None:
    shared = "find-shared"
    a = env.kernel.client(shared, token=env.tokens["agent:a"])
    try:
        made = a.call("exec", {"src": "echo 'secret-of-a 9d1e'"}, timeout=60)
    finally:
        close_client(a)
    b = env.mcp(shared, token="agent:b")
    try:
        mine = b.tool("shoal_exec", {"command": "echo 'secret-of-b 9d1e'"})["result"]
        assert mine["isError"] is False, mine
        for session in (shared, "all"):
            reply = read_find(b, f"shoal://outputs?match=9d1e&session={session}")
            assert [h["text"] for h in reply["hits"]] == ["secret-of-b 9d1e"], reply
            assert reply["total"] == 1
        hidden = find(b, match="secret-of-a")
        assert hidden["structuredContent"]["total"] == 0
        assert "9d1e" not in hidden["content"][0]["text"]
    finally:
        b.close()
    watcher = env.mcp(shared, token="agent:watcher")
    try:
        reply = read_find(watcher, "shoal://outputs?match=secret-of-a")
        assert [(h["ref"], h["text"]) for h in reply["hits"]] == [(made["ref"], "secret-of-a 9d1e")]
        everywhere = read_find(watcher, "shoal://outputs?match=9d1e&session=all")
        assert everywhere["total"] == 2
        assert find(watcher, match="4f2a-137", session=SESSION)["structuredContent"]["total"] == 1
    finally:
        watcher.close()
    # The local human reads every principal's outputs (journal_read = "all" by default).
    assert "secret-of-a 9d1e" in env.grep("secret-of-a", session=shared).stdout


def test_pruned_outputs_are_skipped_and_counted() -> None:
    with running_kernel() as kernel:
        cli = child_env(
            {
                "SHOAL_SOCKET": str(kernel.socket),
                "SHOAL_STATE_DIR": str(kernel.state),
                "SHOAL_NO_AUTOSTART": "1",
            }
        )
        old = kernel.client("gc-find")
        try:
            for i in range(2):
                old.call("exec", {"src": f"echo 'needle {i} 3b8c'"}, timeout=60)
        finally:
            close_client(old)  # a session with a client attached is never pruned
        done = json.loads(shoal(cli, "gc", "--older-than", "0", "--delete", "--json").stdout)
        assert done["values"] == 2
        mcp = McpPipe(facade_env(kernel, "gc-find"))
        try:
            mcp.initialize()
            assert structured(mcp.tool("shoal_exec", {"command": "echo 'needle 2 3b8c'"}))
            got = find(mcp, match="3b8c")
            meta = got["structuredContent"]
            assert meta["total"] == 1 and meta["searched"]["runs"] == 1
            assert meta["skipped"] == {"pruned": 2, "unreadable": 0}
            assert "out:3 exit 0" in got["content"][0]["text"]
            assert "2 pruned skipped" in got["content"][0]["text"]
        finally:
            mcp.close()
        text = shoal(cli, "--session", "gc-find", "grep", "3b8c").stdout
        assert "2 pruned skipped" in text and "needle 2 3b8c" in text


def test_bad_requests_are_named_errors(env: Env) -> None:
    c = env.kernel.client(SESSION)
    try:
        for params, field in (
            ({"ref": "outputs"}, "match"),
            ({"ref": "outputs", "match": "x", "path": ".out"}, "path"),
            ({"ref": "outputs", "match": {"regex": "x", "invert": True}}, "match.invert"),
            ({"ref": "outputs", "match": "x", "cursor": "1,out,0"}, "cursor"),
            ({"ref": "outputs", "match": "("}, "match.regex"),
            ({"ref": "out:1", "ok": True}, "ok"),
            ({"ref": "shoal://outputs?match=x&since=soon"}, "ref"),
        ):
            with pytest.raises(Exception) as info:
                c.call("value.get", params, timeout=30)
            err = info.value
            assert getattr(err, "code", None) == -32602, (params, err)
            assert err.data["field"] == field, (params, err.data)
    finally:
        close_client(c)


def test_tool_schema_offers_the_find_arguments() -> None:
    from shoal_mcp.facade.tools import TOOLS_BY_NAME

    props = TOOLS_BY_NAME["shoal_get"].schema["properties"]
    for name in ("since", "until", "ok", "stream", "session", "cursor"):
        assert name in props and isinstance(props[name]["type"], str)
    assert "outputs" in props["ref"]["description"]
