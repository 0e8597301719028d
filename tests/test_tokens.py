"""Tests for the token store (docs/security.md, Tokens): digests, expiry, revocation."""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path

import orjson
import pytest

from shoal_mcp import tokens
from shoal_mcp.tokens import TokenStore, TokenStoreError


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "tokens.json"


@pytest.fixture
def store(store_path: Path) -> TokenStore:
    return TokenStore(store_path)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_create_and_verify(store: TokenStore) -> None:
    record, bearer = store.create("agent:reviewer", label="ci bot")
    assert re.fullmatch(r"shoal_[A-Za-z0-9_-]{43}", bearer)
    assert set(record) == {"id", "principal", "label", "created"}
    assert record["principal"] == "agent:reviewer" and record["label"] == "ci bot"
    assert re.fullmatch(r"[0-9a-f]{8}", record["id"])
    assert record["created"].endswith("Z")
    assert store.verify(bearer) == "agent:reviewer"


def test_bearers_are_unique_and_only_a_digest_is_stored(
    store: TokenStore, store_path: Path
) -> None:
    _, b1 = store.create("a")
    _, b2 = store.create("a")
    assert b1 != b2
    text = store_path.read_text()
    assert b1 not in text and b2 not in text
    assert b1[len("shoal_") :] not in text
    digests = [r["digest"] for r in orjson.loads(text)["tokens"]]
    assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests)


def test_list_never_shows_the_digest(store: TokenStore) -> None:
    store.create("a", ttl_s=3600)
    store.create("b")
    items = store.list()
    assert [i["principal"] for i in items] == ["a", "b"]
    assert all("digest" not in i for i in items)
    assert items[0]["expires"].endswith("Z") and "expires" not in items[1]
    assert [i["expired"] for i in items] == [False, False]


def test_list_of_missing_store_is_empty(store: TokenStore) -> None:
    assert store.list() == []
    assert store.verify("shoal_" + "A" * 43) is None


def test_revoke_by_id_and_by_principal(store: TokenStore) -> None:
    r1, b1 = store.create("agent:a")
    _, b2 = store.create("agent:a")
    _, b3 = store.create("agent:b")
    assert store.revoke(r1["id"]) == 1
    assert store.verify(b1) is None and store.verify(b2) == "agent:a"
    assert store.revoke("agent:a") == 1
    assert store.verify(b2) is None and store.verify(b3) == "agent:b"
    assert store.revoke("nobody") == 0
    assert [i["principal"] for i in store.list()] == ["agent:b"]


def test_expiry_is_honoured(store: TokenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr(tokens, "_now", lambda: now[0])
    record, bearer = store.create("agent:t", ttl_s=60)
    assert record["expires"] > record["created"]
    assert store.verify(bearer) == "agent:t"
    now[0] += 59
    assert store.verify(bearer) == "agent:t"
    now[0] += 2
    assert store.verify(bearer) is None
    assert store.list()[0]["expired"] is True
    # expired records are pruned by the next write
    store.create("agent:other")
    assert [i["principal"] for i in store.list()] == ["agent:other"]


@pytest.mark.parametrize("ttl", [0, -5, "10"])
def test_bad_arguments(store: TokenStore, ttl: object) -> None:
    with pytest.raises(TokenStoreError):
        store.create("a", ttl_s=ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize("principal", ["", "   ", "a\nb", "x" * 300])
def test_bad_principals(store: TokenStore, principal: str) -> None:
    with pytest.raises(TokenStoreError):
        store.create(principal)


def test_file_modes(store: TokenStore, store_path: Path) -> None:
    store.create("a")
    assert mode(store_path.parent) == 0o700
    assert mode(store_path) == 0o600
    assert mode(store_path.with_name("tokens.key")) == 0o600
    assert mode(store_path.with_name("tokens.lock")) == 0o600
    assert len(store_path.with_name("tokens.key").read_bytes()) == 32
    store.revoke("a")
    assert mode(store_path) == 0o600
    leftovers = [p.name for p in store_path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_existing_parent_mode_is_left_alone(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    TokenStore(tmp_path / "tokens.json").create("a")
    assert mode(tmp_path) == 0o755


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "shoal_",
        "nope",
        "shoal_" + "A" * 42,
        "shoal_" + "A" * 44,
        "xoxb_" + "A" * 44,
        "shoal_" + "A" * 43,
        None,
        123,
    ],
)
def test_bad_bearers(store: TokenStore, bad: object) -> None:
    store.create("a")
    assert store.verify(bad) is None  # type: ignore[arg-type]


def test_revocation_by_another_instance_is_seen_without_restart(store_path: Path) -> None:
    kernel = TokenStore(store_path)
    cli = TokenStore(store_path)
    record, bearer = cli.create("agent:x")
    assert kernel.verify(bearer) == "agent:x"
    assert cli.revoke(record["id"]) == 1
    assert kernel.verify(bearer) is None
    _, again = cli.create("agent:x")
    assert kernel.verify(again) == "agent:x"


def test_same_size_rewrite_is_seen(store_path: Path) -> None:
    kernel = TokenStore(store_path)
    cli = TokenStore(store_path)
    rec1, b1 = cli.create("agent:x", label="L")
    assert kernel.verify(b1) == "agent:x"
    size_before = os.stat(store_path).st_size
    # Replace one record by another of identical length, back to back (same clock tick).
    cli.revoke(rec1["id"])
    _, b2 = cli.create("agent:y", label="L")
    assert os.stat(store_path).st_size == size_before
    assert kernel.verify(b1) is None
    assert kernel.verify(b2) == "agent:y"


def test_every_write_moves_mtime_forward(store: TokenStore, store_path: Path) -> None:
    stamps = []
    for i in range(20):
        store.create(f"p{i}")
        stamps.append(os.stat(store_path).st_mtime_ns)
    assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False))


