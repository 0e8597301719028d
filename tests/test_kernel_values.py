"""``value.get`` over real stored outputs (docs/protocol.md, Values): path grammar, slices, formats,
elision refs that resolve, and the error codes for bad selections and refs."""

from __future__ import annotations

import base64

import orjson
import pytest

from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.limits import VALUE_HARD_CAP
from tests.support.kernel import close_client
from tests.support.results import call_err

SNOW = "h\u00e9llo w\u00f6rld \u2603 \U0001f600 end"


@pytest.fixture(scope="module")
def vc(kernel):
    c = kernel.client("values")
    refs = {
        "seq": c.call("exec", {"src": "seq 0 29"}, timeout=30)["ref"],
        "json": c.call(
            "exec", {"src": """echo '{"a":{"b":[1,2]},"s":"x","n":null}'"""}, timeout=30
        )["ref"],
        "snow": c.call("exec", {"src": f"printf '%s' '{SNOW}'"}, timeout=30)["ref"],
        "bytes": c.call("exec", {"src": r"printf '\x00\x01\x02\xff\xfe'"}, timeout=30)["ref"],
        "big": c.call("exec", {"src": "seq 1 5000"}, timeout=30)["ref"],
        "notjson": c.call("exec", {"src": "echo 'not json {'"}, timeout=30)["ref"],
    }
    yield c, refs
    close_client(c)


def get(c, ref: str, **params) -> dict:
    return c.call("value.get", {"ref": ref, **params}, timeout=30)


def strs(*items: str) -> dict:
    return {"$": "list", "v": [{"$": "str", "v": s} for s in items]}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".out.lines[0]", {"$": "str", "v": "0"}),
        (".out.lines[-1]", {"$": "str", "v": "29"}),
        (".out.lines[2..5]", strs("2", "3", "4")),
        (".out.lines[-20..]", strs(*(str(i) for i in range(10, 30)))),
        (".out.lines[..3]", strs("0", "1", "2")),
        (".out.lines[-3..-1]", strs("27", "28")),
        (".out.lines[28..100]", strs("28", "29")),
        (".out.lines[5..2]", {"$": "list", "v": []}),
        (".out.lines[ 1 .. 2 ]", strs("1")),
        (".out.lines[2..5][1]", {"$": "str", "v": "3"}),
        (".out.lines[-20..][..2]", strs("10", "11")),
        ('["out"].lines[0]', {"$": "str", "v": "0"}),
        (".status", {"$": "int", "v": 0}),
        (".ok", {"$": "bool", "v": True}),
        (".cmd", {"$": "str", "v": "seq 0 29"}),
        (".cmd.lines[0]", {"$": "str", "v": "seq 0 29"}),
    ],
)
def test_path_grammar_on_lines(vc, path, expected):
    c, refs = vc
    got = get(c, refs["seq"], path=path)
    assert got["value"] == expected, path
    assert got["ref"] == refs["seq"]


def test_json_selector(vc):
    c, refs = vc
    assert get(c, refs["json"], path=".out.json.a.b[1]")["value"] == {"$": "int", "v": 2}
    assert get(c, refs["json"], path='.out.json["a"]["b"][-2]')["value"] == {"$": "int", "v": 1}
    assert get(c, refs["json"], path=".out.json.s")["value"] == {"$": "str", "v": "x"}
    assert get(c, refs["json"], path=".out.json.n")["value"] == {"$": "null"}
    rec = get(c, refs["json"], path=".out.json.a")["value"]
    assert rec == {
        "$": "record",
        "v": {"b": {"$": "list", "v": [{"$": "int", "v": 1}, {"$": "int", "v": 2}]}},
    }


def test_slice_on_str_counts_code_points(vc):
    c, refs = vc
    assert get(c, refs["snow"], path=".out")["value"] == {"$": "str", "v": SNOW}
    assert get(c, refs["snow"], path=".out", slice=[1, 4])["value"] == {"$": "str", "v": "\u00e9ll"}
    assert get(c, refs["snow"], path=".out", slice=[12, 15])["value"] == {
        "$": "str",
        "v": "\u2603 \U0001f600",
    }
    assert get(c, refs["snow"], path=".out", slice=[-3, None])["value"] == {"$": "str", "v": "end"}
    assert get(c, refs["snow"], path=".out", slice=[None, 2])["value"] == {
        "$": "str",
        "v": "h\u00e9",
    }
    assert get(c, refs["snow"], path=".out", slice="7..12")["value"] == {
        "$": "str",
        "v": SNOW[7:12],
    }
    assert get(c, refs["snow"], path=".out", slice=[3, 1])["value"] == {"$": "str", "v": ""}
    # raw of a code-point slice is that exact text
    raw = get(c, refs["snow"], path=".out", slice=[12, 15], format="raw")
    assert raw["raw"] == "\u2603 \U0001f600" and raw["total"] == len("\u2603 \U0001f600".encode())


