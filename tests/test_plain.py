"""protocol/plain.py: the tagged wire form to plain JSON (what people read)."""

from __future__ import annotations

import json

from shoal_mcp.protocol.plain import dumps, to_plain


def test_scalars_and_containers():
    wire = {
        "$": "record",
        "v": {
            "n": {"$": "null"},
            "b": {"$": "bool", "v": True},
            "i": {"$": "int", "v": 7},
            "f": {"$": "float", "v": 1.5},
            "s": {"$": "str", "v": "x"},
            "l": {"$": "list", "v": [{"$": "int", "v": 1}, {"$": "str", "v": "2"}]},
            "d": {"$": "datetime", "v": "2026-12-03T08:00:00Z"},
        },
    }
    assert to_plain(wire) == {
        "n": None,
        "b": True,
        "i": 7,
        "f": 1.5,
        "s": "x",
        "l": [1, "2"],
        "d": "2026-12-03T08:00:00Z",
    }


def test_big_integers_stay_exact():
    value = to_plain({"$": "int", "v": "123456789012345678901234567890"})
    assert value == 123456789012345678901234567890
    assert dumps(value) == "123456789012345678901234567890"


def test_bytes_outcomes_and_elided_parts():
    wire = {
        "$": "outcome",
        "status": 1,
        "ok": False,
        "out": {"$": "bytes", "v": "/w=="},
        "err": {
            "$": "ref",
            "uri": "shoal://out/3?path=.err",
            "of": "str",
            "bytes": 90000,
            "lines": 3,
            "preview": {"$": "str", "v": "head"},
        },
        "cmd": {"$": "str", "v": "false"},
    }
    assert to_plain(wire) == {
        "status": 1,
        "ok": False,
        "out": {"base64": "/w=="},
        "err": {
            "$ref": "shoal://out/3?path=.err",
            "of": "str",
            "bytes": 90000,
            "lines": 3,
            "preview": "head",
        },
        "cmd": "false",
    }


def test_plain_input_passes_through_and_nothing_tagged_is_left():
    plain = {"a": [1, {"b": None}], "c": "d"}
    assert to_plain(plain) == plain
    nested = {"$": "list", "v": [{"$": "record", "v": {"k": {"$": "list", "v": []}}}]}
    out = to_plain(nested)
    assert out == [{"k": []}] and '"$"' not in json.dumps(out)
