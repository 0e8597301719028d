"""Moving stored output to the terminal: raw pages to stdout/stderr, hints in CLI syntax.

The kernel answers at most one bounded page per ``value.get``; the CLI, which writes to
a file descriptor rather than into a model's context, pages through as far as it was
asked, writing bytes as they are (non-UTF-8 output stays byte-exact).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import sys
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol

from ..protocol import uri
from ..protocol.limits import VALUE_HARD_CAP

RAW_PAGE_BYTES = VALUE_HARD_CAP * 3 // 4
"""What the CLI asks per raw page (the kernel clamps a page to what encodes in 64 KiB)."""

_MCP_CALL = re.compile(r"shoal_get \{")
_READ_TAIL = re.compile(r"\s+or read " + re.escape(uri.SCHEME) + r"\S+")
_PAGE_NOTE = re.compile(r"pages of up to [^;()]*; ")
_LINES_PATH = re.compile(r"^(.*)\.lines\[(-?\d*)\.\.(-?\d*)\]$")

Call = Callable[[str, dict], Any]


class ByteSink(Protocol):
    """Where raw pages go: a binary stream or anything that writes and flushes bytes."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


# -- one line numbering ------------------------------------------------------------------
#
# People count lines from 1, inclusive at both ends, as sed -n 'A,Bp' does: previews
# ("lines 11-20"), --match results and --from-line already do. The kernel's selector
# ``.lines[a..b]`` is a slice (0-based, end excluded). ``--lines A..B`` is the person's
# form; these two functions convert (negative numbers count from the end in both and
# mean the same line: -1 is the last).


def lines_to_slice(spec: str) -> str:
    """``--lines A..B`` (1-based, inclusive) as the kernel's ``a..b`` slice."""
    start_s, sep, end_s = spec.partition("..")
    if not sep:
        start_s = end_s = spec  # one line: --lines 7
    try:
        start = int(start_s) if start_s else None
        end = int(end_s) if end_s else None
    except ValueError:
        raise ValueError(
            f"--lines {spec!r}: expected A..B (numbers, either may be left out)"
        ) from None
    if start == 0 or end == 0:
        raise ValueError(f"--lines {spec!r}: lines are numbered from 1 (-1 is the last)")
    a = "" if start is None else str(start - 1 if start > 0 else start)
    b = "" if end is None or end == -1 else str(end if end > 0 else end + 1)
    return f"{a}..{b}"


def slice_to_lines(a: str, b: str) -> str:
    """The kernel's ``a..b`` slice as ``--lines A..B`` (1-based, inclusive)."""
    start = "" if not a else str(int(a) + 1 if int(a) >= 0 else int(a))
    end = "" if not b else str(int(b) if int(b) > 0 else int(b) - 1)
    return f"{start}..{end}"


HINT_HOST: dict[str, str | None] = {"host": None}
"""``shoal --host H`` given on the command line: pasted hints need it too (from
``SHOAL_HOST`` they do not: the same shell has it)."""


def get_command(args: dict) -> str:
    """The ``shoal get`` command line for the kernel's ``value.get`` params ``args``."""
    host = HINT_HOST["host"]
    words = ["shoal", *(["--host", host] if host else []), "get", str(args.get("ref", ""))]
    path = args.get("path") or ""
    lines = _LINES_PATH.match(path)
    if lines:
        if lines.group(1) not in (".out", ""):
            words += ["--path", lines.group(1)]
        words += ["--lines", slice_to_lines(lines.group(2), lines.group(3))]
    elif path:
        words += ["--path", path]
    match = args.get("match")
    if isinstance(match, str):
        match = {"regex": match}
    if isinstance(match, dict):
        words += ["--match", str(match.get("regex", ""))]
        for key, flag in (("from_line", "--from-line"), ("max", "--max"), ("context", "-C")):
            if match.get(key):
                words += [flag, str(match[key])]
        words += [f for key, f in (("ignore_case", "-i"), ("invert", "-v")) if match.get(key)]
    if args.get("format") == "raw":
        words += ["--format", "raw"]
        if args.get("offset"):
            words += ["--offset", str(args["offset"])]
    return " ".join(shlex.quote(w) for w in words)


def cli_hints(text: str) -> str:
    """Rewrite the kernel's model-oriented hints (``shoal_get {…}`` and ``or read
    shoal://…``) into the command a person types."""
    out = []
    pos = 0
    decoder = json.JSONDecoder()
    for found in _MCP_CALL.finditer(text):
        if found.start() < pos:
            continue
        try:
            args, end = decoder.raw_decode(text, found.end() - 1)
        except ValueError:
            continue
        if not isinstance(args, dict) or not isinstance(args.get("ref"), str):
            continue
        tail = _READ_TAIL.match(text, end)
        if tail:  # the URI form may ask for raw bytes: the person's command does too
            query = _hint_query(tail.group(0).split("read ", 1)[1])
            if query.get("format") == "raw":
                args = {**args, "format": "raw", "offset": int(query.get("offset") or 0)}
        out.append(text[pos : found.start()])
        out.append(get_command(args))
        pos = tail.end() if tail else end
    out.append(text[pos:])
    text = "".join(out).replace("fetch with shoal ", "see: shoal ")
    return _PAGE_NOTE.sub("", text)  # `shoal get --lines` pages by itself


def _hint_query(text: str) -> dict[str, str]:
    """The query of a hint's ``shoal://`` URI; none when it is not one (the text around a
    hint is the command's own output, which may say anything)."""
    try:
        return uri.parse_uri(text).query
    except uri.BadName:
        return {}


def next_page(render: str) -> tuple[str, dict | None]:
    """A lines render without its "next page: shoal_get {…}" trailer, and that call's
    params (None on the last page)."""
    marker = render.rfind("\n… lines ")
    if marker < 0 or "next page: shoal_get {" not in render[marker:]:
        return render, None
    start = render.index("shoal_get {", marker) + len("shoal_get ")
    try:
        args, _ = json.JSONDecoder().raw_decode(render, start)
    except ValueError:
        return render, None
    return render[: marker + 1], args if isinstance(args, dict) else None


def page_bytes(page: dict) -> bytes:
    if "raw_base64" in page:
        return base64.b64decode(page["raw_base64"])
    return str(page.get("raw", "")).encode("utf-8", "surrogateescape")


def copy_raw(
    call: Call,
    ref: str,
    path: str,
    out: ByteSink,
    offset: int = 0,
    limit: int | None = None,
) -> tuple[int, int]:
    """Write ``path`` of ``ref`` from ``offset`` to ``out``, page by page, at most
    ``limit`` bytes (None: to the end). Returns (next offset, total size)."""
    total = offset
    while limit is None or limit > 0:
        want = RAW_PAGE_BYTES if limit is None else min(limit, RAW_PAGE_BYTES)
        page = call(
            "value.get",
            {"ref": ref, "path": path, "format": "raw", "offset": offset, "length": want},
        )
        data = page_bytes(page)
        total = page.get("total", offset + len(data))
        if data:
            out.write(data)
            out.flush()
        offset = page.get("offset", offset) + page.get("length", len(data))
        if limit is not None:
            limit -= len(data)
        if not data or offset >= total:
            break
    return offset, total


def binary(stream: Any) -> BinaryIO:
    """The byte stream under a text stream (click's test runner gives bytes already)."""
    return getattr(stream, "buffer", stream)


def stdout_bytes() -> BinaryIO:
    sys.stdout.flush()
    return binary(sys.stdout)


def stderr_bytes() -> BinaryIO:
    sys.stderr.flush()
    return binary(sys.stderr)
