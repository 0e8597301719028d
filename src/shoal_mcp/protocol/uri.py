"""The one grammar of shoal names: refs (``out:N``, ``task:N``, ``plan:<hex>``, ``pty:N``),
``shoal://`` URIs and event channels (``task.N``, ``pty.N``, ``user.*``…).

Everything that parses or builds one of these calls this module, so the kernel, the
facade and the CLI cannot drift apart. It is sans-I/O and imports nothing else of the
package.

URIs (docs/protocol.md, "Resources"):

====================================  ======================================
``shoal://out/N?query``                value ``out:N`` of the caller's session
``shoal://task/N``                     a task record
``shoal://task/N/out?query``           a task's stdout (live while it runs)
``shoal://task/N/err?query``           a task's stderr
``shoal://val/HASH?offset&length``     raw bytes of a stored blob
``shoal://plan/plan:HEX``              a stored plan (``shoal://plan/HEX`` too)
``shoal://session/cwd|env|reef``       session views
``shoal://pty`` / ``shoal://pty/N``    open PTYs / one PTY's screen
``shoal://jobs``                       listed tasks
``shoal://journal?filters``            journal rows
``shoal://outputs?match=…&filters``    a search across every stored output (Find)
``shoal://events/CHANNEL?since&limit`` recent events of a channel
====================================  ======================================

URIs arrive raw or percent-encoded (clients normalise them differently); both parse to
the same ``ShoalUri``. Built URIs stay readable: a query value is percent-encoded only
where a character would change how it parses (``%``, ``&``, ``#``, ``+``, white space,
control and non-ASCII characters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

SCHEME = "shoal://"

# Kinds of ShoalUri (the first path segment, refined by the rest).
OUT = "out"
TASK = "task"
TASK_OUT = "task_out"
TASK_ERR = "task_err"
VAL = "val"
PLAN = "plan"
SESSION = "session"
PTY = "pty"
PTYS = "ptys"
JOBS = "jobs"
JOURNAL = "journal"
EVENTS = "events"
OUTPUTS = "outputs"
OUTPUTS_REF = "outputs"
"""The ``value.get`` ref that searches every stored output (docs/protocol.md, Find)."""

SESSION_VIEWS = ("cwd", "env", "reef")
QUERY_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%&#+")
"""Printable ASCII kept as is in query values; everything else is percent-encoded."""

_NUMBER = re.compile(r"[0-9]{1,19}")
_HASH = re.compile(r"[0-9a-f]{16,128}")
_PLAN_HEX = re.compile(r"[0-9a-f]{1,128}")  # unknown lengths are unknown plans, not bad refs
_MAX_SHOWN = 200  # how much of a bad name an error message repeats
_CHANNEL = re.compile(
    r"journal|session\.transcript|approval"
    r"|(?:task|pty)\.(?:0|[1-9][0-9]*)"
    r"|user\.[A-Za-z0-9._:@+=~-]+"
)
USER_CHANNEL_PREFIX = "user."


class BadName(ValueError):
    """Text that is not a shoal ref, URI or channel; the message says what was expected."""


@dataclass(frozen=True, slots=True)
class ShoalUri:
    """A parsed ``shoal://`` URI: its kind, the one identifier in its path, its query."""

    kind: str
    ident: str | None = None
    query: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return build(self.kind, self.ident, self.query)


@dataclass(frozen=True, slots=True)
class Ref:
    """A short ref: ``kind`` is out / task / plan / pty, ``ident`` the number or plan ref."""

    kind: str
    ident: str

    def __str__(self) -> str:
        return self.ident if self.kind == PLAN else f"{self.kind}:{self.ident}"


# -- building ----------------------------------------------------------------------------


def encode_query(query: Mapping[str, object]) -> str:
    """``?k=v&…`` for the non-empty items of ``query`` (None values are left out)."""
    items = [(k, v) for k, v in query.items() if v is not None and v != ""]
    if not items:
        return ""
    return "?" + "&".join(f"{k}={quote(str(v), safe=QUERY_SAFE)}" for k, v in items)


def build(
    kind: str, ident: str | int | None = None, query: Mapping[str, object] | None = None
) -> str:
    """The URI of ``kind`` (one of the constants above) for ``ident``, with ``query``."""
    q = encode_query(query or {})
    if kind in (OUT, VAL, PLAN, SESSION, PTY, EVENTS):
        if ident is None:
            raise BadName(f"a {kind} URI needs an identifier")
        return f"{SCHEME}{kind}/{ident}{q}"
    if kind in (TASK, TASK_OUT, TASK_ERR):
        suffix = {TASK: "", TASK_OUT: "/out", TASK_ERR: "/err"}[kind]
        return f"{SCHEME}task/{ident}{suffix}{q}"
    if kind == PTYS:
        return f"{SCHEME}pty{q}"
    if kind in (JOBS, JOURNAL, OUTPUTS):
        return f"{SCHEME}{kind}{q}"
    raise BadName(f"unknown URI kind {kind!r}")