def test_slice_on_lists_and_bytes(vc):
    c, refs = vc
    assert get(c, refs["seq"], path=".out.lines", slice=[1, 3])["value"] == strs("1", "2")
    assert get(c, refs["seq"], path=".out.lines", slice=[-2, None])["value"] == strs("28", "29")
    assert get(c, refs["json"], path=".out.json.a.b", slice=[1, None])["value"] == {
        "$": "list",
        "v": [{"$": "int", "v": 2}],
    }
    b = get(c, refs["bytes"], path=".out")["value"]
    assert b["$"] == "bytes" and base64.b64decode(b["v"]) == b"\x00\x01\x02\xff\xfe"
    sl = get(c, refs["bytes"], path=".out", slice=[1, 4])["value"]
    assert sl["$"] == "bytes" and base64.b64decode(sl["v"]) == b"\x01\x02\xff"
    raw = get(c, refs["bytes"], path=".out", format="raw")
    assert base64.b64decode(raw["raw_base64"]) == b"\x00\x01\x02\xff\xfe" and raw["total"] == 5


@pytest.mark.parametrize(
    ("ref_key", "params"),
    [
        ("seq", {"path": ".out.lines[abc]"}),
        ("seq", {"path": "out"}),
        ("seq", {"path": ".out.lines[0"}),
        ("seq", {"path": ".out.lines[1..2..3]"}),
        ("seq", {"path": ".nope"}),
        ("seq", {"path": ".out.lines[30]"}),
        ("seq", {"path": ".out.lines[-31]"}),
        ("seq", {"path": ".status.x"}),
        ("seq", {"path": ".status[0]"}),
        ("seq", {"path": ".status", "slice": [0, 1]}),
        ("seq", {"path": ".out", "slice": "1-3"}),
        ("seq", {"path": ".out.lines", "format": "raw"}),
        ("notjson", {"path": ".out.json"}),
        ("json", {"path": ".out.json.a.zz"}),
        ("json", {"path": ".out.json.a.b[2]"}),
        ("seq", {"path": ".out.lines[0]" * 70}),
    ],
)
def test_bad_selection(vc, ref_key, params):
    c, refs = vc
    err = call_err(c, "value.get", {"ref": refs[ref_key], **params})
    assert err.code == ErrorCode.BAD_SELECTION, err


def test_overlong_path_is_invalid_params(vc):
    c, refs = vc
    err = call_err(c, "value.get", {"ref": refs["seq"], "path": "." + "a" * 1100})
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "path"


def test_bad_slice_shape_is_invalid_params(vc):
    c, refs = vc
    err = call_err(c, "value.get", {"ref": refs["seq"], "path": ".out", "slice": [1]})
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "slice"


@pytest.mark.parametrize(
    "ref",
    [
        "out:99999",
        "out:0",
        "bogus",
        "out:x",
        "shoal://nope/1",
        "shoal://out/abc",
        "shoal://out/99999",
        "shoal://out/1/../2",
        "out:" + "9" * 30,
        "shoal://out/" + "9" * 30,
    ],
)
def test_unknown_ref(vc, ref):
    c, _ = vc
    err = call_err(c, "value.get", {"ref": ref})
    assert err.code == ErrorCode.UNKNOWN_REF, (ref, err)


def test_refs_are_per_session(vc, kernel):
    c, refs = vc
    other = kernel.client("values-other")
    try:
        own = other.call("exec", {"src": "echo mine"}, timeout=30)["ref"]
        assert own == "out:1"
        assert get(other, own, path=".out")["value"] == {"$": "str", "v": "mine\n"}
        # out:N names this session's transcript: the first session's out:6 is not visible here
        assert refs["notjson"] == "out:6"
        err = call_err(other, "value.get", {"ref": "out:6"})
        assert err.code == ErrorCode.UNKNOWN_REF
        assert get(c, "out:1", path=".cmd")["value"] == {"$": "str", "v": "seq 0 29"}
    finally:
        close_client(other)


def test_uri_forms_resolve(vc):
    c, refs = vc
    n = refs["seq"].split(":")[1]
    assert get(c, f"shoal://out/{n}", path=".out.lines[1]")["value"] == {"$": "str", "v": "1"}
    assert get(c, f"shoal://out/{n}?path=.out.lines")["value"]["$"] == "list"
    chained = get(c, f"shoal://out/{n}?path=.out.lines", path="[-1]")
    assert chained["value"] == {"$": "str", "v": "29"}
    assert chained["path"] == ".out.lines[-1]"
    encoded = get(c, f"shoal://out/{n}?path=%2Eout%2Elines%5B2%5D")
    assert encoded["value"] == {"$": "str", "v": "2"}


