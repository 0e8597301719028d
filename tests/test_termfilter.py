"""OSC strings never reach the emulator, whatever the chunking, in constant memory."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal_mcp.kernel.pty.termfilter import IN_OSC, OscFilter

OSC_RE = re.compile(rb"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")

text = st.binary(max_size=20).map(lambda b: b.replace(b"\x1b", b"").replace(b"\x07", b""))
osc = st.tuples(
    st.binary(max_size=30).map(lambda b: b.replace(b"\x1b", b"").replace(b"\x07", b"")),
    st.sampled_from([b"\x07", b"\x1b\\"]),
).map(lambda t: b"\x1b]" + t[0] + t[1])
other_escape = st.sampled_from([b"\x1b[2J", b"\x1b[1;1H", b"\x1b[?1049h", b"\x1bM", b"\x1b(B"])
stream = st.lists(st.one_of(text, osc, other_escape), max_size=30).map(b"".join)


def feed_in_chunks(data: bytes, cuts: list[int]) -> bytes:
    f = OscFilter()
    out = b""
    last = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        out += f.feed(data[last:cut])
        last = max(last, cut)
    return out + f.feed(data[last:])


@settings(max_examples=1000)
@given(stream, st.lists(st.integers(min_value=0, max_value=10_000), max_size=10))
def test_matches_removing_well_formed_oscs_for_any_chunking(data, cuts):
    assert feed_in_chunks(data, cuts) == OSC_RE.sub(b"", data)


def test_other_escapes_pass_through_unchanged():
    data = b"a\x1b[31mred\x1b[0m\x1b]0;title\x07b\x1b]2;t\x1b\\c"
    assert OscFilter().feed(data) == b"a\x1b[31mred\x1b[0mbc"


def test_an_escape_inside_an_osc_aborts_it_and_starts_a_new_sequence():
    assert OscFilter().feed(b"\x1b]0;never ends\x1b[1mX") == b"\x1b[1mX"


def test_unterminated_osc_is_dropped_in_constant_memory():
    f = OscFilter()
    assert f.feed(b"before\x1b]0;") == b"before"
    chunk = b"x" * (1 << 20)
    for _ in range(64):  # 64 MiB of title that never ends
        assert f.feed(chunk) == b""
    assert f.state == IN_OSC and f.dropped >= 64 << 20
    assert f.feed(b"\x07after") == b"after"
