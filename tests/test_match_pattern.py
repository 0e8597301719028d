"""``match_pattern.prepare``: string anchors become line anchors; newline safety is
proven conservatively (a wrong "safe" would join lines in the per-block count)."""

from __future__ import annotations

import pytest
import regex

from shoal_mcp.kernel.values.match_pattern import prepare


@pytest.mark.parametrize(
    "pattern, source",
    [
        (rb"\AERROR", b"^ERROR"),
        (rb"ERROR\Z", b"ERROR$"),
        (rb"\GERROR", b"^ERROR"),
        (rb"\\AERROR", rb"\\AERROR"),  # an escaped backslash, then a plain A
        (rb"[A\]Z]x\Z", rb"[A\]Z]x$"),  # inside a class nothing is rewritten
    ],
)
def test_string_anchors_become_line_anchors(pattern, source):
    assert prepare(pattern).source == source


SAFE = [rb"ERR[O]R", rb"[a-z]+ \d{2}", rb"ERROR\b", rb"[]x]y", rb"(?:a|b)(?=c)", rb"[\w.-]+@"]
UNSAFE = [
    rb"[^x]",
    rb"\s",
    rb"(?s).",
    rb"[[:space:]]",
    rb"[\n]",
    rb"[\x00-z]",
    b"[\x01-z]",
    rb"\W",
    rb"a\nb",
    rb"(?x)a b",
]


@pytest.mark.parametrize("pattern", SAFE)
def test_safe_patterns(pattern):
    assert prepare(pattern).newline_safe


@pytest.mark.parametrize("pattern", UNSAFE)
def test_unsafe_patterns(pattern):
    assert not prepare(pattern).newline_safe


@pytest.mark.parametrize("pattern", SAFE)
def test_a_safe_pattern_never_matches_a_newline(pattern):
    """The claim checked on the engine: no match of a "safe" pattern spans a newline."""
    text = b"ERROR x\nERROR\n ]y\na\nc\nab\ncd 12\nw.x-y@\n\n[]x\n" * 3
    rx = regex.compile(prepare(pattern).source, regex.MULTILINE | regex.VERSION0)
    assert all(b"\n" not in m.group() for m in rx.finditer(text))