def out_ref(n: int) -> str:
    return f"out:{n}"


def out_uri(n: int, **query: object) -> str:
    return build(OUT, n, query)


def task_ref(n: int) -> str:
    return f"task:{n}"


def task_uri(n: int, stream: str | None = None, **query: object) -> str:
    """``shoal://task/N`` or, with ``stream`` "out"/"err", that stream's URI."""
    kind = {None: TASK, "out": TASK_OUT, "err": TASK_ERR}[stream]
    return build(kind, n, query)


def task_channel(n: int) -> str:
    return f"task.{n}"


def pty_ref(n: int) -> str:
    return f"pty:{n}"


def pty_uri(n: int) -> str:
    return build(PTY, n)


def pty_channel(n: int) -> str:
    return f"pty.{n}"


def plan_uri(plan_ref: str) -> str:
    return build(PLAN, plan_ref)


def val_uri(digest: str, offset: int | None = None, length: int | None = None) -> str:
    return build(VAL, digest, {"offset": offset, "length": length})


# -- value queries (docs/protocol.md, Resource templates and Search) ----------------------

MATCH_FLAGS = ("ignore_case", "invert")
MATCH_INTS = ("context", "max", "from_line")
VALUE_QUERY_STRS = ("path", "slice", "format")
VALUE_QUERY_INTS = ("offset", "length")
FIND_QUERY_FLOATS = ("since", "until")
FIND_QUERY_STRS = ("session", "stream", "cursor")
TRUE_WORDS = ("1", "true", "yes")
FALSE_WORDS = ("0", "false", "no")


def match_query(match: dict[str, object]) -> dict[str, object]:
    """URI query items for a ``match`` param (``match=REGEX&context=2&invert=1``…)."""
    out: dict[str, object] = {"match": match["regex"]}
    out.update({k: match[k] for k in MATCH_INTS if k in match})
    out.update({k: 1 for k in MATCH_FLAGS if match.get(k)})
    return out


def _query_int(query: dict[str, str], key: str) -> int:
    try:
        return int(query[key])
    except ValueError:
        raise BadName(f"query {key}={_shown(query[key])!r} is not an integer") from None


def value_params(query: dict[str, str]) -> dict[str, object]:
    """The ``value.get`` params a value URI's query stands for (all but ``path``).

    ``match`` with its options becomes the ``match`` object; flags are true for
    1/true/yes. BadName names a malformed item.
    """
    params: dict[str, object] = {k: query[k] for k in ("slice", "format") if query.get(k)}
    params.update({k: _query_int(query, k) for k in VALUE_QUERY_INTS if k in query})
    if "match" in query:
        match: dict[str, object] = {"regex": query["match"]}
        match.update({k: _query_int(query, k) for k in MATCH_INTS if k in query})
        match.update({k: query[k].lower() in TRUE_WORDS for k in MATCH_FLAGS if k in query})
        params["match"] = match
    params.update(_find_params(query))
    return params


def _find_params(query: dict[str, str]) -> dict[str, object]:
    """The filters of a search across runs (``shoal://outputs?…``): times, session,
    stream, ok and cursor; a value URI that carries one is refused by the kernel."""
    params: dict[str, object] = {k: query[k] for k in FIND_QUERY_STRS if query.get(k)}
    for key in FIND_QUERY_FLOATS:
        if key in query:
            try:
                params[key] = float(query[key])
            except ValueError:
                raise BadName(f"query {key}={_shown(query[key])!r} is not a number") from None
    if "ok" in query:
        word = query["ok"].lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise BadName(f"query ok={_shown(query['ok'])!r} is not true or false")
        params["ok"] = word in TRUE_WORDS
    return params


def outputs_query(params: Mapping[str, object]) -> dict[str, object]:
    """URI query items for a search across runs (``value.get`` params, ref outputs)."""
    match = params["match"]
    out = match_query(match if isinstance(match, dict) else {"regex": match})
    for key in (*FIND_QUERY_FLOATS, *FIND_QUERY_STRS):
        if params.get(key) is not None:
            out[key] = params[key]
    if params.get("ok") is not None:
        out["ok"] = "true" if params["ok"] else "false"
    return out


def with_query(uri: str, **query: object) -> str:
    """``uri`` with ``query`` items set (replacing same-named ones)."""
    parsed = parse_uri(uri)
    return build(parsed.kind, parsed.ident, {**parsed.query, **query})


# -- parsing -----------------------------------------------------------------------------


def _shown(text: object) -> str:
    return str(text)[:_MAX_SHOWN]


