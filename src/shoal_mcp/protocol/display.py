"""Text shown to a human who decides (approvers, journal readers): controls made visible.

Shared by the kernel (plan records' ``src_display``) and the CLI (every table cell), so a
``\\r``, an escape sequence or a bidi override in a command cannot redraw what the human
reads: ``echo hello`` printed over ``cp f ../.bashrc #``.
"""

from __future__ import annotations

# Shown as \xNN: C0 controls, DEL, C1 controls.  Shown as \u{NNNN}: characters that
# reorder or hide text on a terminal (bidi overrides and isolates, zero-width marks).
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}
_INVISIBLE = frozenset(
    [*range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2070), 0xFEFF]
)


def escape_controls(text: str) -> str:
    r"""``text`` on one line with every control character visible: ``\\`` for a
    backslash, ``\n \r \t \e``, ``\xNN`` for other C0/DEL/C1, ``\u{NNNN}`` for bidi
    and zero-width characters.  Unambiguous: distinct texts stay distinct."""
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif code < 0x20 or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif code in _INVISIBLE or 0xD800 <= code < 0xE000:
            out.append(f"\\u{{{code:04x}}}")
        else:
            out.append(ch)
    return "".join(out)
