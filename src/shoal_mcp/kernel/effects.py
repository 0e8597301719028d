"""Effects of a bash source, derived statically with tree-sitter-bash (SPEC §4.7).

``analyze(src, cwd, home)`` walks the syntax tree and returns what the source would do,
as ``{"kind", "target"}`` dicts (deduplicated, in order of first appearance):

* ``proc_spawn``  argv0 as written, for every simple command (builtins included; the
  policy grants the state-only builtins of ``SHELL_BUILTINS`` implicitly).
* ``fs_read`` / ``fs_write`` / ``fs_delete``  absolute, normalised paths; relative ones
  are resolved against ``cwd`` (tracked through literal ``cd``), ``~`` against ``home``.
  A target ending in ``/**`` means "this path and everything below it" (``rm -r``,
  ``cp -r``, ``grep -r``, ``rg``, ``find``, a git work tree).  Glob characters a command
  line passes through unexpanded (``rm *.o``) stay in the target, matched literally by
  the policy, which is the conservative reading.  ``/dev/null``-like pseudo files and
  ``-`` (stdio) are not effects.
* ``net_connect``  ``host:port`` (scheme default port, ``*`` when unknown; a host that is
  not literal, such as a git remote name, is ``*``).
* ``session_write`` (target ``cwd``), ``env_write`` / ``env_read`` (a variable name;
  ``*`` means the whole environment, e.g. ``env`` or ``export -p``).
* ``opaque``  a short reason: whatever cannot be understood statically (command
  substitution in argv, ``eval``, ``bash -c``, ``xargs``, ``find -exec``, ``source``,
  a dynamic argv0 or path, a parse error ...).

Reversibility, the exact rule: the analysis is ``irreversible`` when it contains an
``opaque`` or ``fs_delete`` effect, a network write (``git push``, ``curl`` with a body
or a non-GET method, ``scp``/``rsync`` to a remote, an ``ssh`` remote command,
``npm publish``), or a git command that discards work (``reset --hard``, ``clean``,
``checkout -f``/``-- PATHS``, ``restore``, ``stash drop|clear``).  Otherwise it is
``conditional`` when anything writes: ``fs_write``, ``session_write``, a persistent
``env_write``, any ``net_connect``, or a ``proc_spawn`` of a program not known to be
read-only.  Otherwise (only ``fs_read``, ``env_read``, ``proc_spawn`` of known read-only
programs, and ``env_write`` confined to one command's environment, ``VAR=x cmd``) it is
``reversible``.  ``reasons`` says which effect decided it.

Approximations, on purpose: a ``cd`` inside a branch, loop or function makes the cwd
unknown afterwards (later relative paths become ``opaque``); a function body's effects
count once, where it is defined; a bare ``NAME=value`` is an ``env_write`` only for an
environment-style name (upper case, or a ``*_proxy`` variable), since lower-case names
are shell variables that do not persist (SPEC §4.4); reads of variables the script
assigned itself are not ``env_read``.
"""

from __future__ import annotations

import posixpath
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import bracex
import tree_sitter_bash
from tree_sitter import Language, Node, Parser

MAX_LIST = 200
"""Cap on every list a summary or an analysis returns."""
MAX_EFFECTS = 1000
MAX_DEPTH = 64
"""Nesting deeper than this is opaque (keeps recursion far from Python's limit)."""
MAX_BRACE = 64



def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


REVERSIBLE, CONDITIONAL, IRREVERSIBLE = "reversible", "conditional", "irreversible"
_LEVELS = (REVERSIBLE, CONDITIONAL, IRREVERSIBLE)

SHELL_BUILTINS = _words(
    "cd pushd popd dirs pwd echo printf test [ true false : set shift read exit return "
    "break continue wait getopts let local export declare typeset readonly unset alias "
    "unalias shopt umask type hash help times jobs"
)
"""Builtins that spawn nothing and whose effects are all reported as other kinds."""

# Programs whose only effects are the reads their handler reports (or none at all).
_READ_ONLY = _words(
    "echo printf pwd true false test [ : which type whereis id whoami uname date sleep seq "
    "yes expr uptime ps df free nproc locale tty groups logname arch cal basename dirname "
    "shift exit return break continue wait getopts let shopt alias unalias hash help "
    "times jobs dirs umask"
)
_PSEUDO_FILES = ("/dev/null", "/dev/zero", "/dev/stdin", "/dev/stdout", "/dev/stderr",
                 "/dev/tty", "/dev/random", "/dev/urandom")
_STATEMENTS = _words(
    "program redirected_statement variable_assignment variable_assignments command "
    "declaration_command unset_command test_command negated_command for_statement "
    "c_style_for_statement while_statement if_statement case_statement pipeline list "
    "subshell compound_statement function_definition comment ERROR"
)
_ENVISH = re.compile(r"[A-Z_][A-Z0-9_]*|(?:http|https|ftp|all|no)_proxy")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_LANGUAGE = Language(tree_sitter_bash.language())
_local = threading.local()


def _parser() -> Parser:
    # Parsers are not thread-safe; the kernel may analyse from several threads.
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = Parser(_LANGUAGE)
    return parser


def _encode(src: str) -> bytes:
    # Lone surrogates cannot be UTF-8; pass them through rather than fail.
    return src.encode("utf-8", "surrogatepass")


