"""Selections read only what they select (issue #31, Bounded): live kernel, peak RSS.

A slice of one very long line reads the slice, not the line; a path into a `.json`
document streams to its part instead of building the whole tree. Sizes are CI-sized
(the bench, bench/test_bench_bounded_values.py, runs the issue's 1 GiB / 16 MiB).
Peak growth is measured from ``/proc/PID/clear_refs`` (VmHWM reset) to VmHWM.
"""

from __future__ import annotations

import threading

import pytest

from tests.support.kernel import close_client, running_kernel
from tests.support.procfs import peak_growth_kib, reset_peak_rss, rss_kib

LINE_BYTES = 64 * 1024 * 1024
"""One line this long: the old code mapped all of it for a tail slice (+64 MiB RSS)."""
SLICE_GROWTH_LIMIT_KIB = 16 * 1024

JSON_RECORDS = 40_000
"""About 3.5 MiB of JSON records; built as Python objects that is ~45 MiB."""


@pytest.fixture(scope="module")
def kernel():
    with running_kernel(prefix="shoal-bnd-") as k:
        c = k.client("bounded")
        try:
            line = c.call(
                "exec", {"src": f"head -c {LINE_BYTES} /dev/zero | tr '\\0' a; echo"}, timeout=300
            )
            assert line["value"]["out"]["bytes"] == LINE_BYTES + 1
            program = (
                'BEGIN { printf "{\\"meta\\":{\\"n\\":%d},\\"items\\":[", N;'
                ' for (i = 0; i < N; i++) printf "%s{\\"id\\":%d,\\"name\\":\\"n%d\\",'
                '\\"tags\\":[\\"a\\",\\"b\\",%d],\\"v\\":%d.5}", (i ? "," : ""), i, i, i % 7, i;'
                ' print "]}" }'
            )
            json_run = c.call("exec", {"src": f"awk -v N={JSON_RECORDS} '{program}'"}, timeout=300)
            doc_bytes = json_run["value"]["out"]["bytes"]
            yield k, c, line["ref"], json_run["ref"], doc_bytes
        finally:
            close_client(c)


def _peak_of(k, fn) -> int:
    reset_peak_rss(k.pid)
    base = rss_kib(k.pid)
    fn()
    return peak_growth_kib(k.pid, base)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".out[-11..-1]", "a" * 10),
        (".out[-3..]", "aa\n"),
        (".out.lines[0][-10..]", "a" * 10),
        (".out.lines[-1][-5..-3]", "aa"),
        (f".out[{LINE_BYTES - 4}..{LINE_BYTES + 9}]", "aaaa\n"),
    ],
)
def test_slice_of_a_long_line_reads_only_the_slice(kernel, path, expected):
    k, c, line_ref, _, _ = kernel
    got: dict = {}

    def select() -> None:
        got.update(c.call("value.get", {"ref": line_ref, "path": path}, timeout=120))

    growth = _peak_of(k, select)
    print(f"\n{path}: peak RSS growth {growth} KiB")
    assert got["value"] == {"$": "str", "v": expected}
    assert growth < SLICE_GROWTH_LIMIT_KIB, f"{path}: kernel peak RSS grew {growth} KiB"


def test_two_slices_at_once_stay_bounded(kernel):
    k, _, line_ref, _, _ = kernel
    clients = [k.client("bounded") for _ in range(2)]
    results: list[dict] = []

    def one(c) -> None:
        results.append(c.call("value.get", {"ref": line_ref, "path": ".out[-10..]"}, timeout=120))

    def both() -> None:
        threads = [threading.Thread(target=one, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    try:
        growth = _peak_of(k, both)
    finally:
        for c in clients:
            close_client(c)
    print(f"\ntwo tail slices at once: peak RSS growth {growth} KiB")
    assert [r["value"]["v"] for r in results] == ["a" * 9 + "\n"] * 2
    assert growth < SLICE_GROWTH_LIMIT_KIB


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".out.json.meta.n", JSON_RECORDS),
        (".out.json.items[12345].name", "n12345"),
        (".out.json.items[-1].tags[-1]", (JSON_RECORDS - 1) % 7),
        (".out.json.items[-2..][0].id", JSON_RECORDS - 2),
        (".out.json.items[100..102][1].v", 101.5),
    ],
)
def test_json_path_streams_to_its_part(kernel, path, expected):
    """Memory within 2x the document (the old full parse built ~13x of objects)."""
    k, c, _, json_ref, doc_bytes = kernel
    got: dict = {}

    def select() -> None:
        got.update(c.call("value.get", {"ref": json_ref, "path": path}, timeout=120))

    growth = _peak_of(k, select)
    print(f"\n{path}: peak RSS growth {growth} KiB for a {doc_bytes}-byte document")
    assert got["value"]["v"] == expected
    assert growth * 1024 <= 2 * doc_bytes, f"{path}: peak RSS grew {growth} KiB"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (".out.json.nope", "no field 'nope' at .out.json.nope"),
        (".out.json.items.x", "list has no field 'x'"),
        (".out.json.meta[0]", "record cannot be indexed"),
        (".out.json.items[99999999]", "index 99999999 out of range"),
        (f".out.json.items[-{JSON_RECORDS + 1}]", "out of range for length"),
    ],
)
def test_json_path_errors_are_clear_and_bounded(kernel, path, message):
    k, c, _, json_ref, doc_bytes = kernel
    errors: list[Exception] = []

    def select() -> None:
        try:
            c.call("value.get", {"ref": json_ref, "path": path}, timeout=120)
        except Exception as exc:  # the kernel's RpcError, re-raised by the client
            errors.append(exc)

    growth = _peak_of(k, select)
    assert errors and message in str(errors[0])
    assert growth * 1024 <= 2 * doc_bytes


@pytest.mark.parametrize("path", [".out.json", ".out.json.items"])
def test_a_whole_large_document_is_a_bounded_skeleton(kernel, path):
    """A path ending at a large document (or a large part) builds a bounded skeleton:
    containers past the skeleton's limits are refs with their exact lengths."""
    k, c, _, json_ref, doc_bytes = kernel
    got: dict = {}

    def select() -> None:
        got.update(c.call("value.get", {"ref": json_ref, "path": path}, timeout=120))

    growth = _peak_of(k, select)
    print(f"\n{path}: peak RSS growth {growth} KiB for a {doc_bytes}-byte document")
    value = got["value"]
    items = value if path.endswith("items") else value["v"]["items"]
    assert items["$"] == "ref" and items["n"] == JSON_RECORDS
    assert items["uri"].endswith("path=.out.json.items")
    assert items["preview"][0]["v"]["name"] == {"$": "str", "v": "n0"}
    if path == ".out.json":
        assert value["v"]["meta"]["v"]["n"] == {"$": "int", "v": JSON_RECORDS}
    assert growth * 1024 <= 2 * doc_bytes, f"{path}: peak RSS grew {growth} KiB"
