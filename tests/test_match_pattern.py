"""``match_pattern.prepare``: string anchors become line anchors; newline safety is
proven conservatively (a wrong "safe" would join lines in the per-block count)."""

from __future__ import annotations

import pytest
import regex

from shoal_mcp.kernel.values.match_pattern import prepare, required_literal


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


@pytest.mark.parametrize(
    "pattern, literal",
    [
        (rb"ERR[O]R", b"ERR"),
        (rb"ERROR.*timeout", b"timeout"),
        (rb"\d+ ERROR\b", b" ERROR"),
        (rb"foo\.bar", b"foo.bar"),
        (rb"ERRORS?", b"ERROR"),  # the optional S is not required
        (rb"a{2,3}bcd", b"bcd"),  # a repeat count is no literal
        (rb"(a|b)ERRORx?", b"ERROR"),
        (rb"abc|def", None),  # a top-level alternative: nothing is required
        (rb"ab(?:cd)ef", None),  # group contents are not taken; "ab", "ef" too short
        (rb"(?<=abc)de", None),
    ],
)
def test_required_literal(pattern, literal):
    assert required_literal(prepare(pattern).source) == literal


@pytest.mark.parametrize("pattern", [rb"ERR[O]R", rb"\d+ ERROR\b", rb"ERRORS?", rb"a{2,3}bcd"])
def test_every_match_holds_the_required_literal(pattern):
    text = b"ERROR 12 ERRORS aaabcd abcd ERROR\n" * 2 + b"ERRORx ERR0R 3 ERROR\n"
    literal = required_literal(pattern)
    matches = list(regex.finditer(pattern, text))
    assert matches and all(literal in m.group() for m in matches)