def _walk(node: Node) -> Iterator[Node]:
    """Pre-order over every node, iteratively (scripts can nest deeply)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _point(src: bytes, node: Node, at_end: bool = False) -> dict[str, int]:
    byte = node.end_byte if at_end else node.start_byte
    row, bcol = node.end_point if at_end else node.start_point
    line_start = byte - bcol
    return {"row": row, "col": len(src[line_start:byte].decode("utf-8", "replace"))}


def _first_error(src: bytes, root: Node) -> dict[str, Any] | None:
    for n in _walk(root):
        if n.is_missing:
            return {"start": _point(src, n), "end": _point(src, n, True),
                    "message": f"syntax error: missing {n.type!r}"}
        if n.is_error:
            near = src[n.start_byte:n.end_byte][:40].decode("utf-8", "replace")
            return {"start": _point(src, n), "end": _point(src, n, True),
                    "message": f"syntax error near {near!r}"}
    if root.has_error:
        return {"start": _point(src, root), "end": _point(src, root, True),
                "message": "syntax error"}
    return None


def parse_summary(src: str) -> dict[str, Any]:
    """The kernel ``parse`` result: ok/error span, argv0s in order, node count, root type."""
    data = _encode(src)
    root = _parser().parse(data).root_node
    commands: list[str] = []
    truncated = False
    count = 0
    for n in _walk(root):
        count += 1
        name = None
        if n.type == "command":
            name_node = n.child_by_field_name("name")
            if name_node is not None:
                name = data[name_node.start_byte:name_node.end_byte].decode("utf-8", "replace")
        elif n.type in ("declaration_command", "unset_command") and n.child_count:
            name = n.children[0].type
        if name is not None:
            if len(commands) < MAX_LIST:
                commands.append(name)
            else:
                truncated = True
    out: dict[str, Any] = {"ok": not root.has_error}
    error = _first_error(data, root)
    if error is not None and root.has_error:
        out["error"] = error
    out.update(commands=commands, node_count=count, root=root.type)
    if truncated:
        out["truncated"] = True
    return out


@dataclass(slots=True)
class Analysis:
    effects: list[dict[str, str]]
    reversibility: str
    parse_ok: bool
    error: dict[str, Any] | None = None
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"effects": self.effects, "reversibility": self.reversibility,
                               "parse_ok": self.parse_ok, "reasons": self.reasons}
        if self.error is not None:
            out["error"] = self.error
        return out


def analyze(src: str, cwd: str, home: str | None = None) -> Analysis:
    """Effects and reversibility of ``src`` run in ``cwd`` (see the module docstring)."""
    data = _encode(src)
    root = _parser().parse(data).root_node
    a = _Analyzer(data, cwd, home)
    error = None
    if root.has_error:
        error = _first_error(data, root)
        a.opaque("parse error")
    a.visit(root)
    return Analysis(effects=[{"kind": k, "target": t} for k, t in a.effects],
                    reversibility=_LEVELS[a.level], parse_ok=not root.has_error,
                    error=error, reasons=a.reasons)


# --- argument helpers ----------------------------------------------------------------

Args = list[str | None]
"""Static argv words; None stands for a word whose value is only known at run time."""


def _options(args: Sequence[str | None], short_val: str = "", long_val: Sequence[str] = (),
             *, stop_at_positional: bool = False) -> tuple[list[tuple[str, str | None]], Args]:
    """Split getopt-style ``args`` into (options, positionals); valued options take theirs."""
    opts: list[tuple[str, str | None]] = []
    pos: Args = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg is None or arg == "-" or not arg.startswith("-"):
            pos.append(arg)
            if stop_at_positional:
                pos.extend(args[i:])
                break
            continue
        if arg == "--":
            pos.extend(args[i:])
            break
        if arg.startswith("--"):
            name, eq, val = arg.partition("=")
            if name in long_val and not eq:
                val = args[i] if i < len(args) else None  # type: ignore[assignment]
                i += 1
            opts.append((name, val if (eq or name in long_val) else None))
            continue
        for j, ch in enumerate(arg[1:]):
            if ch in short_val:
                rest = arg[2 + j:]
                if not rest:
                    rest = args[i] if i < len(args) else None  # type: ignore[assignment]
                    i += 1
                opts.append(("-" + ch, rest))
                break
            opts.append(("-" + ch, None))
    return opts, pos


def _has(opts: list[tuple[str, str | None]], *names: str) -> bool:
    return any(o in names for o, _ in opts)


def _values(opts: list[tuple[str, str | None]], *names: str) -> list[str | None]:
    return [v for o, v in opts if o in names]


_SCHEME_PORTS = {"https": "443", "http": "80", "ssh": "22", "git+ssh": "22", "ssh+git": "22",
                 "git": "9418", "ftp": "21", "ftps": "990", "sftp": "22", "rsync": "873",
                 "ws": "80", "wss": "443"}
_SCP_LIKE = re.compile(r"^(?:[^@/:]+@)?(\[[^\]]+\]|[^:/]+):(?!//)")


def _host_port(url: str, default_scheme: str | None = None) -> tuple[str, str] | None:
    """(host, port) of a URL or scp-like ``user@host:path``; None for a local path."""
    if "://" not in url:
        m = _SCP_LIKE.match(url)
        if m and default_scheme is None:
            return m.group(1).strip("[]").lower(), "22"
        if default_scheme is None:
            return None
        url = f"{default_scheme}://{url}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ("*", "*")
    if parts.scheme == "file":
        return None
    host = (parts.hostname or "*").lower()
    return host, str(port) if port else _SCHEME_PORTS.get(parts.scheme, "*")


def _net_target(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_ANSI_C = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", re.S)
_ANSI_MAP = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
             "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}


def _ansi_c(body: str) -> str:
    def sub(m: re.Match[str]) -> str:
        s = m.group(1)
        if s[0] == "x":
            return chr(int(s[1:], 16))
        if s[0].isdigit():
            return chr(int(s, 8))
        return _ANSI_MAP.get(s, "\\" + s)

    return _ANSI_C.sub(sub, body)


# --- the analyser --------------------------------------------------------------------


class _Analyzer:
    def __init__(self, src: bytes, cwd: str, home: str | None) -> None:
        self.src = src
        self.cwd: str | None = posixpath.normpath(cwd) if cwd.startswith("/") else None
        self.home = posixpath.normpath(home) if home and home.startswith("/") else None
        self.effects: dict[tuple[str, str], None] = {}
        self.level = 0
        self.reasons: list[str] = []
        self.assigned: set[str] = set()
        self.functions: set[str] = set()
        self.cd_functions: set[str] = set()
        self.bindings: dict[str, list[str]] = {}  # for-loop variables over literal lists
        self.depth = 0
        self._subst = False  # set while evaluating a word that holds $(...)

    # recording

    def text(self, node: Node) -> str:
        return self.src[node.start_byte:node.end_byte].decode("utf-8", "surrogateescape")

    def bump(self, level: int, why: str) -> None:
        if level > self.level:
            self.level = level
        if level and why not in self.reasons and len(self.reasons) < MAX_LIST:
            self.reasons.append(why)

    def add(self, kind: str, target: str, level: int = 0, why: str | None = None) -> None:
        key = (kind, target)
        if key not in self.effects:
            if len(self.effects) >= MAX_EFFECTS:
                if ("opaque", "too many effects") not in self.effects:
                    self.effects[("opaque", "too many effects")] = None
                    self.bump(2, "opaque: too many effects")
                return
            self.effects[key] = None
        self.bump(level, why or f"{kind} {target}")

    def opaque(self, reason: str) -> None:
        self.add("opaque", reason, 2, f"opaque: {reason}")

    def env_read(self, name: str) -> None:
        if name == "*" or (_IDENT.fullmatch(name) and name not in self.assigned):
            self.add("env_read", name)

    def env_write(self, name: str, persistent: bool = True) -> None:
        self.add("env_write", name, 1 if persistent else 0)

    def net(self, host: str, port: str, write: str | None = None) -> None:
        target = _net_target(host, port)
        if write:
            self.add("net_connect", target, 2, f"network write: {write}")
        else:
            self.add("net_connect", target, 1)

    def url(self, value: str | None, cmd: str, write: str | None = None,
            default_scheme: str | None = "http") -> None:
        if value is None:
            self.opaque(f"dynamic URL: {cmd}")
            return
        hp = _host_port(value, default_scheme)
        if hp is not None:
            self.net(*hp, write=write)

    def path(self, value: str | None, cmd: str, subtree: bool = False) -> str | None:
        """Absolute normalised target for a path word; opaque (None) when not static."""
        if value is None:
            self.opaque(f"dynamic path: {cmd}")
            return None
        if value in ("", "-") or value in _PSEUDO_FILES or value.startswith(
                ("/dev/fd/", "/proc/self/fd/")):
            return None
        if value.startswith("~"):
            self.opaque(f"unresolved ~ in path: {cmd}")
            return None
        if not value.startswith("/"):
            if self.cwd is None:
                self.opaque(f"relative path in unknown cwd: {cmd}")
                return None
            value = posixpath.join(self.cwd, value)
        value = posixpath.normpath(value)
        if value.startswith("//"):
            value = "/" + value.lstrip("/")
        if subtree and not value.endswith("/**"):
            value = value.rstrip("/") + "/**"
        return value

    def read(self, value: str | None, cmd: str, subtree: bool = False) -> None:
        p = self.path(value, cmd, subtree)
        if p is not None:
            self.add("fs_read", p)

    def write(self, value: str | None, cmd: str, subtree: bool = False,
              destroys: str | None = None) -> None:
        p = self.path(value, cmd, subtree)
        if p is not None:
            self.add("fs_write", p, 2 if destroys else 1,
                     f"{destroys}: fs_write {p}" if destroys else None)

    def delete(self, value: str | None, cmd: str, subtree: bool = False) -> None:
        p = self.path(value, cmd, subtree)
        if p is not None:
            self.add("fs_delete", p, 2)

    # scopes

    @contextmanager
    def subshell(self) -> Iterator[None]:
        """A subshell's cd never leaks out."""
        saved = self.cwd
        try:
            yield
        finally:
            self.cwd = saved

    @contextmanager
    def branch(self) -> Iterator[None]:
        """Code that may or may not run: a cwd it changes is unknown afterwards."""
        saved = self.cwd
        try:
            yield
        finally:
            if self.cwd != saved:
                self.cwd = None

    # statements

    def visit(self, node: Node) -> None:
        if self.depth >= MAX_DEPTH:
            self.opaque("nesting too deep")
            return
        self.depth += 1
        try:
            handler = _STATEMENT_HANDLERS.get(node.type)
            if handler is not None:
                handler(self, node)
            elif node.is_named:
                self.scan(node)
        finally:
            self.depth -= 1

    def visit_children(self, node: Node) -> None:
        for child in node.named_children:
            if child.type in _STATEMENTS:
                self.visit(child)
            elif child.type in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
                self.redirect(child)
            else:
                self.scan(child)

    def scan(self, node: Node) -> None:
        """Side effects of a non-statement node: variable reads and nested commands."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n.type in ("command_substitution", "process_substitution"):
                with self.subshell():
                    self.visit_children(n)
                continue
            if n.type == "variable_name":
                self.env_read(self.text(n))
            elif n.type in _STATEMENTS and n is not node:
                self.visit(n)
                continue
            stack.extend(reversed(n.named_children))

    def list_(self, node: Node) -> None:
        # `a && b || c` nests to the left; flatten it so long chains cost no recursion.
        chain: list[tuple[str, Node]] = []
        while node.type == "list" and node.child_count >= 3:
            chain.append((node.children[1].type, node.children[2]))
            node = node.children[0]
        self.visit(node)
        for op, right in reversed(chain):
            if op == "||":
                with self.branch():
                    self.visit(right)
            else:
                self.visit(right)

    def pipeline(self, node: Node) -> None:
        for child in node.named_children:
            with self.subshell():
                self.visit(child)

    def in_subshell(self, node: Node) -> None:
        with self.subshell():
            self.visit_children(node)

    def in_branch(self, node: Node) -> None:
        with self.branch():
            self.visit_children(node)

    def for_(self, node: Node) -> None:
        var = node.child_by_field_name("variable")
        name = self.text(var) if var is not None else ""
        values: Args = []
        body = []
        for child in node.named_children:
            if var is not None and child.id == var.id:
                continue
            if child.type in _STATEMENTS or child.type == "do_group":
                body.append(child)
            else:
                values.extend(self.fields(child))
        self.assigned.add(name)
        # `for f in a b; do rm "$f"; done`: a literal list binds "$f" to its values.
        static = None not in values and 0 < len(values) <= MAX_BRACE
        saved = self.bindings.pop(name, None)
        if static:
            self.bindings[name] = [v for v in values if v is not None]
        try:
            with self.branch():
                for child in body:
                    self.visit(child)
        finally:
            self.bindings.pop(name, None)
            if saved is not None:
                self.bindings[name] = saved

    def function(self, node: Node) -> None:
        name = node.child_by_field_name("name")
        fname = self.text(name) if name is not None else ""
        self.functions.add(fname)
        saved = self.cwd
        with self.branch():
            body = node.child_by_field_name("body")
            if body is not None:
                self.visit(body)
            if self.cwd != saved:
                self.cd_functions.add(fname)

    def redirected(self, node: Node) -> None:
        body = node.child_by_field_name("body")
        redirects = node.children_by_field_name("redirect")
        if body is not None and body.type == "command":
            self.command(body, redirects)
            return
        if body is not None:
            self.visit(body)
        for r in redirects:
            self.redirect(r)

    def assignment(self, node: Node, scope: str = "bare") -> None:
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if value is not None:
            self.fields(value)
        if name_node is None:
            return
        name_text = self.text(name_node)
        if name_node.type == "subscript":
            inner = name_node.child_by_field_name("name")
            name_text = self.text(inner) if inner is not None else name_text
        if scope == "prefix":
            self.env_write(name_text, persistent=False)
            return
        self.assigned.add(name_text)
        if scope == "export" or (scope == "bare" and _ENVISH.fullmatch(name_text)):
            self.env_write(name_text)

    def assignments(self, node: Node) -> None:
        for child in node.named_children:
            if child.type == "variable_assignment":
                self.assignment(child)

    def declaration(self, node: Node) -> None:
        keyword = node.children[0].type if node.child_count else ""
        flags = "".join(self.text(c)[1:] for c in node.named_children
                        if c.type == "word" and self.text(c).startswith("-"))
        exported = keyword == "export" or "x" in flags
        names = [c for c in node.named_children if c.type in ("variable_assignment",
                                                                "variable_name")]
        if not names and (keyword in ("export", "declare", "typeset") or "p" in flags):
            self.env_read("*")
        for c in names:
            if c.type == "variable_assignment":
                self.assignment(c, "export" if exported else "local")
            else:
                self.assigned.add(self.text(c))
                if exported:
                    self.env_write(self.text(c))
        for c in node.named_children:
            if c.type not in ("variable_assignment", "variable_name", "word"):
                self.scan(c)

    def unset(self, node: Node) -> None:
        words = [self.text(c) for c in node.named_children]
        if "-f" in words:
            return
        for w in words:
            if _ENVISH.fullmatch(w):
                self.env_write(w)

    # words

    def fields(self, node: Node) -> Args:
        """Static values of one argument word (brace expansion may give several)."""
        if node.type == "command_name" and node.named_child_count:
            node = node.named_children[0]
        bound = self.bound(node)
        if bound is not None:
            return list(bound)
        value = self.eval(node, first=True)
        if value is None:
            return [None]
        if node.type in ("word", "concatenation", "brace_expression") and "{" in value \
                and not any(c.type in ("string", "raw_string") for c in node.named_children):
            try:
                return list(bracex.expand(value, limit=MAX_BRACE))
            except Exception:  # bracex raises on over-limit / malformed; keep the text
                return [value]
        return [value]

    def eval(self, node: Node, first: bool = False) -> str | None:
        t = node.type
        if t == "word":
            text = re.sub(r"\\(.)", r"\1", self.text(node), flags=re.S)
            if first and text.startswith("~") and (len(text) == 1 or text[1] == "/"):
                if self.home is None:
                    return None
                text = self.home + text[1:]
            return text
        if t in ("number", "brace_expression", "heredoc_content"):
            return self.text(node)
        if t == "raw_string":
            return self.text(node)[1:-1]
        if t == "ansi_c_string":
            return _ansi_c(self.text(node)[2:-1])
        if t in ("string", "translated_string", "concatenation"):
            parts: list[str | None] = []
            for i, c in enumerate(node.children):
                if c.type == "string_content":
                    parts.append(re.sub(r'\\([$`"\\\n])', r"\1", self.text(c)))
                elif c.is_named:
                    parts.append(self.eval(c, first=first and i == 0 and t == "concatenation"))
            return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
        if t in ("simple_expansion", "expansion"):
            return self.expansion(node)
        if t == "command_substitution":
            with self.subshell():
                self.visit_children(node)
            self._subst = True  # after the visit: nested commands reset the flag
            return None
        if t == "process_substitution":
            with self.subshell():
                self.visit_children(node)
            return "/dev/fd/63"
        self.scan(node)
        return None

    def bound(self, node: Node) -> list[str] | None:
        """Values of a whole word that is just ``$v`` / ``"${v}"`` for a loop-bound ``v``."""
        if node.type == "string" and node.named_child_count == 1:
            node = node.named_children[0]
        if node.type not in ("simple_expansion", "expansion") or node.named_child_count != 1:
            return None
        inner = node.named_children[0]
        if inner.type != "variable_name":
            return None
        return self.bindings.get(self.text(inner))

    def expansion(self, node: Node) -> str | None:
        names = [c for c in node.named_children if c.type == "variable_name"]
        plain = len(node.named_children) == 1 and len(names) == 1
        self.scan(node)
        if plain:
            name = self.text(names[0])
            if name == "HOME" and self.home and name not in self.assigned:
                return self.home
            if name == "PWD" and self.cwd and name not in self.assigned:
                return self.cwd
        return None

    # commands

    def command(self, node: Node, redirects: Sequence[Node] = ()) -> None:
        name_node = node.child_by_field_name("name")
        own_redirects = []
        for child in node.named_children:
            if child.type == "variable_assignment":
                self.assignment(child, "prefix" if name_node is not None else "bare")
            elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
                own_redirects.append(child)
        outer_subst = self._subst  # we may be inside another command's $(...)
        if name_node is not None:
            self._subst = False
            argv0 = self.fields(name_node)
            if self._subst:
                self.opaque("command substitution in argv0")
            elif argv0[0] is None or len(argv0) != 1:
                self.opaque("dynamic argv0")
            self._subst = False
            argv: Args = []
            for arg in node.children_by_field_name("argument"):
                argv.extend(self.fields(arg))
            if self._subst:
                self.opaque("command substitution in argv")
            if argv0[0] is not None and len(argv0) == 1:
                self.run([argv0[0], *argv])
        for r in [*own_redirects, *redirects]:
            self.redirect(r)
        self._subst = outer_subst

    def run(self, argv: Args) -> None:
        """Effects of executing ``argv`` (argv[0] is static)."""
        argv0 = argv[0]
        assert argv0 is not None
        if argv0 in self.functions:
            if argv0 in self.cd_functions:
                self.cwd = None
            return
        name = posixpath.basename(argv0)
        self.add("proc_spawn", argv0)
        handler = _COMMANDS.get(name)
        read_only = name in _READ_ONLY
        if handler is not None:
            read_only = handler(self, name, argv[1:]) or False
        if not read_only:
            self.bump(1, f"runs {argv0}")

    def redirect(self, node: Node) -> None:
        if node.type == "herestring_redirect":
            for c in node.named_children:
                self.fields(c)
            return
        if node.type == "heredoc_redirect":
            for c in node.named_children:
                if c.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
                    self.redirect(c)
                elif c.type == "heredoc_body":
                    self.scan(c)
                elif c.type in _STATEMENTS:
                    self.visit(c)
            return
        op = next((c.type for c in node.children if not c.is_named), "")
        dest = node.child_by_field_name("destination")
        if dest is None:
            return
        if op in (">&", "<&") and (dest.type == "number" or self.text(dest) == "-"):
            return  # fd duplication, not a file
        outer_subst, self._subst = self._subst, False
        values = self.fields(dest)
        if self._subst:
            self.opaque("command substitution in redirect")
        self._subst = outer_subst
        for value in values:
            if ">" in op:
                self.write(value, "redirect")
            else:
                self.read(value, "redirect")


_STATEMENT_HANDLERS: dict[str, Callable[[_Analyzer, Node], None]] = {
    "program": _Analyzer.visit_children,
    "compound_statement": _Analyzer.visit_children,
    "do_group": _Analyzer.visit_children,
    "negated_command": _Analyzer.visit_children,
    "test_command": _Analyzer.scan,
    "ERROR": _Analyzer.visit_children,
    "comment": lambda a, n: None,
    "subshell": _Analyzer.in_subshell,
    "pipeline": _Analyzer.pipeline,
    "list": _Analyzer.list_,
    "if_statement": _Analyzer.in_branch,
    "while_statement": _Analyzer.in_branch,
    "c_style_for_statement": _Analyzer.in_branch,
    "case_statement": _Analyzer.in_branch,
    "case_item": _Analyzer.visit_children,
    "elif_clause": _Analyzer.visit_children,
    "else_clause": _Analyzer.visit_children,
    "for_statement": _Analyzer.for_,
    "function_definition": _Analyzer.function,
    "redirected_statement": _Analyzer.redirected,
    "command": lambda a, n: a.command(n),
    "variable_assignment": lambda a, n: a.assignment(n),
    "variable_assignments": _Analyzer.assignments,
    "declaration_command": _Analyzer.declaration,
    "unset_command": _Analyzer.unset,
}

# --- well-known commands ---------------------------------------------------------------
# A handler receives the analyser, the argv0 basename and the remaining argv; it returns
# True when the program itself is read-only (its writes, if any, were reported).

Handler = Callable[[_Analyzer, str, Args], bool]
_COMMANDS: dict[str, Handler] = {}


def _command(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for n in names:
            _COMMANDS[n] = fn
        return fn

    return register


def _reader(short_val: str = "", long_val: Sequence[str] = (), *, default_cwd: bool = False,
            recursive: str | None = None, pattern_first: bool = False) -> Handler:
    """A program that reads its path operands (``recursive``: flag letters or "always")."""

    def handler(a: _Analyzer, name: str, args: Args) -> bool:
        opts, paths = _options(args, short_val + ("ef" if pattern_first else ""), long_val)
        if pattern_first:
            for f in _values(opts, "-f", "--file"):
                a.read(f, name)
            if not _has(opts, "-e", "-f", "--regexp", "--file") and paths:
                paths = paths[1:]
        subtree = recursive == "always" or bool(
            recursive and (_has(opts, *("-" + c for c in recursive))
                           or _has(opts, "--recursive", "--dereference-recursive")))
        if not paths and (default_cwd or subtree):
            paths = ["."]  # `ls`, `du`, `grep -r` default to the cwd
        for p in paths:
            a.read(p, name, subtree)
        return True

    return handler


for _names, _handler in [
    ("cat tac less more nl strings file md5sum sha1sum sha256sum sha512sum b2sum cksum "
     "readlink realpath cmp comm paste fold fmt rev", _reader()),
    ("head tail", _reader("nc", ("--lines", "--bytes"))),
    ("wc", _reader()),
    ("stat", _reader("c", ("--format", "--printf"))),
    ("od hexdump", _reader("AjNtns", ())),
    ("base64", _reader("w", ("--wrap",))),
    ("cut", _reader("bcdf", ("--delimiter", "--fields", "--bytes", "--characters"))),
    ("column", _reader("cstoNRWEHO", ())),
    ("grep egrep fgrep", _reader("ABCDdm", ("--regexp", "--file", "--max-count", "--label",
                                            "--context", "--after-context", "--before-context"),
                                 recursive="rR", pattern_first=True)),
    ("ls", _reader("ITw", ("--ignore", "--width", "--tabsize", "--hide"), default_cwd=True,
                   recursive="R")),
    ("du", _reader("dBt", ("--max-depth", "--block-size", "--threshold", "--exclude"),
                   default_cwd=True, recursive="always")),
    ("diff", _reader("CUxXIFL", ("--label", "--exclude", "--exclude-from", "--unified",
                                 "--context"), recursive="r")),
]:
    _command(*_names.split())(_handler)


@_command("rg", "ag")
def _rg(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "efgtTmABCjMErd", (
        "--regexp", "--file", "--glob", "--iglob", "--type", "--type-not", "--max-count",
        "--context", "--after-context", "--before-context", "--threads", "--replace",
        "--max-depth", "--encoding", "--ignore-file", "--type-add", "--pre", "--pre-glob",
        "--sort", "--sortr", "--max-columns", "--max-filesize", "--color", "--colors"))
    if _has(opts, "--pre"):
        a.opaque("rg --pre")
    for f in _values(opts, "-f", "--file"):
        a.read(f, name)
    if not _has(opts, "-e", "-f", "--regexp", "--file", "--files", "--type-list") and pos:
        pos = pos[1:]
    for p in pos or ["."]:
        a.read(p, name, subtree=True)
    return True


@_command("sort")
def _sort(a: _Analyzer, name: str, args: Args) -> bool:
    opts, paths = _options(args, "kotTS", ("--key", "--output", "--field-separator",
                                           "--temporary-directory", "--buffer-size",
                                           "--files0-from"))
    for p in paths:
        a.read(p, name)
    for f in _values(opts, "--files0-from"):
        a.read(f, name)
    for out in _values(opts, "-o", "--output"):
        a.write(out, name)
    return True


@_command("uniq", "xxd")
def _in_out(a: _Analyzer, name: str, args: Args) -> bool:
    _, paths = _options(args, "fswcgloOs" if name == "xxd" else "fsw",
                        ("--skip-fields", "--skip-chars", "--check-chars"))
    if paths:
        a.read(paths[0], name)
    if len(paths) > 1:
        a.write(paths[1], name)
    return True


@_command("jq")
def _jq(a: _Analyzer, name: str, args: Args) -> bool:
    rest: Args = []
    filter_seen = False
    it = iter(args)
    for arg in it:
        if arg in ("--arg", "--argjson"):
            next(it, None)
            next(it, None)
        elif arg in ("--slurpfile", "--rawfile"):
            next(it, None)
            a.read(next(it, None), name)
        elif arg in ("-f", "--from-file"):
            a.read(next(it, None), name)
            filter_seen = True
        elif arg in ("--indent", "--tab", "-L"):
            if arg != "--tab":
                next(it, None)
        elif arg is not None and arg.startswith("-") and arg != "-":
            continue
        elif not filter_seen:
            filter_seen = True
        else:
            rest.append(arg)
    for p in rest:
        a.read(p, name)
    return True


@_command("find")
def _find(a: _Analyzer, name: str, args: Args) -> bool:
    i = 0
    while i < len(args) and args[i] in ("-H", "-L", "-P"):
        i += 1
    starts: Args = []
    while i < len(args) and (args[i] is None or not (args[i].startswith(("-", "(", "!", ")")))):
        starts.append(args[i])
        i += 1
    starts = starts or ["."]
    expr = args[i:]
    for s in starts:
        a.read(s, name, subtree=True)
    read_only = True
    j = 0
    while j < len(expr):
        tok = expr[j]
        if tok in ("-exec", "-execdir", "-ok", "-okdir"):
            a.opaque("find -exec")
            if j + 1 < len(expr) and expr[j + 1] is not None:
                a.add("proc_spawn", expr[j + 1])  # type: ignore[arg-type]
            read_only = False
        elif tok == "-delete":
            for s in starts:
                a.delete(s, name, subtree=True)
        elif tok in ("-fprint", "-fprint0", "-fls", "-fprintf") and j + 1 < len(expr):
            a.write(expr[j + 1], name)
        j += 1
    return read_only


@_command("cp", "install")
def _cp(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "tSmogT" if name == "install" else "tS",
                         ("--target-directory", "--suffix", "--mode", "--owner", "--group"))
    if name == "install" and _has(opts, "-d", "--directory"):
        for p in pos:
            a.write(p, name)
        return True
    rec = _has(opts, "-r", "-R", "-a", "--recursive", "--archive")
    target = _values(opts, "-t", "--target-directory")
    if target:
        srcs, dest, into = pos, target[-1], True
    elif len(pos) >= 2:
        srcs, dest = pos[:-1], pos[-1]
        into = len(srcs) > 1 or (dest or "").endswith("/")
    else:
        return True
    for s in srcs:
        a.read(s, name, rec)
        if into and s is not None and dest is not None and not rec:
            a.write(posixpath.join(dest, posixpath.basename(s.rstrip("/"))), name)
    if rec or not into:
        a.write(dest, name, rec)
    elif dest is None or any(s is None for s in srcs):
        a.write(None, name)
    return True


@_command("mv")
def _mv(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "tS", ("--target-directory", "--suffix"))
    target = _values(opts, "-t", "--target-directory")
    if target:
        srcs, dest = pos, target[-1]
    elif len(pos) >= 2:
        srcs, dest = pos[:-1], pos[-1]
    else:
        return True
    for s in srcs:
        a.delete(s, name)
    a.write(dest, name)
    return True


@_command("rm", "rmdir", "unlink", "shred")
def _rm(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "ns" if name == "shred" else "", ("--iterations", "--size"))
    rec = _has(opts, "-r", "-R", "--recursive")
    for p in pos:
        if name == "shred" and not _has(opts, "-u", "--remove"):
            a.write(p, name, destroys="overwrites content")
        else:
            a.delete(p, name, rec)
    return True


@_command("mkdir", "touch", "tee", "truncate")
def _writer(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, {"mkdir": "m", "touch": "dtr", "truncate": "sr"}.get(name, ""),
                         ("--mode", "--date", "--reference", "--size"))
    for ref in _values(opts, "-r", "--reference"):
        a.read(ref, name)
    for p in pos:
        a.write(p, name)
    return True


@_command("chmod", "chown", "chgrp")
def _chmod(a: _Analyzer, name: str, args: Args) -> bool:
    flags = [x for x in args if x is not None and re.fullmatch(r"-[cfvRhHLP]+|--\w[\w-]*(=.*)?",
                                                            x)]
    pos = [x for x in args if x not in flags]
    rec = any("R" in f for f in flags if not f.startswith("--")) or "--recursive" in flags
    if not any(f.startswith("--reference") for f in flags):
        pos = pos[1:]  # the mode / owner operand
    for p in pos:
        a.write(p, name, rec)
    return True


@_command("ln")
def _ln(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "tS", ("--target-directory", "--suffix"))
    target = _values(opts, "-t", "--target-directory")
    if target:
        for p in pos:
            a.write(None if p is None or target[-1] is None
                    else posixpath.join(target[-1], posixpath.basename(p)), name)
    elif len(pos) == 1:
        a.write(None if pos[0] is None else posixpath.basename(pos[0].rstrip("/")), name)
    elif pos:
        a.write(pos[-1], name)
    return True


@_command("sed")
def _sed(a: _Analyzer, name: str, args: Args) -> bool:
    in_place = False
    scripts = False
    rest: Args = []
    it = iter(args)
    for arg in it:
        if arg is None or not arg.startswith("-") or arg == "-":
            rest.append(arg)
        elif arg in ("-e", "--expression", "-l", "--line-length"):
            scripts |= arg in ("-e", "--expression")
            next(it, None)
        elif arg in ("-f", "--file"):
            scripts = True
            a.read(next(it, None), name)
        elif arg.startswith("--in-place") or (not arg.startswith("--") and "i" in arg):
            in_place = True
            scripts |= not arg.startswith("--") and "e" in arg.split("i")[0]
        elif arg.startswith(("--expression=", "--file=")):
            scripts = True
    files = rest if scripts else rest[1:]
    for f in files:
        a.read(f, name)
        if in_place:
            a.write(f, name)
    return False


@_command("awk", "gawk", "mawk")
def _awk(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "fvF", ("--file", "--assign", "--field-separator"))
    progs = _values(opts, "-f", "--file")
    for f in progs:
        a.read(f, name)
    for p in pos if progs else pos[1:]:
        if p is None or "=" not in p:
            a.read(p, name)
    return False


@_command("dd")
def _dd(a: _Analyzer, name: str, args: Args) -> bool:
    for arg in args:
        if arg is None:
            a.opaque("dynamic dd operand")
        elif arg.startswith("if="):
            a.read(arg[3:], name)
        elif arg.startswith("of="):
            a.write(arg[3:], name)
    return True


@_command("tar")
def _tar(a: _Analyzer, name: str, args: Args) -> bool:
    if args and args[0] is not None and not args[0].startswith("-"):
        args = ["-" + args[0], *args[1:]]  # old-style bundled modes: `tar xzf a.tgz`
    opts, pos = _options(args, "fCTXbHKLNgV", ("--file", "--directory", "--files-from",
                                                "--exclude-from", "--exclude"))
    archive = (_values(opts, "-f", "--file") or ["-"])[-1]
    where = (_values(opts, "-C", "--directory") or ["."])[-1]
    if _has(opts, "-x", "--extract", "--get"):
        a.read(archive, name)
        a.write(where, name, subtree=True)
    elif _has(opts, "-c", "--create", "-r", "--append", "-u", "--update"):
        base = a.path(where, name)
        for p in pos:
            a.read(p if p is None or base is None else posixpath.join(base, p), name, True)
            if _has(opts, "--remove-files"):
                a.delete(p if p is None or base is None else posixpath.join(base, p), name, True)
        a.write(archive, name)
    else:  # --list and friends
        a.read(archive, name)
    return True


@_command("unzip")
def _unzip(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "dxP")
    if pos:
        a.read(pos[0], name)
    if _has(opts, "-l", "-v", "-t", "-Z"):
        return True
    a.write((_values(opts, "-d") or ["."])[-1], name, subtree=True)
    return True


@_command("zip")
def _zip(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "xibntP")
    rec = _has(opts, "-r", "-R")
    if pos:
        a.write(pos[0], name)
    for p in pos[1:]:
        a.read(p, name, rec)
        if _has(opts, "-m"):
            a.delete(p, name, rec)
    return True


@_command("gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "zstd", "unzstd")
def _compress(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "S", ("--suffix",))
    to_stdout = _has(opts, "-c", "--stdout", "-l", "--list", "-t", "--test")
    decompress = name.startswith("un") or _has(opts, "-d", "--decompress")
    ext = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zstd": ".zst"}.get(
        name.removeprefix("un").replace("gunzip", "gzip").replace("bunzip2", "bzip2"), ".gz")
    for p in pos:
        a.read(p, name)
        if to_stdout or p is None:
            continue
        a.write(p[: -len(ext)] if decompress and p.endswith(ext) else p + ext, name)
        if not _has(opts, "-k", "--keep") and name not in ("zstd", "unzstd"):
            a.delete(p, name)
    return to_stdout


# network


@_command("curl")
def _curl(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "oDdXTFHuUAebcKxyYzmwrECtQ", (
        "--output", "--dump-header", "--data", "--data-binary", "--data-raw", "--data-ascii",
        "--data-urlencode", "--json", "--form", "--form-string", "--request",
        "--upload-file", "--header", "--user", "--proxy-user", "--user-agent", "--referer",
        "--cookie", "--cookie-jar", "--config", "--proxy", "--max-time", "--connect-timeout",
        "--retry", "--write-out", "--range", "--cacert", "--cert", "--key", "--url",
        "--output-dir", "--resolve", "--connect-to", "--netrc-file", "--limit-rate"))
    urls = pos + _values(opts, "--url")
    method = (_values(opts, "-X", "--request") or ["GET"])[-1]
    uploads = _values(opts, "-T", "--upload-file")
    bodies = _values(opts, "-d", "--data", "--data-binary", "--data-raw", "--data-ascii",
                     "--data-urlencode", "--json", "-F", "--form", "--form-string")
    writes = bool(uploads or bodies) or (method or "").upper() not in ("GET", "HEAD")
    if _has(opts, "-K", "--config"):
        a.opaque("curl config file")
    for body in bodies:
        if body is not None and "@" in body:
            a.read(body.split("@", 1)[1].split(";")[0], name)
    for f in uploads + _values(opts, "--cacert", "--cert", "--key", "-E", "--netrc-file"):
        a.read(f, name)
    for f in _values(opts, "-D", "--dump-header", "-c", "--cookie-jar"):
        a.write(f, name)
    for f in _values(opts, "-b", "--cookie"):
        if f is None or "=" not in f:
            a.read(f, name)
    for proxy in _values(opts, "-x", "--proxy"):
        a.url(proxy, name)
    out_dir = (_values(opts, "--output-dir") or ["."])[-1]
    for u in urls:
        a.url(u, name, write=f"{name} {method if writes else ''}".strip() if writes else None)
    for out in _values(opts, "-o", "--output"):
        a.write(out if out is None or out.startswith("/") or out_dir is None
                else posixpath.join(out_dir, out), name)
    if _has(opts, "-O", "--remote-name", "--remote-name-all"):
        for u in urls:
            base = None if u is None else posixpath.basename(urlsplit(u).path) or None
            a.write(None if base is None or out_dir is None else posixpath.join(out_dir, base),
                    name)
    return False


@_command("wget")
def _wget(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "OoaPiUteTwlQADRIXe", (
        "--output-document", "--output-file", "--append-output", "--directory-prefix",
        "--input-file", "--user-agent", "--header", "--post-data", "--post-file",
        "--method", "--body-data", "--body-file", "--user", "--password", "--tries",
        "--timeout", "--wait", "--level", "--quota", "--accept", "--reject", "--domains"))
    if _has(opts, "-e", "--execute"):
        a.opaque("wget -e")
    for f in _values(opts, "-i", "--input-file"):
        a.read(f, name)
        a.opaque("URLs from a file: wget -i")
    for f in _values(opts, "--post-file", "--body-file"):
        a.read(f, name)
    method = (_values(opts, "--method") or ["GET"])[-1] or "?"
    writes = _has(opts, "--post-data", "--post-file", "--body-data", "--body-file") or \
        method.upper() not in ("GET", "HEAD")
    for u in pos:
        a.url(u, name, write="wget with a body" if writes else None)
    for f in _values(opts, "-o", "--output-file", "-a", "--append-output"):
        a.write(f, name)
    prefix = (_values(opts, "-P", "--directory-prefix") or ["."])[-1]
    outs = _values(opts, "-O", "--output-document")
    if outs:
        for f in outs:
            a.write(f, name)
    elif _has(opts, "-r", "--recursive", "-m", "--mirror"):
        a.write(prefix, name, subtree=True)
    else:
        for u in pos:
            base = None if u is None or prefix is None else (
                posixpath.basename(urlsplit(u if "://" in u else "http://" + u).path)
                or "index.html")
            a.write(None if base is None else posixpath.join(prefix, base), name)
    return False


@_command("ssh")
def _ssh(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "bcDEeFiIJlLmOopQRSwW", stop_at_positional=True)
    port = (_values(opts, "-p") or ["22"])[-1] or "*"
    for o in _values(opts, "-o"):
        if o is not None and o.lower().startswith(("proxycommand", "localcommand")):
            a.opaque("ssh -o ProxyCommand")
        elif o is not None and o.lower().startswith("port="):
            port = o.split("=", 1)[1]
    for f in _values(opts, "-i", "-F"):
        a.read(f, name)
    for jump in _values(opts, "-J"):
        for hop in (jump or "*").split(","):
            hp = _host_port(hop if "://" in hop else f"ssh://{hop}")
            a.net(*(hp or ("*", "*")))
    if not pos:
        return False
    dest = pos[0]
    if dest is None:
        a.opaque("dynamic ssh destination")
        return False
    hp = _host_port(dest if "://" in dest else f"ssh://{dest}")
    host, dport = hp or ("*", "*")
    a.net(host, port if dport in ("22", "*") else dport,
          write="ssh remote command" if len(pos) > 1 else None)
    return False


def _remote_spec(arg: str | None) -> tuple[str, str, str] | None:
    """(host, port, path) for scp/rsync remote operands; None for local paths."""
    if arg is None:
        return None
    if arg.startswith(("scp://", "rsync://", "ssh://")):
        hp = _host_port(arg) or ("*", "*")
        return hp[0], hp[1], urlsplit(arg).path
    m = re.match(r"^(?:[^@/:]+@)?(\[[^\]]+\]|[^:/]+)(::?)(.*)$", arg)
    if not m:
        return None
    return m.group(1).strip("[]").lower(), "873" if m.group(2) == "::" else "22", m.group(3)


@_command("scp", "rsync")
def _copy_remote(a: _Analyzer, name: str, args: Args) -> bool:
    if name == "scp":
        opts, pos = _options(args, "cFiJloPSX")
        port = (_values(opts, "-P") or ["22"])[-1] or "*"
        rec = _has(opts, "-r")
        if _has(opts, "-S"):
            a.opaque("scp -S program")
    else:
        opts, pos = _options(args, "efTB", (
            "--rsh", "--exclude", "--include", "--filter", "--exclude-from", "--include-from",
            "--files-from", "--port", "--temp-dir", "--backup-dir", "--log-file",
            "--password-file", "--chmod", "--max-size", "--min-size", "--timeout"))
        port = (_values(opts, "--port") or ["22"])[-1] or "*"
        rec = _has(opts, "-r", "-a", "--recursive", "--archive")
        for rsh in _values(opts, "-e", "--rsh"):
            if rsh is None or rsh.split()[0:1] != ["ssh"]:
                a.opaque("rsync -e program")
    if len(pos) < 2:
        return False
    *srcs, dest = pos
    deletes = any(o.startswith("--delete") or o == "--remove-source-files" for o, _ in opts)
    for s in srcs:
        remote = _remote_spec(s)
        if remote:
            a.net(remote[0], port if remote[1] == "22" else remote[1])
        else:
            a.read(s, name, rec)
            if _has(opts, "--remove-source-files"):
                a.delete(s, name, rec)
    remote = _remote_spec(dest)
    if remote:
        a.net(remote[0], port if remote[1] == "22" else remote[1], write=f"{name} to a remote")
    else:
        a.write(dest, name, rec)
        if deletes:
            a.delete(dest, name, subtree=True)
    return False


_PIP_READ = frozenset({"list", "show", "freeze", "check", "help", "search", "config", "debug",
                       "inspect", "hash", "cache"})


@_command("pip", "pip3")
def _pip(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "rcetiC", ("--requirement", "--constraint", "--editable",
                                          "--target", "--index-url", "--extra-index-url",
                                          "--python", "--root", "--prefix"))
    sub = pos[0] if pos else None
    if sub in _PIP_READ or _has(opts, "--version", "-V", "-h", "--help"):
        return True
    if sub in ("install", "download", "wheel"):
        for f in _values(opts, "-r", "--requirement", "-c", "--constraint"):
            a.read(f, name)
        for f in _values(opts, "-e", "--editable") + [p for p in pos[1:]
                                                      if p is None or p.startswith((".", "/"))]:
            a.read(f, name, subtree=True)
        if not _has(opts, "--no-index"):
            indexes = _values(opts, "-i", "--index-url")
            if not indexes:
                a.net("pypi.org", "443")
                a.net("files.pythonhosted.org", "443")
            for u in indexes + _values(opts, "--extra-index-url"):
                a.url(u, name)
        for t in _values(opts, "-t", "--target"):
            a.write(t, name, subtree=True)
    elif sub is None:
        a.opaque("dynamic pip subcommand")
    return False


_NPM_NET = frozenset({"install", "i", "ci", "add", "update", "up", "upgrade", "install-test",
                      "it", "audit", "outdated", "view", "info", "show", "search", "dlx",
                      "exec", "x"})


@_command("npm", "npx", "yarn", "pnpm")
def _npm(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "C", ("--registry", "--prefix", "--cwd", "--dir"))
    sub = "exec" if name == "npx" else (pos[0] if pos else ("install" if name == "yarn"
                                                             else None))
    registries = _values(opts, "--registry")
    if sub == "publish":
        for r in registries or ["https://registry.npmjs.org"]:
            a.url(r, name, write=f"{name} publish")
        return False
    if sub in _NPM_NET:
        for r in registries:
            a.url(r, name)
        if not registries:
            a.net("registry.yarnpkg.com" if name == "yarn" else "registry.npmjs.org", "443")
        if name != "npx" and sub not in ("view", "info", "show", "search", "outdated", "audit",
                                         "exec", "x", "dlx"):
            a.write("node_modules", name, subtree=True)
    elif sub in ("uninstall", "remove", "rm", "un", "prune"):
        a.write("node_modules", name, subtree=True)
    return sub in ("ls", "list", "view", "info", "show", "outdated", "help", "--version", "-v")


@_command("python", "python3")
def _python(a: _Analyzer, name: str, args: Args) -> bool:
    if len(args) >= 2 and args[0] == "-m" and args[1] in ("pip", "pip3"):
        return _pip(a, "pip", args[2:])
    return False


# git

_GIT_READ = _words(
    "status log diff show blame grep ls-files ls-tree rev-parse rev-list describe shortlog "
    "cat-file for-each-ref show-ref merge-base name-rev count-objects var help version "
    "whatchanged check-ignore check-attr diff-tree diff-files diff-index range-diff "
    "annotate show-branch cherry")
_GIT_WRITE = _words(
    "add commit checkout switch merge rebase mv stash tag branch init am apply cherry-pick "
    "revert config remote worktree submodule notes gc prune repack bisect format-patch "
    "update-index update-ref symbolic-ref reflog replace sparse-checkout maintenance "
    "restore reset clean rm")
_GIT_NET = frozenset({"clone", "fetch", "pull", "push", "ls-remote"})
_GIT_RISKY_CONFIG = re.compile(r"(pager|sshcommand|editor|^alias\.|helper|external|fsmonitor|"
                               r"hookspath|askpass|textconv|program|gitproxy|uploadpack|"
                               r"receivepack|proxycommand)", re.I)


def _git_is_read(sub: str, rest: Args) -> bool:
    if sub in _GIT_READ:
        return True
    flags = {x for x in rest if x is not None and x.startswith("-")}
    words = [x for x in rest if x is None or not x.startswith("-")]
    if sub == "branch":
        return not words and not flags & {"-d", "-D", "-m", "-M", "-c", "-C", "--delete",
                                          "--move", "--copy", "-u", "--set-upstream-to",
                                          "--unset-upstream", "--edit-description"}
    if sub == "tag":
        return not words or bool(flags & {"-l", "--list"})
    if sub in ("stash", "worktree", "remote", "notes", "submodule"):
        # Bare `git stash` pushes (a write); the others list.
        return (not words and sub != "stash") or (
            bool(words) and words[0] in ("list", "show", "get-url", "status"))
    if sub == "config":
        return bool(flags & {"--get", "--get-all", "--get-regexp", "--list", "-l"}) or (
            len(words) == 1 and not flags & {"--unset", "--unset-all", "--add"})
    if sub == "reflog":
        return not words or words[0] == "show"
    return False


def _git_discards(sub: str, rest: Args) -> str | None:
    """Why a git subcommand destroys uncommitted work, if it does."""
    flags = {x for x in rest if x is not None and x.startswith("-")}
    if sub == "reset" and "--hard" in flags:
        return "git reset --hard"
    if sub == "checkout" and (flags & {"-f", "--force"} or "--" in rest or "." in rest):
        return "git checkout discards changes"
    if sub == "restore" and (flags & {"--worktree", "-W"} or not flags & {"--staged", "-S"}):
        return "git restore discards changes"
    if sub == "stash" and any(w in ("drop", "clear") for w in rest):
        return "git stash drop"
    if sub == "branch" and "-D" in flags:
        return "git branch -D"
    return None


@_command("git")
def _git(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "Cc", ("--git-dir", "--work-tree", "--namespace",
                                      "--exec-path", "--config-env"), stop_at_positional=True)
    for kv in _values(opts, "-c", "--config-env"):
        if kv is None or _GIT_RISKY_CONFIG.search(kv.split("=", 1)[0]):
            a.opaque("git -c may run a program")
    repo: str | None = "."
    for d in _values(opts, "-C"):
        repo = None if d is None or repo is None else posixpath.join(repo, d)
    for d in _values(opts, "--work-tree"):
        repo = d
    if not pos:
        return True
    sub, rest = pos[0], pos[1:]
    if sub is None:
        a.opaque("dynamic git subcommand")
        return False
    if _git_is_read(sub, rest):
        a.read(repo, name, subtree=True)
        return True
    if sub in _GIT_NET:
        return _git_net(a, name, sub, rest, repo)
    if sub not in _GIT_WRITE:
        a.opaque(f"unknown git subcommand or alias: {sub}")
        return False
    if sub in ("clean", "rm"):
        sub_opts, paths = _options(rest, "e", ("--exclude",))
        if sub == "clean" and _has(sub_opts, "-n", "--dry-run"):
            a.read(repo, name, subtree=True)
            return True
        base = a.path(repo, name)
        for p in (paths or ["."]) if sub == "clean" else paths:
            full = p if p is None or base is None else posixpath.join(base, p)
            a.delete(full, name, subtree=sub == "clean" or _has(sub_opts, "-r"))
        return False
    a.write(repo, name, subtree=True, destroys=_git_discards(sub, rest))
    return False


def _git_net(a: _Analyzer, name: str, sub: str, rest: Args, repo: str | None) -> bool:
    opts, pos = _options(rest, "bojcuX" if sub != "push" else "o", (
        "--branch", "--origin", "--depth", "--config", "--reference", "--separate-git-dir",
        "--upload-pack", "--receive-pack", "--template", "--jobs", "--filter",
        "--shallow-since", "--shallow-exclude", "--push-option", "--repo", "--strategy",
        "--strategy-option"))
    remote = pos[0] if pos else None
    write = "git push" if sub == "push" else None
    if remote is None and not pos and sub != "clone":
        a.net("*", "*", write=write)
        a.bump(1, f"git {sub}: remote is not a literal URL")
    elif remote is None:
        a.opaque(f"dynamic git remote: git {sub}")
    else:
        hp = _host_port(remote, None)
        if hp is not None:
            a.net(*hp, write=write)
        elif remote.startswith(("/", ".", "~")) or sub == "clone":
            a.read(remote, name, subtree=True)
        else:  # a remote name such as `origin`: its URL lives in .git/config
            a.net("*", "*", write=write)
            a.bump(1, f"git {sub}: remote {remote!r} is not a literal URL")
    if sub == "clone" and remote is not None:
        dest = pos[1] if len(pos) > 1 else posixpath.basename(
            remote.rstrip("/").split(":")[-1]).removesuffix(".git")
        base = a.path(repo, name)
        a.write(dest if dest is None or base is None else posixpath.join(base, dest), name,
                subtree=True)
    elif sub == "fetch":
        a.write(None if repo is None else posixpath.join(repo, ".git"), name, subtree=True)
    elif sub == "pull":
        a.write(repo, name, subtree=True)
    return False


# shell state, wrappers and interpreters


@_command("cd", "pushd", "popd")
def _cd(a: _Analyzer, name: str, args: Args) -> bool:
    a.add("session_write", "cwd", 1)
    _, pos = _options(args)
    target = pos[0] if pos else (a.home if name == "cd" else None)
    if name == "popd" or target is None or target.startswith(("-", "+")) or (
            not target.startswith("/") and a.cwd is None):
        a.cwd = None
        return True
    a.cwd = posixpath.normpath(posixpath.join(a.cwd or "/", target))
    return True


@_command("read", "mapfile", "readarray")
def _read_builtin(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "adinNptuCcsO" if name == "read" else "dnOsuCc")
    for v in _values(opts, "-a") + pos:
        if v is not None:
            a.assigned.add(v)
    return True


@_command("printf")
def _printf(a: _Analyzer, name: str, args: Args) -> bool:
    if len(args) >= 2 and args[0] == "-v" and args[1] is not None:
        a.assigned.add(args[1])
    return True


@_command("set")
def _set(a: _Analyzer, name: str, args: Args) -> bool:
    if not args:
        a.env_read("*")
    return True


@_command("printenv")
def _printenv(a: _Analyzer, name: str, args: Args) -> bool:
    _, pos = _options(args)
    for v in pos or ["*"]:
        if v is None:
            a.opaque("dynamic variable name: printenv")
        else:
            a.env_read(v)
    return True


def _wrapped(a: _Analyzer, wrapper: str, argv: Args) -> bool:
    """Analyse the command a wrapper runs; the wrapper itself is harmless."""
    if not argv:
        return True
    if argv[0] is None:
        a.opaque(f"dynamic command after {wrapper}")
        return False
    a.run(argv)
    return True


@_command("sudo", "doas")
def _sudo(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "ugpCDhrtUTRa", ("--user", "--group", "--prompt",
                                                "--chdir", "--host", "--role", "--type"),
                         stop_at_positional=True)
    if _has(opts, "-e", "--edit"):
        for p in pos:
            a.write(p, name)
        return False
    if _has(opts, "-s", "-i", "--shell", "--login") and not pos:
        a.opaque(f"interactive shell: {name}")
        return False
    while pos and pos[0] is not None and "=" in pos[0] and _IDENT.fullmatch(pos[0].split("=")[0]):
        a.env_write(pos.pop(0).split("=")[0], persistent=False)  # type: ignore[union-attr]
    return _wrapped(a, name, pos)


@_command("env")
def _env(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "uCS", ("--unset", "--chdir", "--split-string"),
                         stop_at_positional=True)
    if _has(opts, "-S", "--split-string"):
        a.opaque("env -S")
        return False
    for v in _values(opts, "-u", "--unset"):
        a.env_write(v or "*", persistent=False)
    while pos and pos[0] is not None and "=" in pos[0]:
        a.env_write(pos.pop(0).split("=")[0], persistent=False)  # type: ignore[union-attr]
    if not pos:
        a.env_read("*")
        return True
    chdir = _values(opts, "-C", "--chdir")
    if chdir:
        saved = a.cwd
        a.cwd = None if chdir[-1] is None or a.cwd is None else posixpath.join(a.cwd, chdir[-1])
        try:
            return _wrapped(a, name, pos)
        finally:
            a.cwd = saved
    return _wrapped(a, name, pos)


@_command("nice", "time", "nohup", "timeout", "stdbuf", "ionice", "setsid", "exec", "command",
          "builtin", "chronic", "caffeinate")
def _wrapper(a: _Analyzer, name: str, args: Args) -> bool:
    short = {"nice": "n", "time": "fo", "timeout": "sk", "stdbuf": "ioe", "ionice": "cnp",
             "exec": "a"}.get(name, "")
    opts, pos = _options(args, short, ("--adjustment", "--signal", "--kill-after", "--input",
                                       "--output", "--error", "--format"),
                         stop_at_positional=True)
    if name == "command" and _has(opts, "-v", "-V"):
        return True
    for f in _values(opts, "-o", "--output") if name == "time" else []:
        a.write(f, name)
    if name == "timeout" and pos:
        pos = pos[1:]  # the duration
    return _wrapped(a, name, pos)


@_command("xargs", "parallel")
def _xargs(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "adEeIiLlnPs", ("--arg-file", "--delimiter", "--max-args",
                                               "--max-procs", "--replace"),
                         stop_at_positional=True)
    for f in _values(opts, "-a", "--arg-file"):
        a.read(f, name)
    a.opaque(name)
    if pos and pos[0] is not None:
        a.add("proc_spawn", pos[0])
    return False


@_command("eval", "trap", "watch", "source", ".")
def _eval(a: _Analyzer, name: str, args: Args) -> bool:
    if name in ("source", ".") and args:
        a.read(args[0], name)
    a.opaque(name)
    return False


@_command("bash", "sh", "zsh", "dash", "ksh", "fish", "busybox")
def _shell(a: _Analyzer, name: str, args: Args) -> bool:
    opts, pos = _options(args, "oO", stop_at_positional=True)
    if _has(opts, "-c"):
        a.opaque(f"{name} -c")
    elif pos:
        a.read(pos[0], name)
        a.opaque(f"{name} script")
    else:
        a.opaque(f"{name} reading a script from stdin")
    return False
