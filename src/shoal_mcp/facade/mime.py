"""One mimeType per kind of ``shoal://`` URI, used alike by links, templates and reads.

A URI's read answers JSON unless it asks for text (``format=render`` or ``format=raw``
of text); blobs (``shoal://val/…``, binary raw pages) are bytes, sent as ``blob``.
"""

from __future__ import annotations

from ..protocol import uri

JSON = "application/json"
TEXT = "text/plain"
BINARY = "application/octet-stream"

TEXT_FORMATS = ("render", "raw")


def mime_for(kind: str | None, fmt: str | None) -> str:
    """What reading a URI of ``kind`` with ``format=fmt`` returns (text raw pages: TEXT)."""
    if kind == uri.VAL:
        return BINARY
    return TEXT if fmt in TEXT_FORMATS else JSON


def mime_for_uri(text: str) -> str:
    try:
        parsed = uri.parse_uri(text)
    except uri.BadName:
        return JSON
    return mime_for(parsed.kind, parsed.query.get("format"))