def test_formats(vc):
    c, refs = vc
    js = get(c, refs["seq"])
    assert js["value"]["$"] == "outcome" and "render" not in js
    both = get(c, refs["seq"], with_render=True)
    assert both["render"].startswith("0\n1\n")
    render = get(c, refs["seq"], format="render")
    assert "value" not in render and render["render"].startswith("0\n1\n2\n")
    rl = get(c, refs["seq"], path=".out.lines[..3]", format="render")
    assert rl["render"] == "0\n1\n2"
    raw = get(c, refs["seq"], path=".out", format="raw")
    assert raw["raw"] == "".join(f"{i}\n" for i in range(30))
    assert raw["offset"] == 0 and raw["length"] == raw["total"] == len(raw["raw"])
    assert "next" not in raw
    page = get(c, refs["seq"], path=".out", format="raw", offset=10, length=6)
    assert page["raw"] == "".join(f"{i}\n" for i in range(30)).encode()[10:16].decode()
    assert page["next"].endswith("offset=16&length=6")
    line_raw = get(c, refs["seq"], path=".out.lines[7]", format="raw")
    assert line_raw["raw"] == "7"
    err = call_err(c, "value.get", {"ref": refs["seq"], "format": "yaml"})
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "format"


def test_render_of_long_output_names_uri(vc):
    c, refs = vc
    r = get(c, refs["big"], format="render", elide={"max_bytes": 1024})
    lines = r["render"].split("\n")
    assert lines[0] == "1" and lines[-1] == "5000"
    assert len(r["render"].encode()) <= 1024
    assert any("shoal://out/" in line and "elided" in line for line in lines)


def test_elide_max_bytes_gives_resolvable_ref(vc):
    c, refs = vc
    v = get(c, refs["big"], elide={"max_bytes": 1024})["value"]
    assert len(orjson.dumps(v)) <= 1024
    assert v["$"] == "outcome" and v["status"] == 0
    out = v["out"]
    assert out["$"] == "ref" and out["of"] == "str"
    assert out["lines"] == 5000 and out["bytes"] == len("".join(f"{i}\n" for i in range(1, 5001)))
    whole = get(c, out["uri"], format="raw", length=VALUE_HARD_CAP // 2)
    assert whole["raw"] == "".join(f"{i}\n" for i in range(1, 5001))
    assert get(c, out["uri"], path=".lines[-1]")["value"] == {"$": "str", "v": "5000"}
    # a budget too small for even the out ref elides the whole outcome; that ref resolves too
    tiny = get(c, refs["big"], elide={"max_bytes": 256})["value"]
    assert len(orjson.dumps(tiny)) <= 256
    assert tiny["$"] == "ref" and tiny["of"] == "outcome"
    assert tiny["preview"]["status"] == 0
    assert get(c, tiny["uri"], path=".out.lines[0]")["value"] == {"$": "str", "v": "1"}


def test_elide_max_items_gives_resolvable_ref(vc):
    c, refs = vc
    got = get(c, refs["seq"], path=".out.lines", elide={"max_items": 3})
    ref = got["value"]
    assert ref["$"] == "ref" and ref["n"] == 30 and ref["of"] == "list"
    assert ref["preview"][:3] == ["0", "1", "2"]
    resolved = get(c, ref["uri"])
    assert resolved["value"] == strs(*(str(i) for i in range(30)))
    # a record with more fields than max_items elides too
    rec = get(c, refs["json"], path=".out.json", elide={"max_items": 1})["value"]
    assert rec["$"] == "ref" and rec["of"] == "record"
    assert get(c, rec["uri"], path=".a.b[0]")["value"] == {"$": "int", "v": 1}


def test_elided_list_items_stay_addressable(vc):
    c, refs = vc
    got = get(c, refs["big"], path=".out.lines[..600]")
    ref = got["value"]
    assert ref["$"] == "ref"  # 600 > max_items 500
    assert ref["uri"].endswith("?path=.out.lines[..600]")
    assert get(c, ref["uri"], path="[599]")["value"] == {"$": "str", "v": "600"}


def test_hard_cap_holds_whatever_is_asked(vc):
    c, refs = vc
    got = get(
        c, refs["big"], path=".out.lines", elide={"max_bytes": VALUE_HARD_CAP, "max_items": 100000}
    )
    assert len(orjson.dumps(got["value"])) <= VALUE_HARD_CAP


def test_render_of_many_long_lines_is_bounded_and_its_marker_resolves(vc):
    """A range of 1,000 lines of 5,000 bytes renders as a page within max_bytes.

    Guards the regression where each line was looked up from the start of the blob
    (quadratic) and every line was materialised before bounding. A line longer than the
    page is shown up to the page, continued by raw pages of that line, then the range.
    """
    c, _ = vc
    ref = c.call(
        "exec", {"src": "head -c 5000000 /dev/zero | tr '\\0' a | fold -w 5000"}, timeout=60
    )["ref"]
    got = get(
        c, ref, path=".out.lines", format="render", elide={"max_items": 100000, "max_bytes": 4096}
    )
    render = got["render"]
    assert len(render.encode()) <= 4096
    assert '"path": ".out.lines[0]", "format": "raw"' in render
    assert '"path": ".out.lines[1..1000]"' in render
    page = get(c, ref, path=".out.lines[1..1000]", format="render")["render"]
    body, marker = page.rsplit("\n", 1)
    assert body.split("\n") == ["a" * 5000] * 12  # 12 whole lines fill a 64 KiB page
    assert '"path": ".out.lines[13..1000]"' in marker
