"""The streamed `.json` walk and the bounded skeleton agree with a whole parse.

``select_streaming`` follows fields, indexes (negative ones too) and ranges over parse
events; ``parse_bounded`` builds a document whole up to its limits and cuts containers
past them (``CutList``/``CutDict``, whose ``len`` is exact). Property tests compare both
with ``orjson.loads`` on generated documents and paths.
"""

from __future__ import annotations

import io
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal_mcp.kernel.values import jsonstream
from shoal_mcp.kernel.values.jsonstream import (
    CutDict,
    CutList,
    is_cut,
    parse_bounded,
    select_streaming,
)
from shoal_mcp.kernel.values.selectors import Field, Index, Range, Segment
from shoal_mcp.protocol.errors import RpcError

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # past 2**63: the big-integer fallback
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=8),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=4), inner, max_size=6)
    ),
    max_leaves=40,
)


def _opener(doc: Any):
    data = orjson.dumps(doc)
    return lambda: io.BytesIO(data)


def _path_into(doc: Any, draw) -> list[Segment]:
    path: list[Segment] = []
    node = doc
    while isinstance(node, (list, dict)) and node and draw(st.booleans()):
        if isinstance(node, dict):
            key = draw(st.sampled_from(sorted(node)))
            path.append(Field(key))
            node = node[key]
        else:
            i = draw(st.integers(-len(node), len(node) - 1))
            path.append(Index(i))
            node = node[i]
    return path


def _follow(doc: Any, path: list[Segment]) -> Any:
    for seg in path:
        doc = doc[seg.name] if isinstance(seg, Field) else doc[seg.i]  # type: ignore[union-attr]
    return doc


@settings(max_examples=300)
@given(documents, st.data())
def test_a_streamed_path_selects_what_a_whole_parse_does(doc, data):
    path = _path_into(doc, data.draw)
    got, used = select_streaming(_opener(doc), path, [Field("json")])
    assert used == len(path)
    expected = _follow(doc, path)
    assert got == expected
    assert orjson.dumps(got) == orjson.dumps(expected)


@settings(max_examples=200)
@given(
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=12),  # what orjson writes
    st.one_of(st.none(), st.integers(-15, 15)),
    st.one_of(st.none(), st.integers(-15, 15)),
)
def test_a_streamed_range_is_python_slicing(items, a, b):
    got, used = select_streaming(_opener({"xs": items}), [Field("xs"), Range(a, b)], [])
    assert used == 2 and got == items[a:b]


@settings(max_examples=300)
@given(documents)
def test_a_small_document_is_built_whole(doc):
    got = parse_bounded(_opener(doc), ".out.json")
    assert got == doc and not is_cut(got)


def test_containers_past_the_limits_are_cut_with_exact_lengths(monkeypatch):
    monkeypatch.setattr(jsonstream, "SKELETON_ITEMS_KEPT", 3)
    doc = {"big": list(range(10)), "wide": {f"k{i}": i for i in range(7)}, "after": "tail"}
    got = parse_bounded(_opener(doc), ".out.json")
    assert isinstance(got, CutDict) is False  # three members: kept whole
    assert isinstance(got["big"], CutList) and len(got["big"]) == 10
    assert list(got["big"]) == [0, 1, 2]  # the kept head
    assert isinstance(got["wide"], CutDict) and len(got["wide"]) == 7
    assert list(got["wide"].items()) == [("k0", 0), ("k1", 1), ("k2", 2)]
    assert got["after"] == "tail"  # members after a cut container are still read


def test_the_node_budget_cuts_what_comes_after_it(monkeypatch):
    monkeypatch.setattr(jsonstream, "SKELETON_NODES", 5)
    got = parse_bounded(_opener([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), ".out.json")
    assert len(got) == 3 and is_cut(got)  # counted to the end
    assert got[0] == [1, 2, 3]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ([Field("a"), Field("zz")], "no field 'zz'"),
        ([Field("a"), Index(0)], "record cannot be indexed"),
        ([Field("l"), Field("x")], "list has no field 'x'"),
        ([Field("l"), Index(5)], "index 5 out of range"),
        ([Field("l"), Index(-5)], "index -5 out of range for length 2"),
    ],
)
def test_streamed_errors_name_the_path(path, message):
    with pytest.raises(RpcError) as err:
        select_streaming(_opener({"a": {"b": 1}, "l": [1, 2]}), path, [Field("json")])
    assert message in err.value.message


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": [1, 2', b"[1, 2] trailing garbage"])
def test_invalid_json_is_a_clear_error(text):
    with pytest.raises(RpcError) as err:
        parse_bounded(lambda: io.BytesIO(text), ".out.json")
    assert "not valid JSON" in err.value.message
