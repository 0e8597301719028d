"""The limits and defaults the wire, the facade, the CLI and the client share (error
codes: ``errors``).

docs/protocol.md, Limits lists those users meet; handlers import from here and never
spell a number themselves. What only the kernel uses is in ``kernel/config/limits.py``.
"""

from __future__ import annotations

import os

KiB = 1024
MiB = 1024 * KiB

# --- framing (docs/protocol.md, Framing) -------------------------------------------
MAX_FRAME = 16 * MiB
"""Largest completed frame on either wire protocol, enforced while accumulating."""
READ_CHUNK = 256 * KiB
"""Bytes asked of the OS per read; peak reader memory is MAX_FRAME + READ_CHUNK."""
OVERSIZE_HEAD = 4 * KiB
"""How much of an oversize frame is kept so callers can recover its id."""
JSON_MAX_DEPTH = 1024
"""Deepest nesting a message may have (orjson's own limit); deeper is -32600 to its id."""

# --- text bounds (docs/protocol.md, Framing and Limits) ----------------------------
TEXT_LIMIT = 64 * KiB
"""MCP text per result / resource, marker included."""
VALUE_HARD_CAP = 64 * KiB
"""No encoded value ever exceeds this, whatever the caller asks for."""


# --- match: regex search over stored output (docs/protocol.md, Search) ---------------
MATCH_MAX_RESULTS = 1000
"""Most matching lines one reply may ask for (the 64 KiB value bound cuts earlier)."""
MATCH_MAX_CONTEXT = 20
"""Most context lines before/after each match."""
MATCH_REGEX_MAX_CHARS = 1024
"""Longest regex `match` accepts."""

# --- find across runs: match over every stored output (docs/protocol.md, Find) ------
FIND_CURSOR_MAX_CHARS = 400
"""Longest cursor a search across runs hands out (a session name is up to 128)."""
FIND_ALL_SESSIONS = "all"
"""`session` value of a search across runs that spans every session."""

# --- events (docs/protocol.md, Events) ---------------------------------------------
EVENT_RING = 1024

# --- progress and autostart (facade, client) ----------------------------------------
PROGRESS_INTERVAL_S = 1.0
"""MCP progress notifications: at most one per second, each only after the kernel answered a
liveness probe (``task.get``) within this long: a stopped kernel sends no progress."""
AUTOSTART_TIMEOUT_S = 5.0

# --- client timeouts (docs/configuration.md, "Timeouts") -----------------------------
CONNECT_TIMEOUT_S = 5.0
"""Longest wait for the kernel's socket to accept a connection."""
ATTACH_TIMEOUT_S = 30.0
"""Longest wait for ``session.attach`` to be answered."""
CALL_TIMEOUT_S = 60.0
"""Default for a call that is quick by nature (everything but waits and runs)."""
CALL_BUDGET_GRACE_S = 15.0
"""Added to a caller's own budget (``timeout_ms``) before the client gives up."""
LIVENESS_INTERVAL_S = 5.0
"""A call unanswered this long makes the client ping the kernel on the same link (the
facade's call link pings this often while any call is in flight)."""
LIVENESS_TIMEOUT_S = 15.0
"""A ping unanswered this long means the kernel is stalled (stopped, wedged): the CLI, the
facade and every other client use this one bound (``liveness_bounds``)."""
LIVENESS_ENV = "SHOAL_LIVENESS_S"
"""Overrides the two bounds above as ``INTERVAL,TIMEOUT`` seconds (tests: a stall is then
named in a second, not 20)."""


def liveness_bounds() -> tuple[float, float]:
    """(ping after, stalled after) in seconds: ``SHOAL_LIVENESS_S`` if set and valid,
    else ``LIVENESS_INTERVAL_S``, ``LIVENESS_TIMEOUT_S``."""
    raw = os.environ.get(LIVENESS_ENV, "")
    try:
        interval, timeout = (float(part) for part in raw.split(","))
    except ValueError:
        return LIVENESS_INTERVAL_S, LIVENESS_TIMEOUT_S
    if not (0 < interval < 3600 and 0 < timeout < 3600):
        return LIVENESS_INTERVAL_S, LIVENESS_TIMEOUT_S
    return interval, timeout