def test_unchanged_file_is_not_reparsed(store: TokenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _, bearer = store.create("a")
    assert store.verify(bearer) == "a"
    calls = []
    original = TokenStore._read_records
    monkeypatch.setattr(
        TokenStore, "_read_records", lambda self, strict: calls.append(1) or original(self, strict)
    )
    for _ in range(5):
        assert store.verify(bearer) == "a"
    assert calls == []


def test_compare_runs_against_every_record(
    store: TokenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, first = store.create("a")
    for i in range(4):
        store.create(f"p{i}")
    calls = []
    real = tokens.hmac.compare_digest
    monkeypatch.setattr(tokens.hmac, "compare_digest", lambda x, y: calls.append(1) or real(x, y))
    assert store.verify(first) == "a"
    assert len(calls) == 5


def test_concurrent_writers_lose_nothing(store_path: Path) -> None:
    def work(n: int) -> None:
        s = TokenStore(store_path)
        for i in range(5):
            s.create(f"w{n}-{i}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(TokenStore(store_path).list()) == 40


# --- tampering ---------------------------------------------------------------------------


def test_corrupt_file_fails_closed(store: TokenStore, store_path: Path) -> None:
    _, bearer = store.create("a")
    store_path.write_text("{not json")
    assert store.verify(bearer) is None
    with pytest.raises(TokenStoreError):
        store.list()
    with pytest.raises(TokenStoreError):
        store.create("b")  # never clobbers a file it cannot read
    assert store_path.read_text() == "{not json"


@pytest.mark.parametrize("doc", [b"[]", b'{"tokens": 3}', b'{"tokens": [1]}', b"{}"])
def test_wrong_shape_fails_closed(store: TokenStore, store_path: Path, doc: bytes) -> None:
    _, bearer = store.create("a")
    store_path.write_bytes(doc)
    assert store.verify(bearer) is None


def test_tampered_digest_or_principal(store: TokenStore, store_path: Path) -> None:
    _, b1 = store.create("agent:a")
    _, b2 = store.create("agent:b")
    doc = orjson.loads(store_path.read_bytes())
    doc["tokens"][0]["digest"] = "0" * 64
    doc["tokens"][1]["principal"] = 42
    store_path.write_bytes(orjson.dumps(doc))
    assert store.verify(b1) is None
    assert store.verify(b2) is None


def test_tampered_expiry_fails_closed(store: TokenStore, store_path: Path) -> None:
    _, bearer = store.create("a", ttl_s=3600)
    doc = orjson.loads(store_path.read_bytes())
    doc["tokens"][0]["expires"] = "whenever"
    store_path.write_bytes(orjson.dumps(doc))
    assert store.verify(bearer) is None


def test_replaced_key_invalidates_tokens(store: TokenStore, store_path: Path) -> None:
    _, bearer = store.create("a")
    key = store_path.with_name("tokens.key")
    key.write_bytes(os.urandom(32))
    assert store.verify(bearer) is None


def test_short_key_fails_closed(store: TokenStore, store_path: Path) -> None:
    _, bearer = store.create("a")
    store_path.with_name("tokens.key").write_bytes(b"short")
    assert store.verify(bearer) is None
    with pytest.raises(TokenStoreError):
        store.create("b")


def test_digest_from_another_store_does_not_verify(tmp_path: Path) -> None:
    a = TokenStore(tmp_path / "a" / "tokens.json")
    b = TokenStore(tmp_path / "b" / "tokens.json")
    _, bearer = a.create("x")
    b.create("y")
    # copy a's record into b: b's key differs, so a's bearer must not verify there
    doc_b = orjson.loads((tmp_path / "b" / "tokens.json").read_bytes())
    doc_b["tokens"] += orjson.loads((tmp_path / "a" / "tokens.json").read_bytes())["tokens"]
    (tmp_path / "b" / "tokens.json").write_bytes(orjson.dumps(doc_b))
    assert b.verify(bearer) is None
