"""A 169 MB command output through a live kernel (docs/architecture.md, Memory bounds; issue #3).

``seq 1 20000000`` goes straight to the CAS; the kernel's peak RSS stays small, the exec
result stays within the 8 KiB default, and every part of the output stays addressable.
"""

from __future__ import annotations

import base64
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from shoal_mcp.kernel.config.limits import ELIDE_MAX_BYTES, ELIDE_MAX_BYTES_RAW
from shoal_mcp.protocol.limits import VALUE_HARD_CAP
from tests.support.kernel import close_client, running_kernel

N = 20_000_000
TOTAL_BYTES = sum((min(N, 10**d - 1) - 10 ** (d - 1) + 1) * (d + 1) for d in range(1, 9))
HWM_LIMIT_KIB = 100 * 1024
FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module")
def big():
    # Its own short temp dir, removed as soon as the module is done: 169 MB of CAS.
    with running_kernel(prefix="shoal-big-") as k:
        c = k.client("big")
        try:
            result = c.call("exec", {"src": f"seq 1 {N}"}, timeout=300)
            hwm = k.vm_hwm_kib()
            FIGURES.update(vm_hwm_kib_after_exec=hwm, result_bytes=len(orjson.dumps(result)))
            yield k, c, result, hwm
        finally:
            close_client(c)


def test_total_bytes_formula():
    assert TOTAL_BYTES == 168_888_897


def test_kernel_memory_stays_flat(big):
    k, _, _, hwm = big
    print(f"\nVmHWM after seq 1 {N}: {hwm} KiB")
    assert hwm < HWM_LIMIT_KIB, f"kernel VmHWM {hwm} KiB"


def test_result_is_bounded(big):
    _, _, result, _ = big
    size = len(orjson.dumps(result))
    print(f"\nexec result: {size} bytes encoded")
    assert size <= ELIDE_MAX_BYTES
    out = result["value"]["out"]
    assert out["$"] == "ref"
    assert out["uri"] == f"{result['uri']}?path=.out"
    assert out["bytes"] == TOTAL_BYTES
    assert out["lines"] == N
    assert out["of"] == "str"
    assert out["preview"].startswith("1\n2\n3\n")
    assert out["render_head"].split("\n")[:3] == ["1", "2", "3"]
    assert result["value"]["ok"] is True and result["value"]["status"] == 0


def test_render_shows_head_tail_and_names_the_uri(big):
    _, _, result, _ = big
    render = result["render"]
    lines = render.split("\n")
    assert lines[0] == "1"
    assert lines[-1] == str(N)
    assert lines[-2] == str(N - 1)
    marker = next(line for line in lines if "elided" in line)
    assert result["uri"] in marker
    assert result["ref"] in marker
    assert ".out.lines[" in marker
    assert len(render.encode()) <= ELIDE_MAX_BYTES


def test_marker_selection_resolves(big):
    _, c, result, _ = big
    marker = next(line for line in result["render"].split("\n") if "elided" in line)
    path = marker.split('"path": "')[1].split('"')[0]
    got = c.call("value.get", {"ref": result["ref"], "path": path}, timeout=60)
    ref = got["value"]
    assert ref["$"] == "ref"  # 20M lines: elided again, but counted
    assert ref["n"] == N - 20
    assert ref["preview"][0] == "11"


def test_last_lines_by_path(big):
    _, c, result, _ = big
    got = c.call("value.get", {"ref": result["ref"], "path": ".out.lines[-3..]"}, timeout=60)
    assert got["value"] == {
        "$": "list",
        "v": [{"$": "str", "v": str(n)} for n in (N - 2, N - 1, N)],
    }
    one = c.call("value.get", {"ref": result["ref"], "path": ".out.lines[-1]"}, timeout=60)
    assert one["value"] == {"$": "str", "v": str(N)}
    first = c.call("value.get", {"ref": result["ref"], "path": ".out.lines[0]"}, timeout=60)
    assert first["value"] == {"$": "str", "v": "1"}


def test_raw_last_page_has_total_and_no_next(big):
    _, c, result, _ = big
    first = c.call("value.get", {"ref": result["ref"], "path": ".out", "format": "raw"}, timeout=60)
    total = first["total"]
    assert total == TOTAL_BYTES
    assert first["offset"] == 0 and first["length"] == ELIDE_MAX_BYTES_RAW
    assert first["raw"].startswith("1\n2\n3\n")
    assert "next" in first
    last = c.call(
        "value.get",
        {"ref": result["ref"], "path": ".out", "format": "raw", "offset": total - 4096},
        timeout=60,
    )
    assert last["total"] == total
    assert last["offset"] == total - 4096
    assert last["length"] == 4096
    assert len(last["raw"].encode()) == 4096
    assert last["raw"].endswith(f"{N - 2}\n{N - 1}\n{N}\n")
    assert "next" not in last


