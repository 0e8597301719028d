# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""Compiled framing core of shoal: reader, writer helpers, truncator, slicer.

What it does is documented in docs/protocol.md, Framing.

Built as ``shoal_mcp.protocol.framing._frame``. Its pure-Python twin is ``shoal_mcp.protocol.framing._pure``;
every public name here has identical observable behaviour there (the module docstring
of ``_pure`` states the shared conventions) and ``tests/test_framing_*`` prove it on
shared vectors and with Hypothesis. Change one, change the other.

Design notes
------------
* The reader reads straight into the decoder's line buffer, scans only the bytes just
  read (``memchr``, GIL released, newline positions collected in batches), and turns
  every completed line of that read into a ``bytes`` object: one copy per frame, many
  frames per syscall, no rescans.
* The line buffer is ``malloc``'d while small; past ``_SMALL_MAX`` it becomes one
  ``mmap`` reservation of ``max_frame + read chunk`` bytes (pages are only committed
  when touched), so growing never copies and never holds two copies: peak memory is
  ``max_frame + chunk`` whatever the peer sends. The reservation is returned to the OS
  as soon as the long line is finished or found oversize.
* Oversize heads live in their own ``OVERSIZE_HEAD`` buffer.
* Slicers take any C-contiguous buffer through the buffer protocol (``PyBUF_SIMPLE``)
  and touch only what they need; long scans run without the GIL.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.unicode cimport (
    PyUnicode_1BYTE_DATA,
    PyUnicode_AsUTF8AndSize,
    PyUnicode_DecodeUTF8,
    PyUnicode_New,
)
from libc.errno cimport EINTR, errno
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memchr, memcpy, memmove
from posix.unistd cimport read, write

import operator
import os
import threading