# --- remote hosts over ssh (docs/configuration.md, "Remote hosts") ---------------------
SSH_CONNECT_TIMEOUT_S = 10
"""ssh's ``ConnectTimeout`` for a remote link (whole seconds, as ssh takes it)."""
SSH_EXIT_WAIT_S = 2.0
"""After a remote link's pipes close, how long to wait for ssh to exit so the error can
quote its status and last stderr lines."""
SSH_STDERR_LINES = 5
"""How many of ssh's last stderr lines a remote link error quotes."""
REMOTE_RECONNECT_BACKOFF_S = (0.5, 30.0)
"""A failed remote (re)connect waits this long before the next try, doubling from the
first value up to the second; calls in between fail at once with the last error."""


STATUS_PROBE_TIMEOUT_S = 5.0
"""How long ``shoal kernel status`` and ``shoal doctor`` wait for a ping."""
KERNEL_STOP_TIMEOUT_S = 10.0
"""``shoal kernel stop``: SIGTERM, then SIGKILL by pid after this long."""

# --- cleanup (docs/configuration.md, "Cleanup") ------------------------------------
GC_DEFAULT_MAX_AGE_S = 30 * 24 * 3600
"""`shoal gc` with neither --older-than nor --max-size: outputs older than 30 days."""

# --- PTYs (docs/protocol.md, PTYs) -------------------------------------------------
PTY_MIN_DIM = 1
PTY_MAX_DIM = 1000
PTY_DEFAULT_COLS = 80
PTY_DEFAULT_ROWS = 24
PTY_SCROLLBACK_LINES = 1000

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
AGENT_PRINCIPAL = "agent:mcp"
"""The sandboxed agent an MCP client attaches as without a token (docs/security.md,
"The default agent"): a downgrade any client may ask for, so it needs no secret."""

# --- MCP facade lists, logging, input (docs/protocol.md, MCP surface) -------------------
MCP_LIST_PAGE = 50
"""Entries per page of resources/list, tools/list, templates/list, tasks/list."""
MCP_LIST_RECENT_TASKS = 20
"""resources/list shows running tasks and at most this many finished ones, newest first."""
MCP_LIST_PENDING_PLANS = 20
"""resources/list shows at most this many plans awaiting apply/approval, newest first."""
MCP_INPUT_QUEUE = 256
"""Messages read from stdin and not yet being served; beyond this the reader stops reading
(backpressure on the client's pipe) instead of growing the facade's memory."""
MCP_TASK_TTL_MS = 3_600_000
"""2025-11-25 tasks: kept this long after creation (a client may ask for less, not more)."""
MCP_TASK_POLL_MS = 1000
"""2025-11-25 tasks: the pollInterval suggested to clients."""
MCP_TASKS_KEPT = 256
"""2025-11-25 tasks remembered per facade (oldest finished ones are forgotten first)."""
MCP_TASK_AWAIT_SLICE_MS = 60_000
"""One kernel ``task.await`` of a task watcher (it loops, so a lost kernel is noticed)."""
MCP_TASK_RESULT_POLL_S = 0.25
"""How often a waiting ``tasks/result`` checks whether it was cancelled."""
MCP_EARLY_LOG_LINES = 16
"""Log lines kept from before ``initialize`` was answered (the background connect's)."""
CANCEL_RETRY_S = 0.02
"""A facade cancel that reached the kernel before its exec was registered asks again after
this (until the exec is known, has answered, or the cancel's timeout passes)."""

# --- protocol versions (docs/protocol.md, MCP surface) -----------------------------
MCP_PROTOCOL_VERSION = "2025-11-25"
"""Our latest handshake revision: answered to an ``initialize`` asking for one we do not speak."""
MCP_SUPPORTED_VERSIONS = ("2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""Every MCP revision shoal speaks, newest first (2026-07-28 per request, the rest by handshake)."""
MCP_STATIC_TTL_MS = 3_600_000
"""2026-07-28 ``ttlMs`` of what is fixed for a facade's life (tools, templates, discover)."""
MCP_APPROVAL_ANSWER_S = 600.0
"""2025-06-18/11-25: how long an ``elicitation/create`` for an approval waits for the human."""
