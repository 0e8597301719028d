"""Moving stored output to the terminal: raw pages to stdout/stderr, hints in CLI syntax.

The kernel answers at most one bounded page per ``value.get``; the CLI, which writes to
a file descriptor rather than into a model's context, pages through as far as it was
asked, writing bytes as they are (non-UTF-8 output stays byte-exact).
"""

from __future__ import annotations

import base64
import re
import shlex
import sys
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol
from urllib.parse import parse_qs, urlsplit

import orjson

from ..protocol.limits import VALUE_HARD_CAP

RAW_PAGE_BYTES = VALUE_HARD_CAP * 3 // 4
"""What the CLI asks per raw page (the kernel clamps a page to what encodes in 64 KiB)."""

_MCP_HINT = re.compile(r"fetch with shoal_get (\{[^{}\n]*\}) or read (\S+)")
_MATCH_HINT = re.compile(r'shoal_get \{"ref": "([^"\s]+)", "match": "REGEX"\}')
_OUT_LINES = re.compile(r"^\.out\.lines\[(-?\d*\.\.-?\d*)\]$")

Call = Callable[[str, dict], Any]


class ByteSink(Protocol):
    """Where raw pages go: a binary stream or anything that writes and flushes bytes."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


def get_command(ref: str, path: str | None, target_uri: str | None = None) -> str:
    """The ``shoal get`` command line that fetches ``path`` of ``ref``."""
    words = ["shoal", "get", ref]
    lines = _OUT_LINES.match(path or "")
    if lines:
        words += ["--lines", lines.group(1)]
    elif path:
        words += ["--path", path]
    query = parse_qs(urlsplit(target_uri).query) if target_uri else {}
    if query.get("format") == ["raw"]:
        words += ["--format", "raw"]
        if "offset" in query:
            words += ["--offset", query["offset"][0]]
    return " ".join(shlex.quote(w) for w in words)


def cli_hints(text: str) -> str:
    """Rewrite the kernel's model-oriented hints (``fetch with shoal_get {…} or read
    shoal://…``) into the command a person types."""

    def rewrite(match: re.Match[str]) -> str:
        try:
            args = orjson.loads(match.group(1))
        except orjson.JSONDecodeError:
            return match.group(0)
        if not isinstance(args, dict) or not isinstance(args.get("ref"), str):
            return match.group(0)
        return "see: " + get_command(args["ref"], args.get("path"), match.group(2))

    text = _MCP_HINT.sub(rewrite, text)
    return _MATCH_HINT.sub(lambda m: f"shoal get {shlex.quote(m.group(1))} --match REGEX", text)


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