def _q(uri: str) -> dict:
    return {k: v[-1] for k, v in parse_qs(urlsplit(uri).query).items()}


def test_raw_pages_chain_through_next(big):
    _, c, result, _ = big
    offset = TOTAL_BYTES // 2 + 3  # mid-line, on purpose
    pages = []
    params = {"ref": result["ref"], "path": ".out", "format": "raw", "offset": offset}
    for _ in range(3):
        page = c.call("value.get", params, timeout=60)
        pages.append(page)
        q = _q(page["next"])
        assert q["format"] == "raw" and q["path"] == ".out"
        assert int(q["offset"]) == page["offset"] + page["length"]
        # follow the URI itself as the ref (its path comes from the query)
        params = {
            "ref": page["next"],
            "format": "raw",
            "offset": int(q["offset"]),
            "length": int(q["length"]),
        }
    for a, b in zip(pages, pages[1:], strict=False):
        assert b["offset"] == a["offset"] + a["length"]
    text = "".join(p["raw"] for p in pages)
    nums = [int(x) for x in text.split("\n")[1:-1]]  # drop the partial first/last lines
    assert nums == list(range(nums[0], nums[0] + len(nums)))
    assert len(nums) > 1000
    # the same bytes through blob.get
    digest = _out_hash(c, result["ref"])
    blob = c.call(
        "blob.get", {"hash": digest, "offset": offset, "length": len(text.encode())}, timeout=60
    )
    assert base64.b64decode(blob["base64"]) == text.encode()


def test_raw_page_never_exceeds_hard_cap(big):
    _, c, result, _ = big
    page = c.call(
        "value.get",
        {
            "ref": result["ref"],
            "path": ".out",
            "format": "raw",
            "length": VALUE_HARD_CAP,
            "offset": 1000,
        },
        timeout=60,
    )
    assert len(orjson.dumps(page)) <= VALUE_HARD_CAP + 512  # page + its small envelope
    assert page["length"] <= VALUE_HARD_CAP


def _out_hash(c, ref: str) -> str:
    rows = c.call("journal.query", {"session": "big", "limit": 10}, timeout=30)["rows"]
    row = next(r for r in rows if r.get("ref") == ref)
    out = next(o for o in row["outputs"] if o["kind"] == "out")
    assert out["len"] == TOTAL_BYTES
    return out["hash"]


def test_blob_get_ranges(big):
    _, c, result, _ = big
    digest = _out_hash(c, result["ref"])
    head = c.call("blob.get", {"hash": digest, "offset": 0, "length": 6}, timeout=30)
    assert base64.b64decode(head["base64"]) == b"1\n2\n3\n"
    assert head["total"] == TOTAL_BYTES and head["offset"] == 0 and head["length"] == 6
    assert _q(head["next"])["offset"] == "6"
    tail = c.call(
        "blob.get", {"hash": digest, "offset": TOTAL_BYTES - 10, "length": 100}, timeout=30
    )
    assert base64.b64decode(tail["base64"]) == f"\n{N}\n".encode()
    assert tail["length"] == 10 and "next" not in tail
    past = c.call("blob.get", {"hash": digest, "offset": TOTAL_BYTES + 5}, timeout=30)
    assert past["length"] == 0 and past["base64"] == ""


def test_memory_still_flat_after_tail_selections(big):
    """Head/tail selections read a few pages of the mmap, not the whole blob."""
    k, _, _, _ = big
    hwm = k.vm_hwm_kib()
    FIGURES["vm_hwm_kib_after_selections"] = hwm
    print(f"\nVmHWM after tail selections: {hwm} KiB; figures {FIGURES}")
    assert hwm < HWM_LIMIT_KIB


@pytest.mark.parametrize("k", [5_000, 7_654_321, 10_000_000, 12_345_678, N - 5_000])
def test_middle_lines_by_path_keep_memory_flat(big, k):
    """Lines in the middle are found by counting pread blocks, not by mapping 169 MB."""
    kernel, c, result, _ = big
    got = c.call(
        "value.get", {"ref": result["ref"], "path": f".out.lines[{k}..{k + 3}]"}, timeout=60
    )
    assert got["value"] == {"$": "list", "v": [{"$": "str", "v": str(k + j + 1)} for j in range(3)]}
    one = c.call("value.get", {"ref": result["ref"], "path": f".out.lines[{k}]"}, timeout=60)
    assert one["value"] == {"$": "str", "v": str(k + 1)}
    hwm = kernel.vm_hwm_kib()
    FIGURES[f"vm_hwm_kib_after_line_{k}"] = hwm
    assert hwm < HWM_LIMIT_KIB, f"VmHWM {hwm} KiB after selecting line {k}"
