"""The elision's sizes without encoding (values/elision.py): what it measures instead of
dumping a value again must agree with the encoding, for every string; and a reply
measured while it was fitted is not measured twice."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from shoal_mcp.kernel.values.elision import (
    STR_NODE_OVERHEAD,
    ElideOptions,
    WireEncoder,
    str_encoded_size,
)


@given(st.text())
def test_str_encoded_size_is_the_encoded_length(text: str) -> None:
    assert str_encoded_size(text) == len(orjson.dumps(text))


@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F)))
def test_ascii_with_escapes_is_sized_right(text: str) -> None:
    assert str_encoded_size(text) == len(orjson.dumps(text))
    assert str_encoded_size(text) + STR_NODE_OVERHEAD == len(orjson.dumps({"$": "str", "v": text}))


def _encoder() -> WireEncoder:
    return WireEncoder(ElideOptions(), "shoal://out/1", [], lambda node: node)


def test_a_fitted_record_knows_its_size() -> None:
    encoder = _encoder()
    wire = encoder.encode({"a": "x" * 100, "b": [1, 2, 3]})
    assert encoder.measured_size(wire) == len(orjson.dumps(wire))


def test_a_value_that_was_not_fitted_has_no_size() -> None:
    encoder = _encoder()
    wire = encoder.encode("just a string")  # scalars are not fitted: measured by the caller
    assert encoder.measured_size(wire) is None
    assert encoder.measured_size(dict(wire)) is None  # another object, even if equal
