"""Framing core benchmarks: compiled vs pure-Python fallback vs the obvious baselines.

Run:  pytest bench/                      (full sizes, ~1 min)
      SHOAL_BENCH_QUICK=1 pytest bench/  (CI sizes, well under 2 min)
The ratios (compiled/readline, bound_text vs bytes.count, slice size independence)
are printed at the end of the session and written to bench/.results/framing.json by
bench/report.py (hooked in bench/conftest.py).
"""

from __future__ import annotations

import mmap
import os

import pytest

from shoal_mcp.protocol.framing import backends
from shoal_mcp.protocol.limits import READ_CHUNK, MiB

QUICK = os.environ.get("SHOAL_BENCH_QUICK", "") not in ("", "0")
BACKENDS = backends()
COMPILED = BACKENDS.get("cython")
FALLBACK = BACKENDS["python"]

READER_BYTES = (8 if QUICK else 64) * MiB
TEXT_BYTES = (8 if QUICK else 64) * MiB
SMALL_FRAME = 200
BIG_FRAME = 1 * MiB
SPARSE_BYTES = 1 << 30  # sparse: costs no disk or time even in quick mode
SLICE_BYTES = 4096

pytestmark = [
    pytest.mark.benchmark(
        max_time=0.25 if QUICK else 1.0, min_rounds=3 if QUICK else 5, warmup=False
    ),
]


def _need_compiled():
    if COMPILED is None:
        pytest.skip("compiled framing core not built")
    return COMPILED


# --- data -----------------------------------------------------------------------------


def _frames_file(directory, frame_size: int, total: int):
    """A file of ``total // frame_size`` JSON-ish frames, each exactly frame_size bytes."""
    count = max(1, total // frame_size)
    path = directory / f"frames-{frame_size}.ndjson"
    with open(path, "wb") as fh:
        for i in range(count):
            head = b'{"jsonrpc":"2.0","id":%d,"result":{"text":"' % i
            tail = b'"}}\n'
            fh.write(head + b"x" * (frame_size - len(head) - len(tail)) + tail)
    return path, count


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-framing")


@pytest.fixture(scope="module")
def small_frames(data_dir):
    return _frames_file(data_dir, SMALL_FRAME, READER_BYTES)


@pytest.fixture(scope="module")
def big_frames(data_dir):
    return _frames_file(data_dir, BIG_FRAME, READER_BYTES)


# --- reader -----------------------------------------------------------------------------


def _read_iter(module, path):
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 0
        for _frame in module.FrameReader(fd):
            n += 1
        return n
    finally:
        os.close(fd)


def _read_batches(module, path):
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = module.FrameReader(fd)
        n = 0
        while True:
            batch = reader.read_frames()
            if not batch:
                return n
            for _frame in batch:
                n += 1
    finally:
        os.close(fd)


def _readline(path, buffering=-1):
    with open(path, "rb", buffering=buffering) as fh:  # io.BufferedReader
        readline = fh.readline
        n = 0
        while True:
            line = readline()
            if not line:
                return n
            n += 1


READERS = {
    "compiled": lambda path: _read_iter(_need_compiled(), path),
    "compiled-batches": lambda path: _read_batches(_need_compiled(), path),
    "fallback": lambda path: _read_iter(FALLBACK, path),
    "readline": lambda path: _readline(path),
    "readline-256KiB-buffer": lambda path: _readline(path, READ_CHUNK),
}


@pytest.mark.parametrize("impl", list(READERS))
def test_reader_small_frames(benchmark, small_frames, impl):
    path, count = small_frames
    benchmark.group = f"reader: {SMALL_FRAME} B frames, {READER_BYTES // MiB} MiB file"
    benchmark.extra_info.update(bytes=READER_BYTES, frames=count)
    assert benchmark(READERS[impl], path) == count


@pytest.mark.parametrize("impl", list(READERS))
def test_reader_big_frames(benchmark, big_frames, impl):
    path, count = big_frames
    benchmark.group = f"reader: 1 MiB frames, {READER_BYTES // MiB} MiB file"
    benchmark.extra_info.update(bytes=READER_BYTES, frames=count)
    assert benchmark(READERS[impl], path) == count


# --- bound_text -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_text():
    line = "0123456789 short output line of a command\n"
    text = line * (TEXT_BYTES // len(line))
    return text, text.encode("utf-8")


@pytest.mark.parametrize("impl", ["compiled", "fallback", "bytes.count"])
def test_bound_text_64mib(benchmark, big_text, impl):
    text, data = big_text
    benchmark.group = f"bound_text: {TEXT_BYTES // MiB} MiB of short lines"
    benchmark.extra_info.update(bytes=len(data))
    if impl == "bytes.count":
        result = benchmark(data.count, b"\n")
        assert result == text.count("\n")
        return
    module = _need_compiled() if impl == "compiled" else FALLBACK
    out = benchmark(module.bound_text, text, 65536, "shoal://out/1")
    assert len(out.encode()) <= 65536


# --- b64_slice --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def blobs(data_dir):
    """A 1 GiB sparse file and a 1 MiB file, both mmap'd read-only."""
    maps = {}
    handles = []
    for label, size in (("1GiB", SPARSE_BYTES), ("1MiB", 1 * MiB)):
        path = data_dir / f"blob-{label}"
        with open(path, "wb") as fh:
            fh.seek(size - SLICE_BYTES)
            fh.write(bytes(range(256)) * (SLICE_BYTES // 256))
        fh = open(path, "rb")  # noqa: SIM115 - closed in the finalizer below
        handles.append(fh)
        maps[label] = (mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size)
    yield maps
    for mm, _ in maps.values():
        mm.close()
    for fh in handles:
        fh.close()


@pytest.mark.parametrize("blob", ["1GiB", "1MiB"])
@pytest.mark.parametrize("impl", ["compiled", "fallback"])
def test_b64_slice_end_of_blob(benchmark, blobs, impl, blob):
    mm, size = blobs[blob]
    module = _need_compiled() if impl == "compiled" else FALLBACK
    benchmark.group = f"b64_slice: {SLICE_BYTES} B at the end of an mmap'd blob"
    benchmark.extra_info.update(blob_bytes=size)
    out = benchmark(module.b64_slice, mm, size - SLICE_BYTES, size)
    assert len(out) == 4 * ((SLICE_BYTES + 2) // 3)
