"""Every limit and default of shoal, in one place (error codes: ``errors``).

docs/protocol.md, Limits lists those users meet; handlers import from here and never
spell a number themselves.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# --- framing (docs/protocol.md, Framing) -------------------------------------------
MAX_FRAME = 16 * MiB
"""Largest completed frame on either wire protocol, enforced while accumulating."""
READ_CHUNK = 256 * KiB
"""Bytes asked of the OS per read; peak reader memory is MAX_FRAME + READ_CHUNK."""
OVERSIZE_HEAD = 4 * KiB
"""How much of an oversize frame is kept so callers can recover its id."""
MAX_OVERSIZE_PER_CONNECTION = 3
"""The kernel may close a connection after this many oversize frames."""

# --- text bounds (docs/protocol.md, Framing and Limits) ----------------------------
TEXT_LIMIT = 64 * KiB
"""MCP text per result / resource, marker included."""
VALUE_HARD_CAP = 64 * KiB
"""No encoded value ever exceeds this, whatever the caller asks for."""

# --- elision defaults (docs/protocol.md, Limits) -----------------------------------
ELIDE_MAX_BYTES = 8 * KiB
ELIDE_MAX_ITEMS = 500
ELIDE_MAX_ROWS = 100
ELIDE_MAX_BYTES_RAW = 4 * KiB
ELIDE_PREVIEW_ITEMS = 5
ELIDE_PREVIEW_CHARS = 256
ELIDE_RENDER_HEAD = 10
STDERR_TAIL_BYTES = 2 * KiB
"""Bounded stderr tail carried by a -32002 raised error and a failed render."""
JSON_SELECTOR_MAX = 16 * MiB
"""`.json` parses at most this many bytes of a blob."""

# --- events (docs/protocol.md, Events) ---------------------------------------------
EVENT_RING = 1024
SUBSCRIBER_QUEUE = 256
DURABLE_CHANNELS = ("journal", "session.transcript")

# --- processes ---------------------------------------------------------------------
CANCEL_GRACE_S = 2.0
"""SIGTERM → SIGKILL grace for task.cancel and kernel shutdown."""
SHUTDOWN_DRAIN_S = 10.0
"""Kernel exit: how long to wait for killed tasks' results and running calls to be
stored before the databases close (each phase)."""
TASK_OUTPUT_EVENT_INTERVAL_S = 0.5
"""Throttle for `output` events on task.N channels."""
PROGRESS_INTERVAL_S = 1.0
"""MCP progress notifications: at most one per second."""
AUTOSTART_TIMEOUT_S = 5.0

# --- PTYs (docs/protocol.md, PTYs) -------------------------------------------------
PTY_MIN_DIM = 1
PTY_MAX_DIM = 1000
PTY_DEFAULT_COLS = 80
PTY_DEFAULT_ROWS = 24
PTY_SCROLLBACK_LINES = 1000
PTY_EVENT_INTERVAL_S = 0.2
PTY_TERM = "xterm-256color"
"""TERM given to every PTY program."""
PTY_READ_CHUNK = 32 * KiB
"""Bytes read from the master per wake-up (bounds how long one feed holds the screen lock)."""
PTY_MAX_CELL_CHARS = 8
"""Code points kept per screen cell (base + combining marks)."""
PTY_MAX_READERS = 64
"""Readers remembered per PTY for `changed`."""
PTY_WINDOW_MIN_ROWS = 24
"""Fewer rows than this in a row window -> window the columns too."""
PTY_SEND_TIMEOUT_S = 5.0
"""How long `pty.send` waits for a program that does not read its input."""
PTY_IDLE_POLL_S = 0.25
"""Reader thread wake-up period (child-exit check while the terminal is still held)."""
PTY_MAX_CMD_LEN = 4096
"""Longest `cmd` accepted by `pty.open`, in characters."""
PTY_SPAWN_TIMEOUT_S = 10.0
"""Longest wait for the spawn trampoline to exec the program."""

# --- params bounds (``params``; docs/protocol.md) ------------------------------------
SRC_MAX_CHARS = 1 * MiB
"""Longest bash source `exec`, `explain` and `parse` accept."""
REF_MAX_CHARS = 4096
"""Longest ref or shoal:// URI `value.get` accepts."""
PATH_MAX_CHARS = 1024
"""Longest selector path."""
WAIT_MAX_MS = 24 * 3600 * 1000
"""Longest wait budget (`exec` timeout_ms, `task.await`)."""
JOURNAL_MAX_ROWS = 1000
"""Most rows one `journal.query` returns."""
PTY_MAX_ARGS = 1024
PTY_MAX_INPUT_ITEMS = 4096
"""Most items in one `pty.send` input array."""

