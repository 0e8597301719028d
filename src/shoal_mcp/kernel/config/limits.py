"""The kernel's limits, defaults and tuning knobs, in one place (no client reads them).

What the wire, the facade, the CLI and the client share stays in ``protocol/limits.py``;
docs/protocol.md, Limits lists the numbers users meet. Kernel code imports from here and
never spells a number itself.
"""

from __future__ import annotations

from ...protocol.limits import KiB, MiB

# --- connections (docs/protocol.md, Framing) ---------------------------------------
MAX_OVERSIZE_PER_CONNECTION = 3
"""The kernel may close a connection after this many oversize frames."""

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
STDERR_DENIALS_BYTES = 16 * KiB
"""The end of a failed sandboxed exec's stderr read for what the sandbox refused."""
SANDBOX_DENIED_MAX = 32
"""Most ``sandbox_denied`` entries one reply lists."""
JSON_SELECTOR_MAX = 16 * MiB
"""`.json` parses at most this many bytes of a blob (-32005 naming the limit past it)."""
JSON_SHAPE_DEADLINE_S = 0.5
"""A render's JSON shape of a document over ``JSON_WHOLE_PARSE_MAX`` is streamed for at
most this long (about 2 MiB of small records); past it the render has no shape."""
JSON_WHOLE_PARSE_MAX = 1 * MiB
"""A `.json` document up to this size is parsed whole when a path ends at it (or its
shape is drawn); a larger one becomes a bounded skeleton (kernel/values/jsonstream.py)."""
JSON_PARSE_SLOTS = 1
"""`.json` parses running at once in one kernel (a parse holds its input and the parsed
objects, several times the input); others wait for a slot."""
JSON_PARSE_WAIT_S = 30.0
"""How long a `.json` selection waits for a parse slot before -32031."""
JSON_SHAPE_MAX_INPUT = JSON_SELECTOR_MAX
"""Outputs up to this size get a JSON shape preview in their render."""
JSON_SHAPE_BYTES = 1536
"""Most bytes of a render spent on the JSON shape."""
JSON_SHAPE_BODY_BYTES = 2 * KiB
"""Bytes of raw text shown above a JSON shape (the shape tells more than a long head)."""
JSON_SHAPE_KEYS = 20
"""Keys listed per object in a JSON shape."""

# --- paging (docs/protocol.md, Paging) -------------------------------------------
PAGE_RESERVE = 1 * KiB
"""Room in a 64 KiB page for its next-call marker and the MCP footer."""
PAGE_RAW_BYTES = 48 * KiB
"""Raw page size the paging hints ask for (the most that encodes under the cap)."""

# --- match: regex search over stored output (docs/protocol.md, Search) ---------------
MATCH_DEFAULT_MAX = 50
"""Matching lines one `match` reply returns unless the caller asks for more."""
MATCH_BLOCK = 4 * MiB
"""Bytes read (pread) per step of a search; the deadline is checked between steps."""
MATCH_LINE_MAX = 1 * MiB
"""A line longer than this is searched in its first MATCH_LINE_MAX bytes only."""
MATCH_TEXT_MAX = 512
"""Bytes of a matching (or context) line shown in a reply; longer lines are cut."""
MATCH_DEADLINE_S = 5.0
"""Wall time one search may take, plus a second per MATCH_DEADLINE_BYTES_PER_S searched;
a regex running past it is stopped (-32005)."""
MATCH_DEADLINE_BYTES_PER_S = 64 * MiB
"""The slowest scan rate the deadline allows for (big outputs get more time)."""

# --- find across runs: match over every stored output (docs/protocol.md, Find) ------
FIND_BUDGET_S = 2.0
"""Wall time one search across stored outputs spends before it answers with a cursor
(checked between outputs; one output is searched whole, under the match deadline)."""
FIND_ROWS_BATCH = 256
"""Stored outputs read from SQLite per query of a search (keyset pages, no long lease)."""
FIND_LINE_SHOWN = 160
"""Bytes of a hit's line (or context line) a search across runs shows, around the match;
the whole line is one `path .out.lines[k]` read away."""
FIND_CMD_HEAD_CHARS = 48
"""Characters of a run's command shown beside its hits."""

