"""JSON outputs show their shape in the render (docs/protocol.md, Paging), and `.json`
parses are bounded in size and in how many run at once (docs/protocol.md, Limits)."""

from __future__ import annotations

import re
import threading

import pytest

from shoal_mcp.kernel.config.limits import JSON_SELECTOR_MAX
from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.limits import MiB
from tests.support.kernel import close_client
from tests.support.procfs import rss_kib
from tests.support.results import call_err

PATH = re.compile(r"(\.out(?:\.lines\[\d+\])?\.json[^\s:]*): ")


@pytest.fixture(scope="module")
def sc(kernel):
    c = kernel.client("shape")
    yield c
    close_client(c)


def py(c, code: str) -> dict:
    return c.call("exec", {"src": f"python3 -c '{code}'"}, timeout=120)


def shape_of(render: str) -> str:
    assert "\n\nJSON" in render, render[-500:]
    return "JSON" + render.rsplit("\n\nJSON", 1)[1]


def test_one_line_json_shows_keys_types_lengths_and_an_element(sc):
    ran = py(
        sc,
        'import json; print(json.dumps({"items": [{"id": i, "name": "n%d" % i, "tags": [1]}'
        ' for i in range(60000)], "count": 60000, "meta": {"v": 1}}))',
    )
    shape = shape_of(ran["render"])
    assert len(ran["render"].encode()) <= 8 * 1024  # within the same render budget
    assert ".out.json.items: array[60000] of object" in shape
    assert ".out.json.count: int = 60000" in shape
    assert ".out.json.meta: object{1 keys}" in shape
    assert ".out.json.items[0].name: str(2)" in shape
    for path in PATH.findall(shape):  # every path shown resolves
        sc.call("value.get", {"ref": ran["ref"], "path": path}, timeout=30)
    third = sc.call("value.get", {"ref": ran["ref"], "path": ".out.json.items[3].name"}, timeout=30)
    assert third["value"] == {"$": "str", "v": "n3"}


def test_pretty_json_array_and_json_lines(sc):
    pretty = py(
        sc, 'import json; print(json.dumps([{"a": i, "b": [i]} for i in range(20000)], indent=2))'
    )
    shape = shape_of(pretty["render"])
    assert "JSON: array[20000] of object" in shape and ".out.json[0].b: array[1] of int" in shape
    lines = py(
        sc, 'import json\nfor i in range(3000): print(json.dumps({"ts": i, "level": "INFO"}))'
    )
    shape = shape_of(lines["render"])
    assert shape.startswith("JSON lines (3000 lines")
    assert ".out.lines[0].json.level: str(4)" in shape
    got = sc.call("value.get", {"ref": lines["ref"], "path": ".out.lines[7].json.ts"}, timeout=30)
    assert got["value"] == {"$": "int", "v": 7}


def test_no_shape_for_text_or_small_json(sc):
    assert "\n\nJSON" not in py(sc, 'print("{" + "x" * 20000)')["render"]
    assert "\n\nJSON" not in py(sc, 'import json; print(json.dumps({"a": 1}))')["render"]
    assert "\n\nJSON" not in py(sc, 'print("\\n".join(map(str, range(9000))))')["render"]


def test_json_past_the_parse_limit_is_a_clear_error(sc):
    ran = py(sc, f'import sys; sys.stdout.write("[" + "1," * {JSON_SELECTOR_MAX // 2} + "1]")')
    err = call_err(sc, "value.get", {"ref": ran["ref"], "path": ".out.json[0]"})
    assert err.code == ErrorCode.BAD_SELECTION
    assert str(JSON_SELECTOR_MAX) in err.message and "match" in err.message


def test_parallel_json_parses_keep_kernel_memory_bounded(kernel):
    """4 parallel `.json` selections of a 16 MiB output: kernel RSS grows <= 64 MiB."""
    setup = kernel.client("shape-rss")
    size = 16 * MiB - 64 * 1024
    ran = setup.call(
        "exec",
        {
            "src": f'python3 -c \'import json,sys; sys.stdout.write(json.dumps({{"items": ["x" * 1000] * {size // 1006}}}))\''
        },
        timeout=120,
    )
    clients = [kernel.client("shape-rss") for _ in range(4)]
    try:
        before = rss_kib(kernel.pid)
        peak = [before]
        done = threading.Event()

        def poll() -> None:
            while not done.wait(0.005):
                peak[0] = max(peak[0], rss_kib(kernel.pid))

        poller = threading.Thread(target=poll)
        poller.start()
        results: list = []

        def select(c) -> None:
            results.append(
                c.call("value.get", {"ref": ran["ref"], "path": ".out.json.items[7]"}, timeout=120)
            )

        threads = [threading.Thread(target=select, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        poller.join()
        assert [r["value"] for r in results] == [{"$": "str", "v": "x" * 1000}] * 4
        growth_mib = (peak[0] - before) / 1024
        print(f"kernel RSS growth, 4 parallel .json of 16 MiB: {growth_mib:.1f} MiB")
        assert growth_mib <= 64, (growth_mib, before, peak)
    finally:
        for c in [setup, *clients]:
            close_client(c)
