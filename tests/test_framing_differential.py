"""Hypothesis differential tests: the compiled core and its Python twin on the same inputs.

Each property also checks an independent oracle from ``framing_vectors`` (plain list
slicing, brute-force truncation, ``base64``), so "both agree" never means "both wrong".

Example counts (``max_examples``), quoted by the release notes:
  * frame streams, random chunkings  -> 2000 examples
  * FrameReader on a pipe            ->  200 examples (each spawns a writer thread)
  * bound_text (texts, limits, uris) -> 2000 examples
  * slicers + line_offsets           -> 2000 examples
The whole file runs in well under a minute on one core.
"""

from __future__ import annotations

import base64

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.framing_vectors import (
    marker_size,
    pipe_reader,
    reference_bound_text,
    reference_events,
    reference_line_bytes,
    reference_utf8_offset,
    reference_utf8_slice,
)

FRAME_EXAMPLES = 2000
READER_EXAMPLES = 200
BOUND_EXAMPLES = 2000
SLICE_EXAMPLES = 2000

_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}

# --- frame streams ----------------------------------------------------------------------

_line = st.one_of(
    st.binary(max_size=12),
    st.builds(lambda b: b + b"\r", st.binary(max_size=12)),
    st.sampled_from([b"", b"\r", b"{}", b'{"id":1,"params":{}}']),
    st.builds(lambda c, n: c * n, st.sampled_from([b"x", b"\r", b"\xc3\xa9"]), st.integers(0, 80)),
).map(lambda b: b.replace(b"\n", b""))


@st.composite
def _stream(draw):
    lines = draw(st.lists(_line, max_size=20))
    data = b"\n".join(lines)
    if draw(st.booleans()):
        data += b"\n"
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    max_frame = draw(st.integers(1, 40))
    return data, chunks, max_frame


def _run_decoder(backend, chunks, max_frame):
    decoder = backend.FrameDecoder(max_frame)
    trace = []
    for chunk in chunks:
        trace.append((decoder.feed(chunk), decoder.scanned, decoder.buffered))
    trace.append((decoder.eof(), decoder.scanned, decoder.buffered))
    events = [e for batch, _, _ in trace for e in batch]
    return trace, events


@settings(max_examples=FRAME_EXAMPLES, **_SETTINGS)
@given(case=_stream())
def test_decoders_agree_on_random_chunkings(both_framing_backends, case):
    data, chunks, max_frame = case
    py, cy = both_framing_backends
    py_trace, py_events = _run_decoder(py, chunks, max_frame)
    cy_trace, cy_events = _run_decoder(cy, chunks, max_frame)
    assert py_trace == cy_trace  # same events per feed, same scanned/buffered after each
    assert py_events == reference_events(data, max_frame)
    assert py_trace[-1][1] == len(data)  # every byte scanned exactly once


@settings(max_examples=READER_EXAMPLES, **_SETTINGS)
@given(case=_stream(), chunk=st.integers(1, 64))
def test_readers_agree_on_a_pipe(both_framing_backends, case, chunk):
    data, pieces, max_frame = case
    results = []
    for backend in both_framing_backends:
        with pipe_reader(backend, pieces, max_frame, chunk) as reader:
            results.append((list(reader), reader.scanned))
    assert results[0] == results[1] == (reference_events(data, max_frame), len(data))


# --- bound_text -------------------------------------------------------------------------

_chars = st.one_of(
    st.sampled_from(list("ab \n\n\r\t\xe9\u20ac\U0001f600\u2026")),
    st.characters(),
    st.just("\ud800"),  # a lone surrogate now and then (round-trips via surrogatepass)
)


@st.composite
def _bound_case(draw):
    parts = draw(
        st.lists(
            st.one_of(
                st.text(_chars, max_size=40),
                st.builds(lambda c, n: c * n, _chars, st.integers(0, 300)),
            ),
            max_size=12,
        )
    )
    text = "".join(parts)
    limit = draw(st.one_of(st.integers(0, 700), st.integers(0, 80)))
    uri = draw(
        st.one_of(
            st.none(),
            st.just(""),
            st.just("shoal://out/12?path=.lines"),
            st.text(_chars, max_size=8),
        )
    )
    return text, limit, uri


@settings(max_examples=BOUND_EXAMPLES, **_SETTINGS)
@given(case=_bound_case())
def test_bound_text_agrees_and_is_longest(both_framing_backends, case):
    text, limit, uri = case
    py, cy = both_framing_backends
    out_py = py.bound_text(text, limit, uri)
    out_cy = cy.bound_text(text, limit, uri)
    assert out_py == out_cy
    assert out_py == reference_bound_text(text, limit, uri)  # longest head that fits
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        assert out_py is text and out_cy is text
    else:
        total = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        size = len(out_py.encode("utf-8", "surrogatepass"))
        if limit >= marker_size(total, len(data), uri):
            assert size <= limit
        if limit >= 256 and (uri is None or len(uri.encode("utf-8", "surrogatepass")) <= 64):
            assert size <= limit


# --- slicers ----------------------------------------------------------------------------

_buf = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.sampled_from(
            [
                b"a",
                b"\n",
                b"\r\n",
                b"\xc3\xa9",
                b"\xe2\x82\xac",
                b"\xf0\x9f\x98\x80",
                b"\x80",
                b"\xff",
            ]
        ),
        max_size=120,
    ).map(b"".join),
)
_index = st.one_of(st.integers(-40, 340), st.integers(-(10**20), 10**20))
_opt_index = st.one_of(st.none(), _index)


@settings(max_examples=SLICE_EXAMPLES, **_SETTINGS)
@given(
    buf=_buf,
    a=_index,
    b=_index,
    first=_opt_index,
    last=_opt_index,
    wrap=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_slicers_agree(both_framing_backends, buf, a, b, first, last, wrap):
    py, cy = both_framing_backends
    view = wrap(buf)
    n = len(buf)
    s, e = min(max(a, 0), n), min(max(b, min(max(a, 0), n)), n)
    expected_b64 = base64.b64encode(buf[s:e]).decode()
    assert py.b64_slice(view, a, b) == cy.b64_slice(view, a, b) == expected_b64
    expected_lines = buf.count(b"\n") + (0 if not buf or buf.endswith(b"\n") else 1)
    assert py.count_lines(view) == cy.count_lines(view) == expected_lines
    ref_slice = reference_utf8_slice(buf, a, b)
    assert py.utf8_slice(view, a, b) == cy.utf8_slice(view, a, b) == ref_slice
    ref_offset = reference_utf8_offset(buf, a, b)
    assert py.utf8_offset(view, a, b) == cy.utf8_offset(view, a, b) == ref_offset
    span = py.line_offsets(view, first, last)
    assert span == cy.line_offsets(view, first, last)
    start, end = span
    assert 0 <= start <= end <= n
    assert buf[start:end] == reference_line_bytes(buf, first, last)
