"""``$SHOAL_OUT`` (docs/protocol.md, Exec): inside exec, ``$SHOAL_OUT/<n>/out`` and
``/err`` are the caller's earlier outputs, read-only, and only its own."""

from __future__ import annotations

import os

import pytest

from shoal_mcp.kernel.access.namespaces import mounted_at
from shoal_mcp.kernel.values.output_entries import DIR_MODE, FILE_MODE
from shoal_mcp.kernel.values.outputs import SharedOutputs
from tests.support.kernel import close_client


def run(c, src: str) -> dict:
    return c.call("exec", {"src": src}, timeout=60)


def text(c, src: str) -> str:
    ref = run(c, src)["ref"]
    return c.call(
        "value.get", {"ref": ref, "path": ".out", "format": "raw", "length": 65536}, timeout=30
    )["raw"]


def test_earlier_outputs_are_files(kernel):
    c = kernel.client("shoal-out")
    try:
        first = run(c, "seq 1 100000 | sed 's/^777$/FAILED 777/'; echo oops >&2")["ref"]
        n = first.split(":")[1]
        assert text(c, f'grep -c FAILED "$SHOAL_OUT/{n}/out"') == "1\n"
        assert text(c, f'grep -n FAILED "$SHOAL_OUT/{n}/out"') == "777:FAILED 777\n"
        assert text(c, f'cat "$SHOAL_OUT/{n}/err"') == "oops\n"
        assert text(c, f'wc -l < "$SHOAL_OUT/{n}/out"') == "100000\n"
        # read-only files and directories (root's DAC override aside: docs/protocol.md)
        modes = text(c, f'stat -c %a "$SHOAL_OUT/{n}/out" "$SHOAL_OUT/{n}" "$SHOAL_OUT"')
        assert modes == f"{FILE_MODE:o}\n{DIR_MODE:o}\n{DIR_MODE:o}\n"
        wrote = text(c, f'(echo x >> "$SHOAL_OUT/{n}/out") 2>&1; touch "$SHOAL_OUT/new" 2>&1; true')
        # root's writes ignore modes: refused by the read-only mount, or (where the kernel
        # may not mount) written to its copy
        if os.geteuid() != 0 or mounted_at(str(kernel.state / "outputs-ro")):
            assert "Permission denied" in wrote or "Read-only file system" in wrote, wrote
            assert text(c, f'tail -n 1 "$SHOAL_OUT/{n}/out"') == "100000\n"
            assert text(c, 'ls "$SHOAL_OUT" | grep -c new || true') == "0\n"
        # whoever runs the kernel, the stored output itself is intact
        whole = c.call("value.get", {"ref": first, "path": ".out.lines[-1]"}, timeout=30)
        assert whole["value"] == {"$": "str", "v": "100000"}
        # the latest output is there for the next exec (and the env var is per exec)
        mid = run(c, "echo later")["ref"].split(":")[1]
        assert text(c, f'cat "$SHOAL_OUT/{mid}/out"') == "later\n"
    finally:
        close_client(c)


@pytest.mark.skipif(os.geteuid() != 0, reason="the root kernel's $SHOAL_OUT")
def test_a_root_kernel_links_outputs_instead_of_copying_them(kernel):
    """Issue 31: a root kernel kept a full copy of every output (disk doubled). Now its
    entries are hard links to the CAS blobs, shown through a read-only mount."""
    if not mounted_at(str(kernel.state / "outputs-ro")):
        pytest.skip("this kernel may not mount (no CAP_SYS_ADMIN): it keeps copies")
    c = kernel.client("shoal-out-links")
    try:
        n = run(c, "seq 1 200000")["ref"].split(":")[1]
        shown = text(c, f'stat -c "%i %h" "$SHOAL_OUT/{n}/out"; echo "$SHOAL_OUT"').split("\n")
        inode, links = (int(x) for x in shown[0].split())
        assert shown[1].startswith(str(kernel.state / "outputs-ro")), shown
        blobs = [p for p in (kernel.state / "cas").rglob("*") if p.is_file()]
        assert inode in {p.stat().st_ino for p in blobs}, "the entry is not the stored blob"
        assert links >= 2
        copies = kernel.state / "outputs" / ".copies"
        assert not copies.exists() or not any(p.is_file() for p in copies.rglob("*"))
        refused = text(c, f'(echo x >> "$SHOAL_OUT/{n}/out") 2>&1; true')
        assert "Read-only file system" in refused, refused
    finally:
        close_client(c)


def test_sessions_and_principals_are_apart(kernel):
    a = kernel.client("shoal-out-a")
    b = kernel.client("shoal-out-b")
    try:
        run(a, "echo secret-in-a")
        dir_a = text(a, 'printf %s "$SHOAL_OUT"')
        dir_b = text(b, 'printf %s "$SHOAL_OUT"')
        assert dir_a != dir_b and os.path.dirname(dir_a) == os.path.dirname(dir_b)
        # b's session holds only b's outputs
        assert text(b, 'grep -rc secret-in-a "$SHOAL_OUT" | grep -vc ":0$" || true') == "0\n"
        assert text(a, 'grep -rl secret-in-a "$SHOAL_OUT" | wc -l') == "1\n"
        state = kernel.state
        outputs = SharedOutputs(state / "outputs", None, None)  # type: ignore[arg-type]
        assert outputs.session_dir("someone-else", "shoal-out-a") != outputs.session_dir(
            f"uid:{os.getuid()}", "shoal-out-a"
        )
        assert str(outputs.principal_dir("p")).startswith(str(state / "outputs"))
        checked = 0
        for root, _, files in os.walk(state / "outputs"):
            if os.path.basename(root).isdigit():  # <n>/out, <n>/err (not root's own files)
                assert os.stat(root).st_mode & 0o777 == DIR_MODE
                for name in files:
                    assert os.stat(os.path.join(root, name)).st_mode & 0o777 == FILE_MODE
                    checked += 1
        assert checked >= 2
    finally:
        close_client(a)
        close_client(b)