# --- sessions / ids ----------------------------------------------------------------
DEFAULT_SESSION = "default"
PLAN_REF_HEX = 32

# --- protocol versions (docs/protocol.md, MCP surface) -----------------------------
MCP_PROTOCOL_VERSION = "2025-06-18"
MCP_SUPPORTED_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")

# --- budgets (docs/configuration.md, Budgets; docs/security.md, Budgets) ----------
# Each per-principal budget is a policy key of the same name (``max_…``); the first value
# is a token principal's default, the ``_LOCAL`` one the local human's. Hitting a budget
# answers -32031 naming the key (except the ring, which drops its oldest events).
CHANNEL_BYTES = 4 * MiB
"""``max_channel_bytes``: encoded payload bytes one channel's ring keeps (oldest dropped)."""
CHANNELS = 8
CHANNELS_LOCAL = 64
"""``max_channels``: ``user.*`` channels a principal has created that the kernel holds."""
PLANS = 64
PLANS_LOCAL = 1024
"""``max_plans``: plans a principal has stored (applied ones are dropped first)."""
PLAN_BYTES = 16 * MiB
PLAN_BYTES_LOCAL = 256 * MiB
"""``max_plan_bytes``: total source bytes of a principal's stored plans."""
CONNECTIONS = 16
CONNECTIONS_LOCAL = 128
"""``max_connections``: attached connections per principal."""
EVENT_BYTES = 256 * MiB
"""``[kernel] max_event_bytes``: encoded bytes all event rings keep together (past it the
least recently used rings without subscribers are evicted)."""
KERNEL_CONNECTIONS = 256
"""``[kernel] max_connections``: open connections (one thread each) of the whole kernel."""
STATE_BYTES = 32 * 1024 * MiB
"""``[kernel] max_state_bytes``: size of the state dir past which new execs and plans are
refused (-32031) until ``shoal gc`` frees room."""
MIN_FREE_BYTES = 256 * MiB
MIN_FREE_FRACTION = 0.01
"""``[kernel] min_free_bytes``: free space on the state dir's filesystem below which new
execs and plans are refused too (a clear error before the disk is full). Unset, it is
``MIN_FREE_FRACTION`` of that filesystem's size, at most ``MIN_FREE_BYTES``."""
FRAME_BEFORE_ATTACH = 64 * KiB
"""Largest frame accepted before ``session.attach`` (SPEC §6)."""
ATTACH_TIMEOUT_S = 30.0
"""A connection that has not attached after this long is closed."""
MAX_BLOCKING_CALLS = 64
"""Blocking calls (exec, task.await, …: one thread each) one connection runs at once."""
LIST_REPLY_BYTES = 4 * MiB
"""Encoded rows one list reply (journal.query, plan.list, task.list, events.read) carries
before it stops with ``more`` and a ``cursor`` (at least one row always goes out)."""
SRC_INLINE_CHARS = 4 * KiB
"""A journal source longer than this is stored once in the CAS by hash; the row keeps a
head of this many characters for display."""

# --- allocator (kernel/rpc/malloc.py) ----------------------------------------------
MALLOC_ARENAS = 2
"""glibc arenas the kernel's threads share (the default is 8 per core)."""
MALLOC_TRIM_INTERVAL_S = 5.0
"""How often the kernel returns free heap pages to the OS (glibc ``malloc_trim``)."""
MALLOC_MMAP_THRESHOLD = 32 * KiB
"""Allocations from this size get their own mapping, returned to the OS when freed (so
a ring's 64 KiB payloads never pin a heap region)."""