# --- events (docs/protocol.md, Events) ---------------------------------------------
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
KERNEL_IDLE_WORKERS = 8
"""Kernel threads kept idle for the next connection or blocking call (starting a thread
costs a hand-off on the critical path; an idle one is woken instead)."""
KERNEL_WORKER_IDLE_S = 5.0
"""An idle kernel worker thread exits after this long without work."""
SPOOLS_KEPT = 16
"""Empty exec spool files kept for reuse per spool dir (exec/runner.py ``SpoolBin``): a
spool whose blob was already stored is truncated and reused instead of deleted."""
OUTPUTS_EAGER_COPY_MAX = 1 * MiB
"""An exec's start on a root kernel that must copy ``$SHOAL_OUT`` entries (no reflinks)
copies outputs up to this size itself; larger ones are copied by the background sync,
and their entries appear when it is done (values/outputs.py)."""
OUTPUTS_START_WAIT_S = 0.05
"""How long an exec's start waits for a background ``$SHOAL_OUT`` sync of its session on
a root kernel before it goes on without the entries still being made."""
SPARE_DIRS_STOCK = 64
"""Empty directories kept made for ``$SHOAL_OUT`` entries, each asked of the exec
supervisor that starts a session's next ready shell (values/spare_dirs.py)."""
HOUSEKEEPER_IDLE_S = 5.0
"""The store's housekeeping thread (store/housekeeper.py: background ``$SHOAL_OUT`` syncs,
deferred journal rows, ref numbers reserved ahead) exits after this long idle."""
HOUSEKEEPER_EXIT_WAIT_S = 5.0
"""At kernel exit, how long the chores already given may still run before the database
closes under them."""

# --- cleanup (docs/configuration.md, "Cleanup") ------------------------------------
GC_ORPHAN_GRACE_S = 600.0
"""A blob no value references is removed only once it is this old (it may be one an
exec is finalizing right now)."""
GC_SAMPLE_REFS = 20
"""How many of the pruned refs a gc report names."""

# --- PTYs (docs/protocol.md, PTYs) -------------------------------------------------
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
PTY_ORPHAN_GRACE_MS = 300_000
"""``[kernel] pty_orphan_grace_ms``: a PTY whose owner (session + principal) has had no
attached connection this long is closed and its CPU charged (kernel/pty/orphans.py)."""
PTY_REAP_POLL_MAX_S = 5.0
PTY_REAP_POLL_MIN_S = 0.05
"""The orphan reaper looks every half grace period, within these bounds."""
PTY_MAX_CMD_LEN = 4096
"""Longest `cmd` accepted by `pty.open`, in characters."""
PTY_SPAWN_TIMEOUT_S = 10.0
"""Longest wait for the spawn trampoline to exec the program."""

# --- sessions / ids ----------------------------------------------------------------
DEFAULT_SESSION = "default"
PROJECT_POLICIES_KEPT = 256
"""Rules of principals with ``{project}`` globs, kept per (principal, project)."""
PROJECT_PLACEHOLDER = "{project}"
"""In a policy's fs globs: the session's project (the client's roots, else the git work
tree of the directory the facade started in)."""
PLAN_REF_HEX = 32
REEF_VERSIONS_REMEMBERED = 1024
"""``session.reef`` tool versions kept (per tool, mtime and sandbox: per principal)."""
SANDBOX_MAX_PROCS = 4096
"""Processes one sandboxed tree may have at once (RLIMIT_NPROC inside its own user
namespace, so the uid's other processes do not count): a fork bomb stops there instead
of at the uid's limit, which the kernel and the human share."""
SANDBOX_SPEC_TTL_S = 2.0
"""How long a principal's built sandbox spec is reused (building one walks the grants
and /etc, ~3-10 ms). Safe to reuse: the supervisor re-checks every rule path and leaves
out any that now resolves elsewhere, so a stale spec can only be narrower."""
APPROVAL_EVENT_SRC_CHARS = 4096
"""Longest escaped source in an ``approval`` event; a longer one ends in a marker that
says how much more there is (``plan.get`` has all of it, never silently cut)."""

