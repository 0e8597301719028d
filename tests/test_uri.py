"""The one grammar of refs, shoal:// URIs and channels (shoal_mcp.protocol.uri)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal_mcp.protocol import uri


@pytest.mark.parametrize(
    ("text", "kind", "ident"),
    [
        ("shoal://out/3", uri.OUT, "3"),
        ("shoal://task/7", uri.TASK, "7"),
        ("shoal://task/7/out", uri.TASK_OUT, "7"),
        ("shoal://task/7/err", uri.TASK_ERR, "7"),
        ("shoal://val/" + "ab" * 32, uri.VAL, "ab" * 32),
        ("shoal://plan/plan:" + "0f" * 16, uri.PLAN, "plan:" + "0f" * 16),
        ("shoal://plan/" + "0f" * 16, uri.PLAN, "plan:" + "0f" * 16),
        ("shoal://session/cwd", uri.SESSION, "cwd"),
        ("shoal://pty", uri.PTYS, None),
        ("shoal://pty/2", uri.PTY, "2"),
        ("shoal://jobs", uri.JOBS, None),
        ("shoal://journal", uri.JOURNAL, None),
        ("shoal://events/user.build", uri.EVENTS, "user.build"),
    ],
)
def test_every_uri_kind_parses_and_rebuilds(text, kind, ident):
    parsed = uri.parse_uri(text)
    assert (parsed.kind, parsed.ident) == (kind, ident)
    assert uri.parse_uri(str(parsed)) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "shoal://out/x",
        "shoal://out/1/2",
        "shoal://task/1/log",
        "shoal://session/secrets",
        "shoal://nothing",
        "shoal://out/../1",
        "shoal://events/a%00b",
        "http://out/1",
        "out:1",
    ],
)
def test_bad_uris_are_bad_names(text):
    with pytest.raises(uri.BadName):
        uri.parse_uri(text)


def test_raw_and_percent_encoded_forms_are_the_same_uri():
    raw = uri.parse_uri("shoal://out/4?path=.out.lines[-3..]&format=raw")
    encoded = uri.parse_uri("shoal://out/4?path=.out.lines%5B-3..%5D&format=raw")
    assert raw == encoded
    assert raw.query == {"path": ".out.lines[-3..]", "format": "raw"}


def test_built_uris_stay_readable_and_encode_only_what_would_change_parsing():
    assert uri.out_uri(5, path=".out.lines[10..-10]") == "shoal://out/5?path=.out.lines[10..-10]"
    tricky = uri.out_uri(5, path='.out.json["a&b #c+d"]')
    assert uri.parse_uri(tricky).query["path"] == '.out.json["a&b #c+d"]'
    assert " " not in tricky and "#" not in tricky


def test_with_query_replaces_and_drops_empty_items():
    base = uri.out_uri(1, path=".out")
    assert uri.with_query(base, path="") == "shoal://out/1"
    nxt = uri.with_query(base, format="raw", offset=10, length=4)
    assert uri.parse_uri(nxt).query == {
        "path": ".out",
        "format": "raw",
        "offset": "10",
        "length": "4",
    }


@pytest.mark.parametrize(
    ("text", "kind", "ident"),
    [
        ("out:12", uri.OUT, "12"),
        (" task:3 ", uri.TASK, "3"),
        ("pty:1", uri.PTY, "1"),
        ("plan:" + "a" * 32, uri.PLAN, "plan:" + "a" * 32),
        ("shoal://out/12?path=.out", uri.OUT, "12"),
        ("shoal://task/3/out", uri.TASK, "3"),
        ("shoal://plan/plan:" + "a" * 32, uri.PLAN, "plan:" + "a" * 32),
        ("shoal://pty/4", uri.PTY, "4"),
    ],
)
def test_refs_and_the_refs_uris_name(text, kind, ident):
    ref = uri.parse_ref(text)
    assert (ref.kind, ref.ident) == (kind, ident)


@pytest.mark.parametrize(
    "text", ["out:", "out:-1", "out:1.5", "task:x", "plan:XYZ", "val:1", "shoal://journal", ""]
)
def test_non_refs_are_bad_names(text):
    with pytest.raises(uri.BadName):
        uri.parse_ref(text)


def test_ref_numbers_accept_the_ref_its_uri_or_a_bare_number():
    assert uri.ref_number("task:9", uri.TASK) == 9
    assert uri.ref_number("shoal://task/9", uri.TASK) == 9
    assert uri.ref_number("9", uri.TASK) == 9
    assert uri.ref_number(9, uri.TASK) == 9
    with pytest.raises(uri.BadName):
        uri.ref_number("out:9", uri.TASK)


def test_channels():
    assert uri.task_channel(3) == "task.3"
    assert uri.parse_channel("task.3") == ("task", 3)
    assert uri.parse_channel("pty.12") == ("pty", 12)
    assert uri.parse_channel("user.x") == ("user.x", None)
    assert uri.parse_channel("task.x") == ("task.x", None)


@pytest.mark.parametrize(
    "name",
    ["journal", "session.transcript", "approval", "task.0", "task.12", "pty.3", "user.x",
     "user.a.b:c@d+e=f~g_h", "user." + "x" * 300],
)  # fmt: skip
def test_channel_names(name):
    assert uri.is_channel(name)
    assert uri.is_user_channel(name) == name.startswith("user.")


@pytest.mark.parametrize(
    "name",
    ["", "foo", "journal.x", "session", "Journal", "task.", "task.x", "task.01", "task.-1",
     "pty.", "user.", "user", "user.a b", "user.a/b", "user.\n", "user.é", " journal"],
)  # fmt: skip
def test_non_channels(name):
    assert not uri.is_channel(name)
    assert not uri.is_user_channel(name)


def test_built_channels_are_channels():
    assert uri.is_channel(uri.task_channel(3)) and uri.is_channel(uri.pty_channel(0))
    assert not uri.is_user_channel(uri.task_channel(3))


_USER_SUFFIX = st.text("abcXYZ019._:@+=~-", min_size=1, max_size=40)


@given(_USER_SUFFIX)
def test_a_user_channel_needs_no_escaping_in_its_events_uri(suffix):
    channel = "user." + suffix
    assert uri.is_user_channel(channel)
    built = uri.build(uri.EVENTS, channel)
    assert built == "shoal://events/" + channel
    assert uri.parse_uri(built).ident == channel


@given(st.text(min_size=1, max_size=60))
def test_any_path_value_survives_a_round_trip(path):
    built = uri.out_uri(1, path=path)
    assert uri.parse_uri(built).query.get("path") == path
