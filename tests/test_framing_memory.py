"""Evidence: a 1 GiB line with no newline costs a reader ~MAX_FRAME, not 1 GiB.

The promise is in docs/protocol.md, Framing.

A child process (one per backend, chosen with SHOAL_PURE_PYTHON) reads a real pipe
with FrameReader while this process writes 1 GiB of ``x`` without a newline, then
``\\n{"id":1}\\n``, then closes. The child resets its peak-RSS counter (VmHWM, via
/proc/self/clear_refs) right before reading, and reports the events it got and its
peak RSS growth. The figure is written to a JSON file, recorded as a junit property,
and included in the assertion message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from shoal_mcp.protocol.limits import MAX_FRAME, MiB

GIB = 1 << 30
SLACK = 8 * MiB

CHILD = textwrap.dedent(
    """
    import json, os, sys

    fd, out_path, want = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    from shoal_mcp.protocol.framing import BACKEND, FrameReader, Oversize

    def status(key):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    reader = FrameReader(fd)
    try:  # reset the high-water mark so the growth is the reader's alone
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        reset = True
    except OSError:
        reset = False
    base_rss = status("VmRSS")
    base_hwm = status("VmHWM")
    events = []
    for event in reader:
        if isinstance(event, Oversize):
            events.append(["oversize", event.discarded_bytes, len(event.head),
                           event.head[:8].decode("latin-1")])
        else:
            events.append(["frame", event.decode("latin-1")])
    peak = status("VmHWM")
    growth = peak - (base_rss if reset else base_hwm)
    result = {"backend": BACKEND, "wanted": want, "events": events, "hwm_reset": reset,
              "base_rss": base_rss, "peak_hwm": peak, "growth_bytes": growth,
              "scanned": reader.scanned}
    with open(out_path, "w") as fh:
        json.dump(result, fh)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_one_gib_line_peak_memory(framing_backend, tmp_path, record_property):
    backend = framing_backend.BACKEND  # the child selects the same one by environment
    out_path = tmp_path / f"rss-{backend}.json"
    env = dict(os.environ)
    env.pop("SHOAL_PURE_PYTHON", None)
    if backend == "python":
        env["SHOAL_PURE_PYTHON"] = "1"
    rfd, wfd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(rfd), str(out_path), backend],
        pass_fds=[rfd],
        env=env,
    )
    os.close(rfd)
    try:
        block = b"x" * MiB
        for _ in range(GIB // MiB):
            os.write(wfd, block)
        os.write(wfd, b'\n{"id":1}\n')
    finally:
        os.close(wfd)
    assert child.wait(timeout=600) == 0
    result = json.loads(out_path.read_text())
    growth = result["growth_bytes"]
    summary = (
        f"backend={result['backend']} 1 GiB line: peak RSS growth {growth / MiB:.1f} MiB "
        f"(limit MAX_FRAME + 8 MiB = {(MAX_FRAME + SLACK) / MiB:.0f} MiB, "
        f"hwm_reset={result['hwm_reset']})"
    )
    record_property("peak_rss_growth_bytes", growth)
    record_property("peak_rss_summary", summary)
    print(summary)
    assert result["backend"] == backend, summary
    assert result["events"] == [["oversize", GIB, 4096, "xxxxxxxx"], ["frame", '{"id":1}']], summary
    assert result["scanned"] == GIB + 10, summary
    assert growth < MAX_FRAME + SLACK, summary