# --- session state (docs/decisions.md, Session state) --------------------------------
STATE_REPORT_MAX_BYTES = 4 * MiB
"""Largest cwd+env report an exec's EXIT trap may write; a bigger one is ignored whole
(Linux's own argv+env limit is far below this)."""
ENV_REFUSED_MAX = 64
"""Most refused variable names an outcome's ``env_refused`` lists."""
ENV_STRING_MAX = 128 * KiB
"""Longest ``NAME=value`` string (with its NUL) a program can be started with: Linux's
MAX_ARG_STRLEN. A session variable longer than this would make every later exec fail
E2BIG ("Argument list too long"), so an exec that exports one keeps its old value."""
ENV_TOTAL_MAX = 1 * MiB
"""Most bytes a session's environment may take in ``execve`` (each string, its NUL and
its pointer). Linux allows argv + env together a quarter of the stack limit (2 MiB by
default); the rest is left for the command line and the variables the kernel adds."""
PROTECTED_ENV = (
    # bash itself
    "BASH_ENV", "ENV", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "PS4", "PS0", "INPUTRC",
    # where programs are found, and where they read their configuration
    "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "ZDOTDIR", "CDPATH",
    # interpreters and runtimes loading code or options
    "CLASSPATH", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS",
    "RUBYOPT", "RUBYLIB", "GEM_HOME", "GEM_PATH", "TCLLIBPATH", "R_PROFILE", "R_PROFILE_USER",
    "GCONV_PATH", "LOCPATH", "GNUPGHOME", "DOCKER_CONFIG",
    # programs other programs start
    "EDITOR", "VISUAL", "PAGER", "MANPAGER", "LESSOPEN", "LESSCLOSE", "BROWSER",
    "SSH_ASKPASS", "SUDO_ASKPASS", "TERMINAL",
)  # fmt: skip
"""Variables a sandboxed principal's exec may set only with an ``env_write`` grant of
that exact name (globs do not count): each makes bash, the loader or a program the
human runs later run code or read configuration from elsewhere."""
PROTECTED_ENV_PREFIXES = (
    "BASH_FUNC_", "LD_", "GIT_", "PYTHON", "PERL", "NODE_", "NPM_CONFIG_", "npm_config_",
    "LUA_", "CARGO_", "RUSTC", "GOFLAGS", "PIP_",
)  # fmt: skip
"""Prefixes with the same rule (exported functions, the dynamic loader, git, language
runtimes and package managers)."""
REF_RESERVE_BLOCK = 64
"""``out:N`` numbers reserved per durable write (fsync) of the ref counter file: one
fsync per 64 execs of a session (ahead of need), at most 127 numbers skipped after a crash."""
DB_WRITE_WAIT_S = 30.0
"""How long a write to the kernel's database waits for the writer before it, in the
kernel's write queue and (for another process) SQLite's busy handler."""
WAL_CHECKPOINT_EVERY = 64
"""The kernel's database checkpoints its write-ahead log on the housekeeper after this
many commits (about SQLite's default of 1,000 pages at ~13 pages per exec), not in
whichever commit crosses SQLite's threshold: that one was an exec's on the owner loop,
and waited for two fsyncs."""
EVENTS_WRITE_WAIT_S = 5.0
"""The same for a durable event's insert (a publish is never held up longer)."""
JOURNAL_ERROR_MAX_CHARS = 500
"""Longest reason a journal row's ``error`` keeps (a failed finalize, a lost exec)."""
VERIFIED_BLOBS_REMEMBERED = 16384
"""Blobs whose blake3 hash the kernel remembers having checked (per file identity);
a blob not remembered is hashed again when next mapped."""
BLOB_INFOS_REMEMBERED = 1024
"""Recorded blob metadata (hash, size, lines) the kernel keeps in memory, most recently
used first: a reply needs the metadata of each blob it shows."""
SMALL_BLOB_KEPT = 64 * KiB
"""A stored blob up to this size is read whole, once, by the reader that uses it (a
reply's encoder and renderer read the same small output several times)."""
BLOB_READERS_PER_CALL = 8
"""Blob readers one call's resolver keeps for reuse (an outcome names two)."""
VERIFY_REPORT_MAX = 100
"""Most damaged blobs ``store.verify`` lists by hash (the count covers all)."""
RUN_CLOCK_SLACK_NS = 250_000_000
"""An exec's journaled duration switches from the kernel's spawn→reap span to the span
its own EXIT report shows when the two differ by more than this (the kernel was stopped)."""