from shoal_mcp.protocol.limits import MAX_FRAME, OVERSIZE_HEAD, READ_CHUNK, TEXT_LIMIT

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #include <stdlib.h>
    #include <sys/mman.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif

    /* ---- newline counting: SSE2 byte compares, 255 vectors per horizontal sum ---- */
    static Py_ssize_t shoal_count_nl(const char *s, Py_ssize_t n) {
        const unsigned char *p = (const unsigned char *)s;
        Py_ssize_t total = 0, i = 0;
    #if defined(__SSE2__)
        const __m128i nl = _mm_set1_epi8('\\n');
        const __m128i zero = _mm_setzero_si128();
        while (n - i >= 64) {
            __m128i a0 = zero, a1 = zero, a2 = zero, a3 = zero;
            Py_ssize_t rounds = (n - i) / 64;
            if (rounds > 255) rounds = 255;
            for (Py_ssize_t r = 0; r < rounds; r++, i += 64) {
                a0 = _mm_sub_epi8(a0, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + i)), nl));
                a1 = _mm_sub_epi8(a1, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + i + 16)), nl));
                a2 = _mm_sub_epi8(a2, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + i + 32)), nl));
                a3 = _mm_sub_epi8(a3, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + i + 48)), nl));
            }
            __m128i s0 = _mm_add_epi64(_mm_sad_epu8(a0, zero), _mm_sad_epu8(a1, zero));
            __m128i s1 = _mm_add_epi64(_mm_sad_epu8(a2, zero), _mm_sad_epu8(a3, zero));
            __m128i s = _mm_add_epi64(s0, s1);
            total += (Py_ssize_t)_mm_cvtsi128_si32(s) + (Py_ssize_t)_mm_extract_epi16(s, 4);
        }
    #else
        while (n - i >= 4096) {          /* a plain loop the compiler vectorizes */
            uint32_t c = 0;
            for (int k = 0; k < 4096; k++) c += p[i + k] == '\\n';
            total += c;
            i += 4096;
        }
    #endif
        for (; i < n; i++) total += p[i] == '\\n';
        return total;
    }

    /* last '\\n' in [lo, hi), or -1 */
    static Py_ssize_t shoal_rfind_nl(const char *p, Py_ssize_t lo, Py_ssize_t hi) {
        for (Py_ssize_t i = hi - 1; i >= lo; i--) if (p[i] == '\\n') return i;
        return -1;
    }

    /* positions of up to maxn newlines in [pos, end); *stop = where scanning stopped */
    static Py_ssize_t shoal_scan_nl(const char *p, Py_ssize_t pos, Py_ssize_t end,
                                    Py_ssize_t *out, Py_ssize_t maxn, Py_ssize_t *stop) {
        Py_ssize_t k = 0;
        while (pos < end) {
            const char *q = (const char *)memchr(p + pos, '\\n', (size_t)(end - pos));
            if (q == NULL) break;
            pos = (Py_ssize_t)(q - p) + 1;
            out[k++] = pos - 1;
            if (k == maxn) { *stop = pos; return k; }
        }
        *stop = end;
        return k;
    }

    static Py_ssize_t shoal_ndigits(Py_ssize_t v) {
        Py_ssize_t d = 1;
        while (v >= 10) { v /= 10; d++; }
        return d;
    }

    /* byte offset of the lead byte number `remaining` at or after pos (or n) */
    static Py_ssize_t shoal_utf8_offset(const unsigned char *p, Py_ssize_t n,
                                        Py_ssize_t pos, Py_ssize_t remaining) {
        while (n - pos >= 256) {
            Py_ssize_t c = 0;
            for (int k = 0; k < 256; k++) c += (p[pos + k] & 0xC0) != 0x80;
            if (c > remaining) break;
            remaining -= c;
            pos += 256;
        }
        for (; pos < n; pos++) {
            if ((p[pos] & 0xC0) != 0x80) {
                if (remaining == 0) return pos;
                remaining--;
            }
        }
        return n;
    }

    #define SHOAL_LINE_BLOCK (1 << 16)

    /* start of line `index` (>= 1) or n */
    static Py_ssize_t shoal_line_start_fwd(const char *p, Py_ssize_t n, Py_ssize_t index) {
        Py_ssize_t pos = 0, remaining = index;
        while (pos < n) {
            Py_ssize_t len = n - pos < SHOAL_LINE_BLOCK ? n - pos : SHOAL_LINE_BLOCK;
            Py_ssize_t c = shoal_count_nl(p + pos, len);
            if (c < remaining) { remaining -= c; pos += len; continue; }
            for (;;) {
                const char *q = (const char *)memchr(p + pos, '\\n', (size_t)(n - pos));
                pos = (Py_ssize_t)(q - p) + 1;
                if (--remaining == 0) return pos;
            }
        }
        return n;
    }

    /* start of the `back`-th line from the end (back >= 1) or 0 */
    static Py_ssize_t shoal_line_start_back(const char *p, Py_ssize_t n, Py_ssize_t back) {
        Py_ssize_t pos = (n > 0 && p[n - 1] == '\\n') ? n - 1 : n;
        Py_ssize_t remaining = back;
        while (pos > 0) {
            Py_ssize_t lo = pos > SHOAL_LINE_BLOCK ? pos - SHOAL_LINE_BLOCK : 0;
            Py_ssize_t c = shoal_count_nl(p + lo, pos - lo);
            if (c < remaining) { remaining -= c; pos = lo; continue; }
            for (Py_ssize_t i = pos - 1; i >= lo; i--) {
                if (p[i] == '\\n' && --remaining == 0) return i + 1;
            }
        }
        return 0;
    }

    /* lines of [s, s+n) holding `needle` (no '\\n' in it): memmem to a hit, memchr to
       that line's end, on from the next line; a line is counted once however many hits */
    static Py_ssize_t shoal_count_lines_with(const char *s, Py_ssize_t n,
                                             const char *needle, Py_ssize_t m) {
        const char *p = s, *end = s + n;
        Py_ssize_t count = 0;
        while (end - p >= m) {
            const char *hit = (const char *)memmem(p, (size_t)(end - p), needle, (size_t)m);
            if (hit == NULL) break;
            count++;
            const char *nl = (const char *)memchr(hit + m, '\\n', (size_t)(end - hit - m));
            if (nl == NULL) break;
            p = nl + 1;
        }
        return count;
    }

    /* spans [start, end) of the lines of [s, s+n) holding `needle` (end past the '\\n'
       when there is one), appended to *spans (2 per line, grown with realloc); the
       number of lines, or -1 when out of memory */
    static Py_ssize_t shoal_lines_with(const char *s, Py_ssize_t n, const char *needle,
                                       Py_ssize_t m, Py_ssize_t **spans, Py_ssize_t *cap) {
        const char *p = s, *end = s + n;
        Py_ssize_t k = 0;
        while (end - p >= m) {
            const char *hit = (const char *)memmem(p, (size_t)(end - p), needle, (size_t)m);
            if (hit == NULL) break;
            const char *ls = hit;
            while (ls > p && ls[-1] != '\\n') ls--;
            const char *nl = (const char *)memchr(hit + m, '\\n', (size_t)(end - hit - m));
            const char *le = nl == NULL ? end : nl + 1;
            if (2 * (k + 1) > *cap) {
                Py_ssize_t grown = *cap ? 2 * *cap : 1024;
                Py_ssize_t *more = (Py_ssize_t *)realloc(*spans, (size_t)grown * sizeof(Py_ssize_t));
                if (more == NULL) return -1;
                *spans = more;
                *cap = grown;
            }
            (*spans)[2 * k] = ls - s;
            (*spans)[2 * k + 1] = le - s;
            k++;
            p = le;
        }
        return k;
    }

    static const char shoal_b64_alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    static void shoal_b64(const unsigned char *s, Py_ssize_t n, unsigned char *out) {
        Py_ssize_t i = 0;
        for (; i + 3 <= n; i += 3) {
            uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
            *out++ = shoal_b64_alphabet[v >> 18];
            *out++ = shoal_b64_alphabet[(v >> 12) & 63];
            *out++ = shoal_b64_alphabet[(v >> 6) & 63];
            *out++ = shoal_b64_alphabet[v & 63];
        }
        if (n - i == 1) {
            uint32_t v = (uint32_t)s[i] << 16;
            *out++ = shoal_b64_alphabet[v >> 18];
            *out++ = shoal_b64_alphabet[(v >> 12) & 63];
            *out++ = '=';
            *out++ = '=';
        } else if (n - i == 2) {
            uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8);
            *out++ = shoal_b64_alphabet[v >> 18];
            *out++ = shoal_b64_alphabet[(v >> 12) & 63];
            *out++ = shoal_b64_alphabet[(v >> 6) & 63];
            *out++ = '=';
        }
    }

    /* ---- the line buffer: malloc while small, one mmap reservation when large ---- */
    typedef struct {
        char *data;
        Py_ssize_t cap;
        size_t map_len;   /* > 0: data is an mmap reservation of this many bytes */
    } shoal_buf;

    static void shoal_buf_free(shoal_buf *b) {
        if (b->data != NULL) {
            if (b->map_len) munmap(b->data, b->map_len); else free(b->data);
        }
        b->data = NULL; b->cap = 0; b->map_len = 0;
    }

    /* room for `need` bytes, keeping the first `keep`; never more than `limit` is ever
       needed. Returns 0, or -1 when out of memory. */
    static int shoal_buf_reserve(shoal_buf *b, Py_ssize_t keep, Py_ssize_t need,
                                 Py_ssize_t limit, Py_ssize_t small_max) {
        if (need <= b->cap) return 0;
        Py_ssize_t ncap = b->cap > 0 ? b->cap : 4096;
        while (ncap < need) ncap = ncap > PY_SSIZE_T_MAX / 2 ? need : ncap * 2;
        if (ncap > limit) ncap = limit > need ? limit : need;
        if (ncap > small_max) {
            /* reserve everything this buffer may ever need, once */
            long page = sysconf(_SC_PAGESIZE);
            size_t len = (size_t)(limit > need ? limit : need);
            if (page > 0) len = (len + (size_t)page - 1) / (size_t)page * (size_t)page;
    #ifdef MAP_NORESERVE
            int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    #else
            int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    #endif
            void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
            if (m != MAP_FAILED) {
                if (keep > 0) memcpy(m, b->data, (size_t)keep);
                shoal_buf_free(b);
                b->data = (char *)m; b->cap = (Py_ssize_t)len; b->map_len = len;
                return 0;
            }
            /* no address space for a reservation: plain realloc below */
        }
        char *d = (char *)malloc((size_t)ncap);
        if (d == NULL) return -1;
        if (keep > 0) memcpy(d, b->data, (size_t)keep);
        shoal_buf_free(b);
        b->data = d; b->cap = ncap;
        return 0;
    }

    /* give a big reservation back once only `keep` (<= small) bytes are live */
    static int shoal_buf_release(shoal_buf *b, Py_ssize_t keep, Py_ssize_t small) {
        if (!b->map_len || keep > small) return 0;
        char *d = (char *)malloc((size_t)small);
        if (d == NULL) return -1;
        if (keep > 0) memcpy(d, b->data, (size_t)keep);
        shoal_buf_free(b);
        b->data = d; b->cap = small;
        return 0;
    }
    """
    ctypedef struct shoal_buf:
        char *data
        Py_ssize_t cap
        size_t map_len
    Py_ssize_t PY_SSIZE_T_MAX
    Py_ssize_t shoal_count_nl(const char *s, Py_ssize_t n) nogil
    Py_ssize_t shoal_rfind_nl(const char *p, Py_ssize_t lo, Py_ssize_t hi) nogil
    Py_ssize_t shoal_scan_nl(const char *p, Py_ssize_t pos, Py_ssize_t end,
                             Py_ssize_t *out, Py_ssize_t maxn, Py_ssize_t *stop) nogil
    Py_ssize_t shoal_ndigits(Py_ssize_t v) nogil
    Py_ssize_t shoal_utf8_offset(const unsigned char *p, Py_ssize_t n,
                                 Py_ssize_t pos, Py_ssize_t remaining) nogil
    Py_ssize_t shoal_line_start_fwd(const char *p, Py_ssize_t n, Py_ssize_t index) nogil
    Py_ssize_t shoal_line_start_back(const char *p, Py_ssize_t n, Py_ssize_t back) nogil
    Py_ssize_t shoal_count_lines_with(const char *s, Py_ssize_t n,
                                      const char *needle, Py_ssize_t m) nogil
    Py_ssize_t shoal_lines_with(const char *s, Py_ssize_t n, const char *needle,
                                Py_ssize_t m, Py_ssize_t **spans, Py_ssize_t *cap) nogil
    void shoal_b64(const unsigned char *s, Py_ssize_t n, unsigned char *out) nogil
    void shoal_buf_free(shoal_buf *b) nogil
    int shoal_buf_reserve(shoal_buf *b, Py_ssize_t keep, Py_ssize_t need,
                          Py_ssize_t limit, Py_ssize_t small_max) nogil
    int shoal_buf_release(shoal_buf *b, Py_ssize_t keep, Py_ssize_t small) nogil


BACKEND = "cython"

# Limits come from shoal_mcp.protocol.limits only (read once at import).
cdef Py_ssize_t _HEAD = OVERSIZE_HEAD

# Implementation tunables (not protocol limits).
cdef enum:
    _BATCH = 1024            # newline positions collected per GIL-free scan
cdef Py_ssize_t _SMALL_MAX = 4 << 20   # line buffers above this are an mmap reservation
cdef Py_ssize_t _NOGIL_MIN = 1 << 16   # slicer scans shorter than this keep the GIL
cdef Py_ssize_t _MAX_LIMIT = PY_SSIZE_T_MAX // 4

cdef str _CUT_CLAUSE = "first line cut, "
cdef str _NEEDLE_ERROR = "needle must be non-empty bytes without a newline"


cdef inline Py_ssize_t _clamp_index(object value, Py_ssize_t lo, Py_ssize_t hi) except? -1:
    """operator.index(value) clamped to [lo, hi] without overflowing a C integer."""
    value = operator.index(value)
    if value < lo:
        return lo
    if value > hi:
        return hi
    return value


cdef inline void _get_buffer(object obj, Py_buffer *view) except *:
    PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)


cdef inline object _os_error(int err):
    return OSError(err, os.strerror(err))


# --- reader ---------------------------------------------------------------------------


cdef class FrameDecoder:
    """Sans-I/O newline framer: ``feed(bytes)`` returns completed frames and Oversize.

    Bytes already scanned for a newline are never scanned again; ``scanned`` counts
    every byte examined so tests can prove the work is linear.
    """

    cdef shoal_buf acc          # acc.data[0:alen] is the unfinished line (not oversize)
    cdef Py_ssize_t alen
    cdef Py_ssize_t length      # bytes of the current line so far, discarded included
    cdef bint discarding
    cdef char *head             # first bytes of an oversize line
    cdef Py_ssize_t hlen
    cdef Py_ssize_t maxf
    cdef Py_ssize_t reserve     # read room the owning FrameReader needs past maxf
    cdef Py_ssize_t *nlpos
    cdef unsigned long long _scanned
    cdef object _max_frame
    cdef bint busy              # the GIL is released mid-call: refuse re-entry

    def __cinit__(self, *args, **kwargs):
        self.head = <char *>malloc(_HEAD if _HEAD > 0 else 1)
        self.nlpos = <Py_ssize_t *>malloc(_BATCH * sizeof(Py_ssize_t))
        if self.head == NULL or self.nlpos == NULL:
            raise MemoryError()

    def __init__(self, max_frame=MAX_FRAME):
        max_frame = operator.index(max_frame)
        if max_frame < 1:
            raise ValueError("max_frame must be positive")
        self._max_frame = max_frame
        self.maxf = _MAX_LIMIT if max_frame > _MAX_LIMIT else max_frame

    def __dealloc__(self):
        shoal_buf_free(&self.acc)
        free(self.head)
        free(self.nlpos)

    @property
    def max_frame(self):
        return self._max_frame

    @property
    def scanned(self):
        return self._scanned

    @scanned.setter
    def scanned(self, value):
        self._scanned = value

    @property
    def buffered(self):
        """Bytes currently held for an unfinished frame (its head once oversize)."""
        return self.hlen if self.discarding else self.alen

    def feed(self, data):
        """Consume ``data``; return the frames (bytes) and Oversize events it completed."""
        cdef Py_buffer view
        self._enter()
        try:
            _get_buffer(data, &view)
            try:
                return self._feed(<const char *>view.buf, view.len)
            finally:
                PyBuffer_Release(&view)
        finally:
            self.busy = False

    def eof(self):
        """Deliver a non-empty unterminated tail (or its Oversize) at end of input."""
        cdef list out = []
        self._enter()
        try:
            if self.length:
                self._finish(out, self.acc.data, self.alen)
                self._release()
        finally:
            self.busy = False
        return out

    # -- internals -------------------------------------------------------------------

    cdef inline int _enter(self) except -1:
        # Another thread inside feed()/read_frames() (its GIL-free scan or read) would
        # see its buffer moved under it: a decoder is not shared between threads.
        if self.busy:
            raise RuntimeError("FrameDecoder used from two threads at once")
        self.busy = True
        return 0

    cdef inline int _grow(self, Py_ssize_t need) except -1:
        if shoal_buf_reserve(&self.acc, self.alen, need, self.maxf + self.reserve,
                             _SMALL_MAX) < 0:
            raise MemoryError()
        return 0

    cdef inline int _release(self) except -1:
        cdef Py_ssize_t small = self.reserve + 4096
        if self.acc.map_len and shoal_buf_release(&self.acc, self.alen, small) < 0:
            raise MemoryError()
        return 0

    cdef inline void _top_up_head(self, const char *p, Py_ssize_t n) noexcept:
        cdef Py_ssize_t take = _HEAD - self.hlen
        if take > n:
            take = n
        if take > 0:
            memcpy(self.head + self.hlen, p, take)
            self.hlen += take

    cdef inline int _finish(self, list out, const char *p, Py_ssize_t n) except -1:
        """End of the current line; ``p[0:n]`` is the line when it is not oversize."""
        if self.discarding:
            out.append(Oversize(self.length, PyBytes_FromStringAndSize(self.head, self.hlen)))
        else:
            if n > 0 and p[n - 1] == b'\r':
                n -= 1
            if n > 0:
                out.append(PyBytes_FromStringAndSize(p, n))
        self.length = 0
        self.alen = 0
        self.hlen = 0
        self.discarding = False
        return 0

    cdef inline void _start_discarding(self, const char *line, Py_ssize_t n) noexcept:
        """The line so far (``line[0:n]``, n > max_frame) is over the limit."""
        self.discarding = True
        self.hlen = 0
        self._top_up_head(line, n)
        self.alen = 0

    cdef Py_ssize_t _scan(self, const char *p, Py_ssize_t pos, Py_ssize_t end,
                          Py_ssize_t *stop) noexcept:
        cdef Py_ssize_t k
        with nogil:
            k = shoal_scan_nl(p, pos, end, self.nlpos, _BATCH, stop)
        return k

    cdef list _feed(self, const char *p, Py_ssize_t n):
        """Bytes outside the line buffer: whole lines go straight to frames."""
        cdef list out = []
        cdef Py_ssize_t pos = 0, stop = 0, k, nfound, nl, seg
        while pos < n:
            nfound = self._scan(p, pos, n, &stop)
            for k in range(nfound):
                nl = self.nlpos[k]
                seg = nl - pos
                self._scanned += seg + 1
                self._take_external(p + pos, seg)
                if self.discarding or self.alen == 0:
                    self._finish(out, p + pos, seg)
                else:  # join the pending start of the line and this segment
                    self._grow(self.alen + seg)
                    memcpy(self.acc.data + self.alen, p + pos, seg)
                    self.alen += seg
                    self._finish(out, self.acc.data, self.alen)
                pos = nl + 1
            if stop == n and pos < n:   # newline-free tail: keep it for the next feed
                seg = n - pos
                self._scanned += seg
                self._take_external(p + pos, seg)
                if not self.discarding:
                    self._grow(self.alen + seg)
                    memcpy(self.acc.data + self.alen, p + pos, seg)
                    self.alen += seg
                pos = n
        self._release()
        return out

    cdef inline int _take_external(self, const char *p, Py_ssize_t seg) except -1:
        """Account ``seg`` more bytes of the current line (stored by the caller)."""
        self.length += seg
        if self.discarding:
            self._top_up_head(p, seg)
        elif self.length > self.maxf:
            # The line so far is acc[0:alen] + p[0:seg]: its head comes from both.
            self.discarding = True
            self.hlen = 0
            self._top_up_head(self.acc.data, self.alen)
            self._top_up_head(p, seg)
            self.alen = 0
        return 0

    cdef list _process(self, Py_ssize_t region, Py_ssize_t end):
        """``acc.data[region:end]`` was just read in place after the pending line."""
        cdef list out = []
        cdef char *p = self.acc.data
        cdef Py_ssize_t pos = region, ls = 0, stop = 0, k, nfound, nl, seg
        while True:
            nfound = self._scan(p, pos, end, &stop)
            for k in range(nfound):
                nl = self.nlpos[k]
                seg = nl - pos
                self._scanned += seg + 1
                self.length += seg
                if self.discarding:
                    self._top_up_head(p + pos, seg)
                elif self.length > self.maxf:
                    self._start_discarding(p + ls, nl - ls)
                self._finish(out, p + ls, nl - ls)
                pos = ls = nl + 1
            if stop == end:
                break
        # newline-free tail [pos, end) of the line that starts at ls
        seg = end - pos
        self._scanned += seg
        self.length += seg
        if self.discarding:
            self._top_up_head(p + pos, seg)
            self.alen = 0
        elif self.length > self.maxf:
            self._start_discarding(p + ls, end - ls)
        else:
            if ls > 0 and end > ls:
                memmove(p, p + ls, end - ls)
            self.alen = end - ls
        self._release()
        return out


cdef class _FrameIter:
    """Iterator over a FrameReader's events, one read's batch at a time."""

    cdef FrameReader reader
    cdef list batch
    cdef Py_ssize_t index

    def __iter__(self):
        return self

    def __next__(self):
        if self.index >= len(self.batch):
            self.batch = self.reader.read_frames()
            self.index = 0
            if not self.batch:
                raise StopIteration
        item = self.batch[self.index]
        self.index += 1
        return item


cdef class FrameReader:
    """Blocking reader of frames from a file descriptor (pipe or socket).

    ``read_frames()`` blocks until at least one event is ready and returns every event
    the last read completed (several small frames per syscall); ``[]`` means EOF.
    """

    cdef readonly object fd
    cdef readonly object chunk
    cdef readonly object max_frame
    cdef readonly FrameDecoder decoder
    cdef int cfd
    cdef Py_ssize_t cchunk
    cdef bint _eof

    def __init__(self, fd, max_frame=MAX_FRAME, chunk=READ_CHUNK):
        chunk = operator.index(chunk)
        if chunk < 1:
            raise ValueError("chunk must be positive")
        self.fd = operator.index(fd)
        self.cfd = self.fd
        self.chunk = chunk
        self.cchunk = chunk
        self.decoder = FrameDecoder(max_frame)
        self.decoder.reserve = self.cchunk
        self.max_frame = self.decoder.max_frame

    @property
    def scanned(self):
        return self.decoder._scanned

    def read_frames(self):
        cdef FrameDecoder d = self.decoder
        cdef Py_ssize_t got
        cdef int err = 0
        cdef char *target
        cdef list events = None
        while not self._eof:
            d._enter()
            try:
                d._grow(d.alen + self.cchunk)
                target = d.acc.data + d.alen
                with nogil:
                    got = read(self.cfd, target, <size_t>self.cchunk)
                    if got < 0:
                        err = errno
                if got > 0:
                    events = d._process(d.alen, d.alen + got)
            finally:
                d.busy = False
            if got < 0:
                if err == EINTR:
                    PyErr_CheckSignals()
                    continue
                raise _os_error(err)
            if got == 0:
                self._eof = True
                return d.eof()
            if events:
                return events
        return []

    def __iter__(self):
        cdef _FrameIter it = _FrameIter.__new__(_FrameIter)
        it.reader = self
        it.batch = []
        it.index = 0
        return it


# --- writer ---------------------------------------------------------------------------


cdef int _write_all(int fd, const char *p, Py_ssize_t n) except -1:
    cdef Py_ssize_t off = 0, w = 0
    cdef int err = 0
    while off < n:
        with nogil:
            while off < n:
                w = write(fd, p + off, <size_t>(n - off))
                if w < 0:
                    err = errno
                    break
                off += w
        if off < n:
            if err == EINTR:
                PyErr_CheckSignals()
                continue
            raise _os_error(err)
    return 0


def write_all(fd, data):
    """Write every byte of ``data`` to ``fd`` (retrying short writes)."""
    cdef int cfd = operator.index(fd)
    cdef Py_buffer view
    _get_buffer(data, &view)
    try:
        _write_all(cfd, <const char *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


cdef class FrameWriter:
    """Writes whole frames to an fd; one lock so threads never interleave bytes."""

    cdef readonly object fd
    cdef readonly object max_frame
    cdef object _lock
    cdef int cfd

    def __init__(self, fd, max_frame=MAX_FRAME):
        self.fd = operator.index(fd)
        self.cfd = self.fd
        self.max_frame = operator.index(max_frame)
        self._lock = threading.Lock()

    def write_frame(self, frame):
        """Write one already-encoded frame: exactly one line ending with ``\\n``.

        Over ``max_frame`` (newline excluded) → FrameTooLarge; a missing final newline
        or a newline inside the frame → ValueError (it would corrupt the framing of
        every later frame). Nothing is written in either case.
        """
        cdef Py_buffer view
        cdef const char *p
        cdef Py_ssize_t size
        cdef const void *inner
        _get_buffer(frame, &view)
        try:
            p = <const char *>view.buf
            size = view.len - 1
            if size > self.max_frame:
                raise FrameTooLarge(f"frame of {size} bytes exceeds {self.max_frame}")
            if size < 0 or p[size] != b'\n':
                raise ValueError("a frame must end with a newline")
            if size >= _NOGIL_MIN:
                with nogil:
                    inner = memchr(p, b'\n', <size_t>size)
            else:
                inner = memchr(p, b'\n', <size_t>size)
            if inner != NULL:
                raise ValueError("a frame must not contain a newline before its end")
            with self._lock:
                _write_all(self.cfd, p, view.len)
        finally:
            PyBuffer_Release(&view)


# --- truncation -----------------------------------------------------------------------


cdef inline Py_ssize_t _count_nl(const char *p, Py_ssize_t n) noexcept:
    cdef Py_ssize_t c
    if n >= _NOGIL_MIN:
        with nogil:
            c = shoal_count_nl(p, n)
        return c
    return shoal_count_nl(p, n)


def count_lines(buf):
    """Number of lines in ``buf`` (a final line without ``\\n`` counts)."""
    cdef Py_buffer view
    cdef const char *p
    cdef Py_ssize_t n, c
    _get_buffer(buf, &view)
    try:
        p = <const char *>view.buf
        n = view.len
        if n == 0:
            return 0
        c = _count_nl(p, n)
        return c + (0 if p[n - 1] == b'\n' else 1)
    finally:
        PyBuffer_Release(&view)


cdef inline int _check_needle(const char *q, Py_ssize_t m) except -1:
    """A needle is non-empty and holds no ``\\n`` (the search is per line)."""
    if m == 0 or memchr(q, b'\n', <size_t>m) != NULL:
        raise ValueError(_NEEDLE_ERROR)
    return 0


def count_lines_with(buf, needle, start=0, end=None):
    """Lines of ``buf[start:end]`` holding ``needle``: ``grep -c -F`` over a buffer.

    Lines are the ``\\n``-separated pieces of the range (a last piece without ``\\n``
    counts); ``start``/``end`` follow slice rules. ``needle`` is a non-empty byte string
    without ``\\n`` (ValueError otherwise). The scan is memmem to a hit, then memchr to
    the end of its line, without the GIL.
    """
    cdef Py_buffer view, nview
    cdef Py_ssize_t s, e, m, c
    cdef const char *p
    cdef const char *q
    _get_buffer(needle, &nview)
    try:
        m = nview.len
        q = <const char *>nview.buf
        _check_needle(q, m)
        _get_buffer(buf, &view)
        try:
            s, e, _ = slice(start, end).indices(view.len)
            p = <const char *>view.buf
            if e - s < m:
                return 0
            if e - s >= _NOGIL_MIN:
                with nogil:
                    c = shoal_count_lines_with(p + s, e - s, q, m)
                return c
            return shoal_count_lines_with(p + s, e - s, q, m)
        finally:
            PyBuffer_Release(&view)
    finally:
        PyBuffer_Release(&nview)


def lines_with(buf, needle, start=0, end=None):
    """The lines of ``buf[start:end]`` holding ``needle``, concatenated (``grep -F``).

    Same lines, ranges and needle rules as ``count_lines_with``; each line keeps its
    ``\\n`` (a last piece without one stays without). Scanned without the GIL.
    """
    cdef Py_buffer view, nview
    cdef Py_ssize_t s, e, m, k, i, total, cap = 0
    cdef Py_ssize_t *spans = NULL
    cdef const char *p
    cdef const char *q
    cdef char *out
    _get_buffer(needle, &nview)
    try:
        m = nview.len
        q = <const char *>nview.buf
        _check_needle(q, m)
        _get_buffer(buf, &view)
        try:
            s, e, _ = slice(start, end).indices(view.len)
            p = <const char *>view.buf + s
            if e - s < m:
                return b""
            with nogil:
                k = shoal_lines_with(p, e - s, q, m, &spans, &cap)
            if k < 0:
                raise MemoryError()
            total = 0
            for i in range(k):
                total += spans[2 * i + 1] - spans[2 * i]
            result = PyBytes_FromStringAndSize(NULL, total)
            out = PyBytes_AS_STRING(result)
            with nogil:
                for i in range(k):
                    memcpy(out, p + spans[2 * i], <size_t>(spans[2 * i + 1] - spans[2 * i]))
                    out += spans[2 * i + 1] - spans[2 * i]
            return result
        finally:
            free(spans)
            PyBuffer_Release(&view)
    finally:
        PyBuffer_Release(&nview)


def _marker(cut, lines, nbytes, uri):
    cut_clause = _CUT_CLAUSE if cut else ""
    uri_clause = f", fetch via {uri}" if uri else ""
    return f"\u2026({cut_clause}{lines} more lines, {nbytes} more bytes{uri_clause})"


cdef inline Py_ssize_t _mlen(Py_ssize_t base, bint cut, Py_ssize_t lines,
                             Py_ssize_t nbytes) noexcept:
    return base + shoal_ndigits(lines) + shoal_ndigits(nbytes) + (16 if cut else 0)


def bound_text(text, limit=TEXT_LIMIT, uri=None):
    """Bound ``text`` to ``limit`` UTF-8 bytes, marker included (docs/protocol.md, Framing).

    Within the limit the text comes back unchanged (the same object). Otherwise the
    result is the longest run of whole leading lines whose bytes plus the exact marker
    that follows them fit in ``limit``; when not even the first line fits, the longest
    prefix of it that fits, cut at a code point boundary (marker says
    ``first line cut``). The result never exceeds ``limit`` once ``limit`` is at least
    the size of the marker itself. Lone surrogates round-trip (``surrogatepass``).
    """
    cdef const char *p
    cdef Py_ssize_t n = 0, lim, nchars
    cdef Py_ssize_t total, base, safe, top, lo, head_len, before, nl, e, h, floor_
    cdef Py_ssize_t lines_left, first_nl
    cdef const void *q
    cdef bint cut
    cdef object keep
    if not isinstance(text, str):
        raise TypeError(f"bound_text() needs a str, not {type(text).__name__}")
    limit = operator.index(limit)
    if limit < 0:
        raise ValueError("limit must be >= 0")
    # Cheap exit without encoding: at most 2/3/4 UTF-8 bytes per 1/2/4-byte code unit.
    nchars = len(<str>text)
    if nchars <= limit // 4:
        return text
    try:
        p = PyUnicode_AsUTF8AndSize(text, &n)  # zero-copy for ASCII, cached otherwise
    except UnicodeEncodeError:  # lone surrogates
        keep = (<str>text).encode("utf-8", "surrogatepass")
        p = PyBytes_AS_STRING(keep)
        n = len(keep)
    if n <= limit:
        return text
    lim = limit  # < n, so it fits
    total = _count_nl(p, n) + (0 if p[n - 1] == b'\n' else 1)
    base = len(_marker(False, 0, 0, uri).encode("utf-8", "surrogatepass")) - 2

    safe = lim - _mlen(base, False, total, n)
    top = lim - _mlen(base, False, 1, n - lim)
    lo = safe if safe > 0 else 0
    head_len = 0
    if top > lo:
        before = shoal_count_nl(p, lo)
        nl = shoal_rfind_nl(p, lo, top)
        while nl >= 0:
            e = nl + 1
            if e + _mlen(base, False, total - before - shoal_count_nl(p + lo, e - lo),
                         n - e) <= lim:
                head_len = e
                break
            nl = shoal_rfind_nl(p, lo, nl)
    if head_len == 0 and safe > 0:
        head_len = shoal_rfind_nl(p, 0, safe) + 1
    if head_len > 0:
        cut = False
        lines_left = total - shoal_count_nl(p, head_len)
    else:
        cut = True
        lines_left = total
        h = lim - _mlen(base, True, total, n - lim)
        floor_ = lim - _mlen(base, True, total, n)
        while h > floor_ and h + _mlen(base, True, total, n - h) > lim:
            h -= 1
        q = memchr(p, b'\n', <size_t>n)
        if q != NULL:
            first_nl = <const char *>q - p
            if h > first_nl:
                h = first_nl
        if h < 0:
            h = 0
        while h > 0 and (<unsigned char>p[h] & 0xC0) == 0x80:
            h -= 1
        head_len = h
    head = PyUnicode_DecodeUTF8(<char *>p, head_len, b"surrogatepass")
    return head + _marker(cut, lines_left, n - head_len, uri)


# --- raw slicing ----------------------------------------------------------------------


def b64_slice(buf, start, end):
    """Base64 of ``buf[start:end]`` (non-negative, clamped), touching only that range."""
    cdef Py_buffer view
    cdef Py_ssize_t n, s, e, m
    cdef const unsigned char *src
    cdef unsigned char *dst
    _get_buffer(buf, &view)
    try:
        n = view.len
        s = _clamp_index(start, 0, n)
        e = _clamp_index(end, s, n)
        m = e - s
        out = PyUnicode_New(4 * ((m + 2) // 3), 127)
        if m == 0:
            return out
        dst = PyUnicode_1BYTE_DATA(out)
        src = <const unsigned char *>view.buf + s
        if m >= _NOGIL_MIN:
            with nogil:
                shoal_b64(src, m, dst)
        else:
            shoal_b64(src, m, dst)
        return out
    finally:
        PyBuffer_Release(&view)


cdef Py_ssize_t _utf8_offset(const unsigned char *p, Py_ssize_t n, Py_ssize_t pos,
                             Py_ssize_t remaining) noexcept:
    cdef Py_ssize_t r
    if n - pos >= _NOGIL_MIN and remaining >= 256:
        with nogil:
            r = shoal_utf8_offset(p, n, pos, remaining)
        return r
    return shoal_utf8_offset(p, n, pos, remaining)


def utf8_offset(buf, char_index, from_byte=0):
    """Byte offset of code point ``char_index`` counted from ``from_byte`` (clamped).

    A code point starts at every byte that is not a continuation byte (10xxxxxx), so
    invalid input still has a well-defined answer. Past the end → ``len(buf)``.
    """
    cdef Py_buffer view
    cdef Py_ssize_t n, ci, fb
    _get_buffer(buf, &view)
    try:
        n = view.len
        ci = _clamp_index(char_index, 0, n)
        fb = _clamp_index(from_byte, 0, n)
        return _utf8_offset(<const unsigned char *>view.buf, n, fb, ci)
    finally:
        PyBuffer_Release(&view)


def utf8_slice(buf, char_start, char_end):
    """Text of code points ``[char_start, char_end)`` of UTF-8 ``buf`` (clamped).

    Scans from the start only as far as ``char_end``; invalid bytes decode as U+FFFD.
    """
    cdef Py_buffer view
    cdef Py_ssize_t n, cs, ce, begin, finish
    cdef const unsigned char *p
    _get_buffer(buf, &view)
    try:
        n = view.len
        p = <const unsigned char *>view.buf
        cs = _clamp_index(char_start, 0, n)
        ce = _clamp_index(char_end, cs, n)
        begin = _utf8_offset(p, n, 0, cs)
        finish = _utf8_offset(p, n, begin, ce - cs)
        return PyUnicode_DecodeUTF8(<char *>p + begin, finish - begin, b"replace")
    finally:
        PyBuffer_Release(&view)


cdef Py_ssize_t _line_start(const char *p, Py_ssize_t n, Py_ssize_t index) noexcept:
    cdef Py_ssize_t r
    if index == 0:
        return 0
    if n >= _NOGIL_MIN:
        with nogil:
            if index > 0:
                r = shoal_line_start_fwd(p, n, index)
            else:
                r = shoal_line_start_back(p, n, -index)
        return r
    if index > 0:
        return shoal_line_start_fwd(p, n, index)
    return shoal_line_start_back(p, n, -index)


def line_offsets(buf, first, last):
    """Byte span ``(start, end)`` of lines ``[first:last]`` with Python slice rules.

    ``first``/``last`` may be negative (counted from the end) or None (from the start /
    to the end). Only the needed part of ``buf`` is scanned: from the start for
    non-negative indexes, from the end for negative ones. ``end`` includes the final
    line's ``\\n`` when it has one. An empty selection gives ``start == end``.
    """
    cdef Py_buffer view
    cdef Py_ssize_t n, f, la, start, end_
    cdef const char *p
    _get_buffer(buf, &view)
    try:
        n = view.len
        p = <const char *>view.buf
        # No buffer has more lines than bytes: clamp so huge indexes cost nothing.
        f = 0 if first is None else _clamp_index(first, -(n + 1), n + 1)
        start = _line_start(p, n, f)
        if last is None:
            end_ = n
        else:
            la = _clamp_index(last, -(n + 1), n + 1)
            end_ = _line_start(p, n, la)
        if end_ < start:
            end_ = start
        return (start, end_)
    finally:
        PyBuffer_Release(&view)


# Shared types come from the twin so both backends return the same classes. Imported
# last: importing the twin imports shoal_mcp.protocol.framing, which imports this module.
from shoal_mcp.protocol.framing._pure import FrameTooLarge, Oversize  # noqa: E402
