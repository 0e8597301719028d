"""The kernel's stable services in-process: CAS, transcript, values, journal, sessions and
the event bus, wired by ``Kernel`` on a temporary state dir with no socket.

These complement the live tests (``test_kernel_*.py`` drive a real daemon over its
socket): here each service is called directly, so a failure points at the service and
not at the transport. Exec is left to the live tests; what a finished exec stores (an
``outcome`` whose ``out``/``err`` are CAS blobs) is built here from a spool file, the way
the kernel ingests one. Restarts are a second ``Kernel`` on the same state dir.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from shoal_mcp.kernel.access.identity import Principal
from shoal_mcp.kernel.app import Kernel, KernelConfig
from shoal_mcp.kernel.store.journal import JournalEntry
from shoal_mcp.kernel.store.sessions import VOLATILE_ENV, env_digest
from shoal_mcp.kernel.values.elision import ElideOptions
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.protocol.limits import VALUE_HARD_CAP
from tests.support.polling import wait_until

AGENT = "agent:services"
OTHER = "agent:other"
_spools = itertools.count()


class Services:
    """Kernels on one state dir, opened one after another (a restart is a reopen)."""

    def __init__(self, root: Path) -> None:
        self.config = KernelConfig(socket=root / "run" / "k.sock", state_dir=root / "state")
        self.kernel = Kernel(self.config)

    def reopen(self) -> Kernel:
        self.close()
        self.kernel = Kernel(self.config)
        return self.kernel

    def close(self) -> None:
        self.kernel.stop_work(drain_s=1.0)
        self.kernel.close()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    s = Services(tmp_path)
    yield s
    s.close()


def spool(kernel: Kernel, data: bytes) -> Path:
    """A spool file with ``data``, where the kernel keeps its spools."""
    path = kernel.spool_dir / f"test-{os.getpid()}-{next(_spools)}.out"
    path.write_bytes(data)
    return path


def store_result(
    kernel: Kernel, who: Principal, out: bytes, err: bytes = b"", status: int = 0
) -> str:
    """Store what a finished exec leaves behind: blobs, ``out:N``, a journal row. Its ref."""
    out_info = kernel.cas.ingest(spool(kernel, out))
    err_info = kernel.cas.ingest(spool(kernel, err))
    outcome = {
        "$": "outcome",
        "status": status,
        "ok": status == 0,
        "out": out_info.node(),
        "err": err_info.node(),
        "cmd": "test",
        "cwd": "/",
    }
    n = kernel.transcript.append(who.session, who.principal, outcome)
    kernel.journal.record(
        JournalEntry(
            session=who.session,
            principal=who.principal,
            cwd="/",
            src="test",
            status=status,
            ok=status == 0,
            ref=f"out:{n}",
            outputs=[{"kind": "out", "hash": out_info.hash, "len": out_info.size}],
        )
    )
    return f"out:{n}"


def get(kernel: Kernel, who: Principal, ref: str, path: str | None = None) -> dict:
    """What ``value.get`` encodes for ``ref`` at ``path`` with the default elision."""
    return kernel.values.encode(kernel.values.select(who, ref, path, None), ElideOptions())


# -- CAS ---------------------------------------------------------------------------------


def test_cas_ingest_counts_and_deduplicates(services: Services) -> None:
    cas = services.kernel.cas
    first_spool = spool(services.kernel, "héllo\nwörld".encode())
    first = cas.ingest(first_spool)
    assert (first.size, first.lines, first.chars, first.utf8) == (13, 2, 11, True)
    assert not first_spool.exists()  # moved into the store, not copied
    assert cas.read_range(first.hash, 0, 6) == "héllo".encode()
    again = cas.ingest(spool(services.kernel, "héllo\nwörld".encode()))
    assert again == first
    assert [p.name for p in cas.path_of(first.hash).parent.iterdir()] == [first.hash]
    binary = cas.ingest(spool(services.kernel, b"\xff\xfe\n\x00"))
    assert (binary.utf8, binary.chars, binary.lines) == (False, None, 2)
    empty = cas.ingest(spool(services.kernel, b""))
    assert (empty.size, empty.lines) == (0, 0)
    # The metadata is in SQLite: a restarted kernel describes the blob without reading it.
    assert services.reopen().cas.info(first.hash) == first


def test_cas_unknown_blob_is_an_unknown_ref(services: Services) -> None:
    with pytest.raises(RpcError) as info:
        services.kernel.cas.info("0" * 64)
    assert info.value.code == ErrorCode.UNKNOWN_REF


# -- transcript ------------------------------------------------------------------------------


def test_transcript_numbers_each_session_from_one(services: Services) -> None:
    transcript = services.kernel.transcript
    assert [transcript.append("a", AGENT, {"i": i}) for i in range(3)] == [1, 2, 3]
    assert transcript.append("b", AGENT, {"i": 0}) == 1
    assert transcript.get("a", 2) == (AGENT, {"i": 1})
    assert (transcript.count("a"), transcript.count("b"), transcript.count("c")) == (3, 1, 0)
    with pytest.raises(RpcError) as info:
        transcript.get("b", 2)
    assert info.value.code == ErrorCode.UNKNOWN_REF and info.value.data["ref"] == "out:2"


def test_transcript_survives_a_restart_and_numbering_goes_on(services: Services) -> None:
    services.kernel.transcript.append("a", AGENT, {"before": True})
    transcript = services.reopen().transcript
    assert transcript.get("a", 1) == (AGENT, {"before": True})
    assert transcript.append("a", AGENT, {"after": True}) == 2


def test_transcript_appends_from_many_threads_get_distinct_numbers(services: Services) -> None:
    transcript = services.kernel.transcript
    got: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(25):
            n = transcript.append("race", AGENT, {})
            with lock:
                got.append(n)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == list(range(1, 101))


# -- values ------------------------------------------------------------------------------


def test_values_select_paths_into_a_stored_result(services: Services) -> None:
    kernel = services.kernel
    who = Principal("v", AGENT)
    lines = "".join(f"line {i}\n" for i in range(1, 1001)).encode()
    ref = store_result(kernel, who, lines, b"warning\n", status=3)
    assert get(kernel, who, ref, ".status") == {"$": "int", "v": 3}
    assert get(kernel, who, ref, ".ok") == {"$": "bool", "v": False}
    assert get(kernel, who, ref, ".err") == {"$": "str", "v": "warning\n"}
    last = get(kernel, who, ref, ".out.lines[-2..]")
    assert last == {"$": "list", "v": [{"$": "str", "v": f"line {n}"} for n in (999, 1000)]}
    assert get(kernel, who, ref, ".out.lines[0]") == {"$": "str", "v": "line 1"}
    # The URI form names the same value.
    assert get(kernel, who, "shoal://out/1?path=.out.lines[0]") == {"$": "str", "v": "line 1"}
    # A large part comes back elided to a ref under the hard cap, not inline.
    whole = get(kernel, who, ref)
    assert len(orjson.dumps(whole)) <= ElideOptions().max_bytes < VALUE_HARD_CAP
    assert whole["out"]["$"] == "ref" and whole["out"]["uri"] == "shoal://out/1?path=.out"
    assert (whole["out"]["bytes"], whole["out"]["lines"]) == (len(lines), 1000)


def test_values_raw_pages_walk_the_whole_output(services: Services) -> None:
    kernel = services.kernel
    who = Principal("raw", AGENT)
    data = bytes(range(32, 127)) * 100
    ref = store_result(kernel, who, data)
    sel = kernel.values.select(who, ref, ".out", None)
    pages, offset = [], 0
    while True:
        page = kernel.values.raw(sel, offset, 4096, ElideOptions())
        pages.append(page["raw"])
        if "next" not in page:
            break
        offset = page["offset"] + page["length"]
    assert "".join(pages).encode() == data and len(pages) == -(-len(data) // 4096)


def test_values_render_is_bounded_and_names_the_ref(services: Services) -> None:
    kernel = services.kernel
    who = Principal("render", AGENT)
    ref = store_result(kernel, who, b"x" * 200_000 + b"\n" + b"tail\n")
    text = kernel.values.render(kernel.values.select(who, ref, ".out", None), ElideOptions())
    assert len(text.encode()) <= ElideOptions().max_bytes
    assert "shoal://out/1" in text


def test_values_of_another_principal_are_unknown_unless_it_reads_all(
    services: Services,
) -> None:
    kernel = services.kernel
    ref = store_result(kernel, Principal("shared", AGENT), b"mine\n")
    with pytest.raises(RpcError) as info:
        get(kernel, Principal("shared", OTHER), ref, ".out")
    assert info.value.code == ErrorCode.UNKNOWN_REF
    # Unknown in another session, whoever asks.
    with pytest.raises(RpcError):
        get(kernel, Principal("elsewhere", AGENT), ref)
    # The local human has journal_read = all: it reads every principal's values.
    human = Principal("shared", kernel.local_principal)
    assert get(kernel, human, ref, ".out") == {"$": "str", "v": "mine\n"}


def test_values_bad_refs_and_paths_are_clean_errors(services: Services) -> None:
    kernel = services.kernel
    who = Principal("bad", AGENT)
    ref = store_result(kernel, who, b"ok\n")
    for bad_ref in ("out:2", "out:x", "nonsense", "shoal://out/../1", f"out:{2**63}"):
        with pytest.raises(RpcError) as info:
            kernel.values.select(who, bad_ref, None, None)
        assert info.value.code == ErrorCode.UNKNOWN_REF, bad_ref
    for bad_path in (".nope", ".out.lines[", ".status.x"):
        with pytest.raises(RpcError) as info:
            kernel.values.select(who, ref, bad_path, None)
        assert info.value.code == ErrorCode.BAD_SELECTION, bad_path


# -- journal -----------------------------------------------------------------------------


def _row(kernel: Kernel, src: str, **fields) -> dict:
    entry = JournalEntry(session=fields.pop("session", "j"), principal=AGENT, cwd="/", src=src)
    for name, value in fields.items():
        setattr(entry, name, value)
    return kernel.journal.record(entry)


def test_journal_filters_apply_before_the_limit(services: Services) -> None:
    kernel = services.kernel
    _row(kernel, "git status", ok=True, status=0, ts=100.0)
    _row(kernel, "FOO=1 git push", ok=False, status=1, ts=200.0,
         effects=[{"kind": "net_connect", "target": "github.com:443"}])  # fmt: skip
    _row(kernel, "rm -rf build", ok=True, status=0, ts=300.0, session="other",
         effects=[{"kind": "fs_delete", "target": "/w/build/**"}])  # fmt: skip
    for i in range(20):
        _row(kernel, f"echo {i}", ok=True, status=0, ts=400.0 + i)
    journal = kernel.journal
    assert [r["src"] for r in journal.query(head="git")] == ["FOO=1 git push", "git status"]
    assert [r["src"] for r in journal.query(ok=False)] == ["FOO=1 git push"]
    assert [r["src"] for r in journal.query(effects=["fs_delete"])] == ["rm -rf build"]
    assert [r["src"] for r in journal.query(since=150, until=350)] == [
        "rm -rf build",
        "FOO=1 git push",
    ]
    # limit applies after filtering: the one git row past 20 newer echos is still found.
    assert [r["src"] for r in journal.query(head="git", limit=1)] == ["FOO=1 git push"]
    newest = journal.query(limit=3)
    assert [r["src"] for r in newest] == ["echo 19", "echo 18", "echo 17"]
    assert newest[0]["id"] > newest[1]["id"] > newest[2]["id"]
    assert {r["session"] for r in journal.query(session="other")} == {"other"}
    assert journal.query(visible_to=OTHER) == []
    # Optional fields left unset are absent, not null.
    assert "duration_ms" not in journal.query(head="rm")[0]


def test_journal_survives_a_restart(services: Services) -> None:
    row = _row(services.kernel, "make test", ok=True, status=0)
    again = services.reopen().journal.query(head="make")
    assert again == [row]


# -- sessions ----------------------------------------------------------------------------


def test_sessions_keep_cwd_and_env_across_a_restart(services: Services, tmp_path: Path) -> None:
    sessions = services.kernel.sessions
    work = tmp_path / "work"
    work.mkdir()
    session = sessions.get_or_create("s1", str(work))
    assert session.cwd == str(work)
    assert sessions.get_or_create("s1", "/") is session  # an existing session keeps its cwd
    env = {**session.env, "SHOAL_T": "kept", "PWD": "/ignored", "SHLVL": "9"}
    sessions.apply(session, "/", env)
    assert session.cwd == "/" and session.env["SHOAL_T"] == "kept"
    assert session.env.get("SHLVL") != "9" and session.env.get("PWD") != "/ignored"
    hashed = session.env_hash()
    sessions = services.reopen().sessions
    assert sessions.get("s1") is None  # nothing is loaded until asked for
    back = sessions.get_or_create("s1")
    assert (back.cwd, back.env["SHOAL_T"], back.env_hash()) == ("/", "kept", hashed)
    assert sessions.names() == ["s1"]


def test_a_sessions_env_hash_follows_every_new_env(services: Services) -> None:
    """The digest is kept between calls (every exec's gate asks), never past a change."""
    sessions = services.kernel.sessions
    session = sessions.get_or_create("s-hash", "/")
    before = session.env_hash()
    assert session.state() == ("/", session.env, before)
    assert before == env_digest(session.env)
    sessions.apply(session, "/", {**session.env, "SHOAL_T": "1"})
    after = session.env_hash()
    assert after != before and after == env_digest(session.env)
    assert session.state()[2] == after
    sessions.apply(session, "/", {k: v for k, v in session.env.items() if k != "SHOAL_T"})
    assert session.env_hash() == before  # the same variables hash the same again


def test_sessions_start_in_home_when_the_cwd_is_missing(services: Services) -> None:
    session = services.kernel.sessions.get_or_create("s2", "/no/such/dir")
    assert session.cwd == os.path.expanduser("~")
    assert not VOLATILE_ENV & set(session.env)


def test_a_session_created_by_many_threads_at_once_is_one_session(
    services: Services, tmp_path: Path
) -> None:
    """No lock is held across the database while a session loads: racing creators meet
    in the write transaction, and every caller gets the one session the table keeps,
    with the cwd the row on disk has."""
    sessions = services.kernel.sessions
    dirs = []
    for i in range(8):
        (tmp_path / f"d{i}").mkdir()
        dirs.append(str(tmp_path / f"d{i}"))
    go = threading.Barrier(len(dirs))
    got: list[object] = []

    def create(cwd: str) -> None:
        go.wait()
        got.append(sessions.get_or_create("s-race", cwd))

    threads = [threading.Thread(target=create, args=(d,)) for d in dirs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(dirs) and all(s is got[0] for s in got)
    rows = services.kernel.db.query("SELECT cwd FROM sessions WHERE name = 's-race'")
    assert len(rows) == 1
    assert bytes(rows[0]["cwd"]).decode() == got[0].cwd  # type: ignore[attr-defined]
    assert services.reopen().sessions.get_or_create("s-race").cwd == got[0].cwd  # type: ignore[attr-defined]


# -- events ------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, event: dict) -> None:
        with self.lock:
            self.events.append(event)

    def payloads(self) -> list[dict]:
        with self.lock:
            return [e["payload"] for e in self.events]


def test_events_replay_then_live_in_order(services: Services) -> None:
    bus = services.kernel.events
    for i in range(3):
        bus.publish("user.svc", {"i": i})
    sink = Sink()
    sub = bus.subscribe("user.svc", 0, sink)  # after seq 0: replays seq 1 and 2
    bus.publish("user.svc", {"i": 3})
    wait_until(lambda: len(sink.payloads()) == 3, what="replay and live delivery")
    assert sink.payloads() == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert [e["seq"] for e in sink.events] == [1, 2, 3]
    sub.close()


def test_durable_channels_survive_a_restart_and_others_do_not(services: Services) -> None:
    bus = services.kernel.events
    bus.publish("journal", {"id": 1})
    bus.publish("journal", {"id": 2})
    bus.publish("user.gone", {"n": 1})
    bus = services.reopen().events
    durable = bus.read("journal", since=-1)
    assert [e["payload"] for e in durable["events"]] == [{"id": 1}, {"id": 2}]
    assert bus.publish("journal", {"id": 3})["seq"] == 2  # numbering goes on
    assert bus.read("user.gone")["events"] == []
    assert bus.read("user.gone")["latest_seq"] == -1