# --- exec supervisors and warm shells (docs/architecture.md, Processes) -------------
SUPERVISOR_START_TIMEOUT_S = 30.0
"""How long an exec supervisor may take to start its command (or to exit once told)."""
LANE_START_TIMEOUT_S = 2.0
"""How long a lane (an exec's supervisor kept for the session's next ready shell) may
take to start it before it is given up and the zygote forks one instead: a command
may have stopped its supervisor (``kill -STOP $PPID``)."""
DEFAULT_MAX_OUTPUT_BYTES = 1024 * MiB
"""Policy ``max_output_bytes`` default: stdout + stderr of one exec; past it the command's
tree is killed, the spools are cut back to the cap and the outcome says ``output_capped``."""
WARM_POOL_IDLE_S = 60.0
"""A warm supervisor zygote (one per principal and sandbox spec) unused this long exits."""
WARM_POOL_MAX_KEYS = 16
"""At most this many warm zygotes at once; the least recently used goes."""
REPORTS_REMEMBERED = 64
REPORT_REMEMBERED_MAX = 32 * KiB
"""Exec state reports (``export -p``) kept parsed, and the largest one kept: a session's
report is usually the same exec after exec (exec/exports.py). One per session busy at
once, as many as ready shells: with 16, 32 agents took turns evicting each other's and
every report was parsed again. At most about 6 MiB (the raw bytes and their parse)."""
READY_SHELL_WAIT_S = 0.5
"""How long an exec waits for its session's ready shell that is still starting (past
it, the exec starts its own bash). A start under way is nearly always sooner done than
a cold one begun now, which needs the same busy CPUs for more work: at 0.05 s, 32
agents on 2 cores went cold on 15% of their execs, which made the slowest tenth of all
calls (p99 413 ms; 161 at 0.5 s). The bound is for a start that hangs."""
READY_SHELLS_MAX = 64
"""At most this many started bash processes waiting for a source (exec/ready.py), one
per (principal, session); the least recently made goes. One costs ~2.1 MB (PSS: its
bash ~0.5, its supervisor ~1.65) until it is used or idle for ``WARM_POOL_IDLE_S``. At
16, 32 agents took turns evicting each other's: 1% of their execs went cold (the
evicted shell's start wasted too), which cost 6% of the kernel's CPU per call."""
ENCODED_ENV_CACHED_MAX = 64 * KiB
"""Largest session environment (bytes of its values) whose encoding a ready shell's
refill keeps for the next (exec/ready_start.py): at most ``READY_SHELLS_MAX`` of them."""
ZYGOTE_EXIT_WAIT_S = 5.0
"""Kernel exit: how long to wait for each zygote (its jobs are killed by then)."""
OWNER_LOOP_EXIT_WAIT_S = 5.0
"""Kernel exit: how long the owner loop (owner/loop.py) may take to run what was handed
to it before its thread is left behind."""
SPOOL_FULL_WAIT_S = 10.0
"""Honest storage (issue 31): a command's output write that meets a full disk is held
(the command blocks on its pipe) this long for the disk to free up; then the bytes are
dropped, counted, and the exec is stored ``ok: false, truncated``."""

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
"""``[kernel] max_connections``: open connections of the whole kernel (each a worker
until it attaches, then a reader on the owner loop)."""
STATE_BYTES = 32 * 1024 * MiB
"""``[kernel] max_state_bytes``: size of the state dir past which new execs and plans are
refused (-32031) until ``shoal gc`` frees room."""
ANALYSIS_CACHE_ENTRIES = 256
ANALYSIS_CACHE_SRC_MAX = 4 * KiB
"""The effects analyses the kernel keeps (a pure function of source, cwd and home), and
the longest source kept (so the cache stays under about a MiB)."""
STATE_USED_RECHECK_S = 1.0
STATE_USED_HEADROOM = 256 * MiB
"""The state dir's size, once measured, stands for ``STATE_USED_RECHECK_S`` while it is at
least ``STATE_USED_HEADROOM`` under ``max_state_bytes``: measuring (a SUM and a directory
walk) before every exec was a tenth of a small exec's kernel time. Near the budget it is
measured every time."""
MIN_FREE_BYTES = 256 * MiB
MIN_FREE_FRACTION = 0.01
"""``[kernel] min_free_bytes``: free space on the state dir's filesystem below which new
execs and plans are refused too (a clear error before the disk is full). Unset, it is
``MIN_FREE_FRACTION`` of that filesystem's size, at most ``MIN_FREE_BYTES``."""
FRAME_BEFORE_ATTACH = 64 * KiB
"""Largest frame accepted before ``session.attach`` (SPEC §6)."""
CPU_MS_PER_S = 100
CPU_MS_PER_S_LOCAL = 0
"""``max_cpu_ms_per_s``: kernel CPU milliseconds a principal's calls may use per second
(measured per thread, charged after the work); past it its next frames wait until it is
back in credit (delayed, never refused; kernel/rpc/fairness.py). 0 means no limit."""
CPU_BURST_S = 1.0
"""Seconds of ``max_cpu_ms_per_s`` a principal may use in one burst before it waits."""
CPU_DEBT_CAP_S = 5.0
"""A principal's CPU debt is capped at this many seconds of its own rate: one expensive
call (a catastrophic regex search) holds its next frames this long at most, not for the
whole debt (four such searches held a token principal 51 s; issue 31). Kept below
``LIVENESS_TIMEOUT_S`` so a held connection still answers its pings in time."""
CPU_UNMETERED_METHODS = frozenset({"ping", "task.cancel", "kernel.status"})
"""Never held by the CPU budget (their cost is tiny): a client in debt can still cancel
its own work, see why it waits, and tell a throttled kernel from a stalled one."""
CPU_WAIT_SLICE_S = 0.25
"""A waiting principal rechecks its credit (and whether its connection closed) this often."""
ATTACH_DEADLINE_MS = 30_000
"""``[kernel] attach_timeout_ms``: a connection that has not attached after this long is
answered -32000 and closed."""
MAX_BLOCKING_CALLS = 64
"""Blocking calls (exec, task.await, …: one thread each) one connection runs at once."""
MAX_QUEUED_BLOCKING_CALLS = 256
"""Blocking calls past ``MAX_BLOCKING_CALLS`` wait in the connection's queue, this many
at most (the facade accepts ``MCP_INPUT_QUEUE`` pipelined requests and sends them all on
one connection); past it they are refused -32031 (quota ``blocking_calls``)."""
MAX_QUEUED_BLOCKING_BYTES = 64 * MiB
"""Frame bytes a connection's queued blocking calls hold at most (1 MiB sources)."""
LOOP_FINALIZE_MAX_BYTES = 256 * KiB
"""An exec watched on the owner loop whose output is larger than this is finalized
(hashed, stored) on a worker instead, so that the other clients do not wait for it."""
MAX_DRAIN_BACKLOG = 16
"""Frames of one connection waiting for its quick calls to answer (rpc/loop_reading.py)
before the owner loop stops reading it; it reads on once they have (backpressure)."""
MAX_DRAIN_BACKLOG_BYTES = 1 * MiB
"""The same bound in frame bytes."""
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
LISTEN_BACKLOG = 128
"""Pending connections the kernel's socket queues before they are accepted."""
