"""The EXIT trap's state report (``$PWD``, NUL, ``export -p``) read back by
``exports.parse_report``: every byte of every exported value survives, from a real bash
(docs/decisions.md, Lean exec path)."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal_mcp.kernel.exec.exports import parse_exports, parse_report
from shoal_mcp.kernel.exec.runner import BASH, STATE_FD, _prelude

TRICKY = [
    "plain",
    "",
    "two words",
    'q"u$o`t\\e',
    "new\nline",
    "tab\there",
    "\x01\x1b\x7f",
    "é ü 日本",
    "\udcff\udcfe",  # bytes that are not UTF-8 (surrogateescape)
    "'single' and \"double\"",
    "declare -x FAKE=1",
    "trailing backslash \\",
    "=starts with equals",
    "$'not ansi'",
]


def report_of(script: str, env: dict[str, str], tmp_path, *, locale: str = "C.UTF-8") -> bytes:
    state = tmp_path / "state"
    with open(state, "wb") as fh:
        os.dup2(fh.fileno(), STATE_FD)
    try:
        subprocess.run(
            [BASH, "--noprofile", "--norc", "-c", _prelude(STATE_FD) + script],
            env={
                **{k.encode(): v.encode("utf-8", "surrogateescape") for k, v in env.items()},
                b"LC_ALL": locale.encode(),
            },
            pass_fds=(STATE_FD,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    finally:
        os.close(STATE_FD)
    return state.read_bytes()


@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
def test_every_value_comes_back_exactly(tmp_path, locale):
    env = {f"V{i}": value for i, value in enumerate(TRICKY)}
    raw = report_of(
        "cd /tmp; export NEW=$'x\\ny'; unset V0; declare -x NOVALUE", env, tmp_path, locale=locale
    )
    cwd, got = parse_report(raw)  # type: ignore[misc]
    assert cwd == "/tmp"
    expected = {k: v for k, v in env.items() if k != "V0"} | {"NEW": "x\ny", "LC_ALL": locale}
    assert {k: v for k, v in got.items() if k in expected or k == "V0"} == expected
    assert "NOVALUE" not in got and "PWD" in got


def test_posix_mode_and_attributes(tmp_path):
    raw = report_of("declare -ix I=5; declare -rx R='r o'; set -o posix", {"A": "a\tb"}, tmp_path)
    _, got = parse_report(raw)  # type: ignore[misc]
    assert got["I"] == "5" and got["R"] == "r o" and got["A"] == "a\tb"


def test_arrays_are_not_in_the_environment(tmp_path):
    raw = report_of("declare -ax ARR=(1 '2 3'); export AFTER=ok", {}, tmp_path)
    _, got = parse_report(raw)  # type: ignore[misc]
    assert "ARR" not in got and got["AFTER"] == "ok"


def test_a_script_writing_to_the_descriptor_is_read_as_before(tmp_path):
    forged = f"printf '/\\0SHOAL_FORGED=ok\\0' >&{STATE_FD}; export REAL=1"
    cwd, got = parse_report(report_of(forged, {}, tmp_path))  # type: ignore[misc]
    assert cwd == "/" and got["SHOAL_FORGED"] == "ok" and got["REAL"] == "1"


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\0",
        b"/\0declare -x",
        b'/\0declare -x A="unclosed',
        b"/\0declare -x A=$'\\",
        b"/\0\xff",
    ],
)
def test_garbage_never_raises(garbage):
    parse_report(garbage)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=0x2FF), max_size=40))
def test_any_text_value_round_trips(tmp_path_factory, value):
    tmp = tmp_path_factory.mktemp("exp")
    raw = report_of("true", {"VAL": value}, tmp)
    assert parse_report(raw)[1]["VAL"] == value  # type: ignore[index]


def test_parse_exports_skips_what_is_not_an_entry():
    assert parse_exports(b"junk\ndeclare -x A=\"1\"\n???\nexport B=$'\\101'\n") == {
        "A": "1",
        "B": "A",
    }
