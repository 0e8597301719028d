"""Drop OSC strings from terminal output before it reaches the emulator.

pyte accumulates an operating-system command (``ESC ] … BEL`` / ``ESC ] … ESC \\``)
in memory until its terminator arrives, so a program that never terminates one could
grow the kernel without bound. shoal shows screens, not window titles, so OSC strings
are removed here, in a sans-I/O filter whose state survives chunk boundaries and whose
memory is constant.
"""

from __future__ import annotations

ESC = 0x1B
BEL = 0x07
OSC_INTRO = ord("]")
ST_FINAL = ord("\\")

NORMAL, AFTER_ESC, IN_OSC, OSC_AFTER_ESC = range(4)


class OscFilter:
    def __init__(self) -> None:
        self.state = NORMAL
        self.dropped = 0  # bytes of OSC strings removed so far (for tests and logs)

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if self.state == NORMAL:
                j = data.find(b"\x1b", i)
                if j < 0:
                    out += data[i:]
                    break
                out += data[i:j]
                self.state = AFTER_ESC
                i = j + 1
            elif self.state == AFTER_ESC:
                if data[i] == OSC_INTRO:
                    self.state = IN_OSC
                    self.dropped += 2
                else:
                    out.append(ESC)  # not an OSC: give the escape back to the emulator
                    self.state = NORMAL
                    continue
                i += 1
            elif self.state == IN_OSC:
                j = _find_any(data, i)
                if j < 0:
                    self.dropped += n - i
                    break
                self.dropped += j - i + 1
                self.state = NORMAL if data[j] == BEL else OSC_AFTER_ESC
                i = j + 1
            elif data[i] == ST_FINAL:  # OSC_AFTER_ESC: ESC \ ends the string
                self.dropped += 1
                self.state = NORMAL
                i += 1
            else:  # any other ESC x aborts the string and starts a new sequence (as xterm)
                self.state = AFTER_ESC
        return bytes(out)


def _find_any(data: bytes, start: int) -> int:
    """Index of the first BEL or ESC at or after ``start``, or -1."""
    bel = data.find(b"\x07", start)
    esc = data.find(b"\x1b", start)
    if bel < 0:
        return esc
    if esc < 0:
        return bel
    return min(bel, esc)
