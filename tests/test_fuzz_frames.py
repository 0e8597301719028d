"""Fuzzing the frame reader (issue #9, docs/protocol.md, Framing): both backends, random chunkings.

Invariants (``fuzz_targets.check_frames``): feeding never raises; events are only
``bytes`` frames and ``Oversize``; no frame exceeds ``max_frame``; the events equal a
reference model of the framing rules; every byte is scanned exactly once and accounted for; the
decoder never holds more than max(max_frame, OVERSIZE_HEAD) bytes between feeds.

The long run is ``python bench/fuzz_frames.py --executions 1000000``; the seed corpus
(``tests/fuzz_corpus/``) is replayed here too, so a crash found there and saved as a
corpus file stays fixed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal_mcp.protocol.limits import OVERSIZE_HEAD
from tests.support.fuzz_targets import MAX_FRAMES, check_frames, chunk_cuts, one_input

CORPUS = Path(__file__).parent / "fuzz_corpus"
SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}

# Bytes biased towards the ones that matter to a framer: newlines, CRs, JSON punctuation.
_interesting = st.sampled_from(
    [b"\n", b"\r", b"\r\n", b"\n\n", b"{", b"}", b'"', b"x", b"\x00", b"\xff"]
)
_piece = st.one_of(
    st.binary(max_size=40),
    _interesting,
    st.builds(lambda b, n: b * n, _interesting, st.integers(1, 64)),
    st.builds(
        lambda n: b"a" * n,
        st.sampled_from([OVERSIZE_HEAD - 1, OVERSIZE_HEAD, OVERSIZE_HEAD + 1, 5000]),
    ),
)
streams = st.lists(_piece, max_size=30).map(b"".join)


@st.composite
def _cuts(draw, length: int) -> list[int]:
    points = draw(st.lists(st.integers(0, length), max_size=20))
    return sorted(set(points))


@settings(max_examples=2000, **SETTINGS)
@given(data=streams, max_frame=st.sampled_from(MAX_FRAMES), cut_data=st.data())
def test_decoder_invariants_random_chunkings(data, max_frame, cut_data):
    cuts = cut_data.draw(_cuts(len(data)))
    check_frames(data, cuts, max_frame)


@settings(max_examples=1000, **SETTINGS)
@given(data=streams, max_frame=st.integers(1, 6000), seed=st.integers(0, 255))
def test_decoder_invariants_any_limit(data, max_frame, seed):
    check_frames(data, chunk_cuts(len(data), seed), max_frame)


@settings(max_examples=2000, **SETTINGS)
@given(data=st.binary(min_size=2, max_size=600))
def test_one_input_raw_bytes(data):
    one_input(data)


@pytest.mark.parametrize("path", sorted(CORPUS.iterdir()), ids=lambda p: p.name)
def test_seed_corpus(path):
    one_input(path.read_bytes())


def test_corpus_is_there():
    assert len(list(CORPUS.iterdir())) >= 10
