"""glibc allocator settings that keep the kernel's resident memory near what it uses.

The kernel handles many short-lived large buffers (64 KiB payloads, 1 MiB sources,
4 MiB list replies) on many threads. With glibc's defaults each thread may get its own
arena and the mmap threshold rises after every large free, so freed buffers stay
resident as fragments, and long-lived 64 KiB ring payloads pin heap regions between
them: a 150 s soak (bench/test_bench_soak.py) ended 317 MiB above its start, against
75 MiB with a 32 KiB mmap threshold, 2 arenas and a periodic trim. Elsewhere (musl,
macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

from ..config.limits import MALLOC_ARENAS, MALLOC_MMAP_THRESHOLD

log = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # glibc malloc.h; setting it also stops the dynamic threshold
_M_ARENA_MAX = -8


def tune_malloc() -> Callable[[], None] | None:
    """Cap glibc's arenas and pin its mmap threshold; the call that hands free heap
    pages back (the server's ticker runs it every ``MALLOC_TRIM_INTERVAL_S``), or None
    where that is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_ARENA_MAX, MALLOC_ARENAS)) and bool(
        mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
    )
    if not ok:
        log.warning("mallopt refused the allocator settings")
    malloc_trim.argtypes = (ctypes.c_size_t,)
    # Free chunks inside the arenas (between live ones) stay resident until trimmed.
    return lambda: malloc_trim(0)