def parse_uri(text: str) -> ShoalUri:
    """Parse a raw or percent-encoded ``shoal://`` URI; BadName when it is none."""
    if not isinstance(text, str) or not text.startswith(SCHEME):
        raise BadName(f"not a shoal:// URI: {_shown(text)!r}")
    split = urlsplit(text)
    parts = [unquote(p) for p in (split.netloc + split.path).split("/") if p]
    if any(p in (".", "..") or "\x00" in p for p in parts):
        raise BadName(f"not a shoal:// URI: {_shown(text)!r}")
    query: dict[str, str] = {}
    for key, value in parse_qsl(split.query, keep_blank_values=True):
        query[key] = value  # the last of a repeated key wins
    kind = _uri_kind(parts)
    if kind is None:
        raise BadName(f"unknown shoal:// URI: {_shown(text)!r}")
    ident = parts[1] if len(parts) > 1 else None
    if kind == PLAN and ident is not None and not ident.startswith("plan:"):
        ident = "plan:" + ident
    return ShoalUri(kind, ident, query)


def _uri_kind(parts: list[str]) -> str | None:
    head, n = (parts[0] if parts else ""), len(parts)
    if head == "out" and n == 2 and _NUMBER.fullmatch(parts[1]):
        return OUT
    if head == "task" and n in (2, 3) and _NUMBER.fullmatch(parts[1]):
        return {2: TASK, 3: {"out": TASK_OUT, "err": TASK_ERR}.get(parts[-1])}[n]
    if head == "val" and n == 2:
        return VAL
    if head == "plan" and n == 2:
        return PLAN
    if head == "session" and n == 2 and parts[1] in SESSION_VIEWS:
        return SESSION
    if head == "pty" and n == 1:
        return PTYS
    if head == "pty" and n == 2:
        return PTY
    if head in ("jobs", "journal", "outputs") and n == 1:
        return head
    if head == "events" and n == 2:
        return EVENTS
    return None


def parse_ref(text: str) -> Ref:
    """A short ref (``out:N``, ``task:N``, ``plan:<hex>``, ``pty:N``), or the one a URI names.

    URIs of other kinds (journal, session views…) are not refs: BadName.
    """
    if not isinstance(text, str):
        raise BadName(f"not a ref: {_shown(text)!r}")
    text = text.strip()
    if text.startswith(SCHEME):
        uri = parse_uri(text)
        if uri.kind == OUT:
            return Ref(OUT, uri.ident or "")
        if uri.kind in (TASK, TASK_OUT, TASK_ERR):
            return Ref(TASK, uri.ident or "")
        if uri.kind == PLAN:
            return Ref(PLAN, uri.ident or "")
        if uri.kind == PTY:
            ident = uri.ident or ""
            return parse_ref(ident if ident.startswith("pty:") else f"pty:{ident}")
        raise BadName(f"{_shown(text)!r} names no value (refs look like out:N, task:N, plan:<hex>)")
    kind, sep, rest = text.partition(":")
    if sep and kind in (OUT, TASK, PTY) and _NUMBER.fullmatch(rest):
        return Ref(kind, rest)
    if sep and kind == PLAN and _PLAN_HEX.fullmatch(rest):
        return Ref(PLAN, text)
    raise BadName(
        f"unknown ref {_shown(text)!r}: refs look like out:N, task:N, plan:<hex> or shoal://out/N"
    )


def ref_number(text: str | int, kind: str) -> int:
    """The N of ``kind:N`` (or of a URI naming it, or a bare N); BadName otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    text = str(text).strip()
    if _NUMBER.fullmatch(text):
        return int(text)
    ref = parse_ref(text)
    if ref.kind != kind:
        raise BadName(f"{_shown(text)!r} is not a {kind} ref")
    return int(ref.ident)


def plan_ref_of(text: str) -> str:
    """``plan:<hex>`` from a plan ref or a ``shoal://plan/…`` URI (unchecked otherwise)."""
    text = text.strip()
    if text.startswith(SCHEME + "plan/"):
        ident = parse_uri(text).ident
        return ident or text
    return text


def parse_channel(channel: str) -> tuple[str, int | None]:
    """(``task``/``pty``, N) for ``task.N``/``pty.N``; (channel, None) for any other name."""
    kind, dot, num = channel.partition(".")
    if dot and kind in (TASK, PTY) and _NUMBER.fullmatch(num):
        return kind, int(num)
    return channel, None


def is_channel(name: str) -> bool:
    """Whether ``name`` is an event channel (docs/protocol.md, Events): ``journal``,
    ``session.transcript``, ``approval``, ``task.N`` / ``pty.N`` (N without leading zeros)
    or ``user.<suffix>``. The suffix is URI-safe (``A-Z a-z 0-9 . _ : @ + = ~ -``), so
    ``shoal://events/{channel}`` needs no escaping. Its length is the kernel's to bound."""
    return _CHANNEL.fullmatch(name) is not None


def is_user_channel(name: str) -> bool:
    """Whether ``name`` is a ``user.*`` channel: the kind clients create and publish to."""
    return name.startswith(USER_CHANNEL_PREFIX) and is_channel(name)


def is_hash(text: str) -> bool:
    return bool(_HASH.fullmatch(text))
