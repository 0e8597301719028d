"""Effects of a bash source, derived statically with tree-sitter-bash.

For users: docs/decisions.md, Effects and policy; the exact rules follow.

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
are shell variables that do not persist (docs/decisions.md, Exec); reads of variables the script
assigned itself are not ``env_read``.

Layout: this module owns the public API (``parse_summary``, ``analyze``, ``Analysis``)
and the syntax-tree walk (statements, words, redirects, cwd scoping); ``commands`` (with
``netcommands``) knows what each program does; ``bashstate.Recorder`` is the effect set
and shell state both record into; ``bashargs`` parses argv options and URLs.
"""

from __future__ import annotations

import copy
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import bracex
import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from ...protocol.lru import Lru
from ..config.limits import ANALYSIS_CACHE_ENTRIES, ANALYSIS_CACHE_SRC_MAX
from .args import Args, wordset
from .commands import SHELL_BUILTINS, run
from .state import (
    CONDITIONAL,
    IRREVERSIBLE,
    LEVELS,
    MAX_EFFECTS,
    MAX_LIST,
    REVERSIBLE,
    Handler,
    Recorder,
)

__all__ = [
    "CONDITIONAL",
    "IRREVERSIBLE",
    "MAX_BRACE",
    "MAX_DEPTH",
    "MAX_EFFECTS",
    "MAX_LIST",
    "REVERSIBLE",
    "SHELL_BUILTINS",
    "Analysis",
    "Args",
    "Handler",
    "analyze",
    "parse_summary",
]

MAX_DEPTH = 64
"""Nesting deeper than this is opaque (keeps recursion far from Python's limit)."""
MAX_BRACE = 64

_STATEMENTS = wordset(
    "program redirected_statement variable_assignment variable_assignments command "
    "declaration_command unset_command test_command negated_command for_statement "
    "c_style_for_statement while_statement if_statement case_statement pipeline list "
    "subshell compound_statement function_definition comment ERROR"
)
_ENVISH = re.compile(r"[A-Z_][A-Z0-9_]*|(?:http|https|ftp|all|no)_proxy")

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
            return {
                "start": _point(src, n),
                "end": _point(src, n, True),
                "message": f"syntax error: missing {n.type!r}",
            }
        if n.is_error:
            near = src[n.start_byte : n.end_byte][:40].decode("utf-8", "replace")
            return {
                "start": _point(src, n),
                "end": _point(src, n, True),
                "message": f"syntax error near {near!r}",
            }
    if root.has_error:
        return {
            "start": _point(src, root),
            "end": _point(src, root, True),
            "message": "syntax error",
        }
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
                name = data[name_node.start_byte : name_node.end_byte].decode("utf-8", "replace")
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
        out: dict[str, Any] = {
            "effects": self.effects,
            "reversibility": self.reversibility,
            "parse_ok": self.parse_ok,
            "reasons": self.reasons,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


_recent: Lru[tuple[str, str, str | None], Analysis] = Lru(ANALYSIS_CACHE_ENTRIES)


def analyze(src: str, cwd: str, home: str | None = None) -> Analysis:
    """Effects and reversibility of ``src`` run in ``cwd`` (see the module docstring).

    A pure function of its arguments, so the last ``ANALYSIS_CACHE_ENTRIES`` answers
    (sources up to ``ANALYSIS_CACHE_SRC_MAX`` characters) are kept: agents repeat their
    commands, and the parse and walk were the largest part of the exec gate."""
    if len(src) > ANALYSIS_CACHE_SRC_MAX:
        return _analyze(src, cwd, home)
    key = (src, cwd, home)
    found = _recent.get(key)
    if found is None:
        found = _analyze(src, cwd, home)
        _recent.put(key, found)
    return _copy(found)


def _copy(analysis: Analysis) -> Analysis:
    """A caller's own copy: plans and journal rows keep (and may extend) these lists."""
    return Analysis(
        effects=[dict(e) for e in analysis.effects],
        reversibility=analysis.reversibility,
        parse_ok=analysis.parse_ok,
        error=copy.deepcopy(analysis.error),
        reasons=list(analysis.reasons),
    )


def _analyze(src: str, cwd: str, home: str | None) -> Analysis:
    data = _encode(src)
    root = _parser().parse(data).root_node
    a = _Analyzer(data, cwd, home)
    error = None
    if root.has_error:
        error = _first_error(data, root)
        a.opaque("parse error")
    a.visit(root)
    return Analysis(
        effects=[{"kind": k, "target": t} for k, t in a.effects],
        reversibility=LEVELS[a.level],
        parse_ok=not root.has_error,
        error=error,
        reasons=a.reasons,
    )


_ANSI_C = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", re.S)
_ANSI_MAP = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


def _ansi_c(body: str) -> str:
    def sub(m: re.Match[str]) -> str:
        s = m.group(1)
        if s[0] == "x":
            return chr(int(s[1:], 16))
        if s[0].isdigit():
            return chr(int(s, 8))
        return _ANSI_MAP.get(s, "\\" + s)

    return _ANSI_C.sub(sub, body)


# --- the tree walk --------------------------------------------------------------------


class _Analyzer(Recorder):
    """Walks the syntax tree's statements, recording what it finds (``Recorder``) as it
    goes; the values of words are ``_Words``'s."""

    def __init__(self, src: bytes, cwd: str, home: str | None) -> None:
        super().__init__(cwd, home)
        self.src = src
        self.depth = 0
        self.words = _Words(self)  # the static values of its words

    def text(self, node: Node) -> str:
        return self.src[node.start_byte : node.end_byte].decode("utf-8", "surrogateescape")

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
                values.extend(self.words.fields(child))
        self.assigned.add(name)
        # `for f in a b; do rm "$f"; done`: a literal list binds "$f" to its values.
        static = None not in values and 0 < len(values) <= MAX_BRACE
        saved = self.words.bindings.pop(name, None)
        if static:
            self.words.bindings[name] = [v for v in values if v is not None]
        try:
            with self.branch():
                for child in body:
                    self.visit(child)
        finally:
            self.words.bindings.pop(name, None)
            if saved is not None:
                self.words.bindings[name] = saved

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
            self.words.fields(value)
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
        flags = "".join(
            self.text(c)[1:]
            for c in node.named_children
            if c.type == "word" and self.text(c).startswith("-")
        )
        exported = keyword == "export" or "x" in flags
        names = [
            c for c in node.named_children if c.type in ("variable_assignment", "variable_name")
        ]
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

    # commands

    def command(self, node: Node, redirects: Sequence[Node] = ()) -> None:
        name_node = node.child_by_field_name("name")
        own_redirects = []
        for child in node.named_children:
            if child.type == "variable_assignment":
                self.assignment(child, "prefix" if name_node is not None else "bare")
            elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
                own_redirects.append(child)
        outer_subst = self.words.substituted  # we may be inside another command's $(...)
        if name_node is not None:
            self.words.substituted = False
            argv0 = self.words.fields(name_node)
            if self.words.substituted:
                self.opaque("command substitution in argv0")
            elif argv0[0] is None or len(argv0) != 1:
                self.opaque("dynamic argv0")
            self.words.substituted = False
            argv: Args = []
            for arg in node.children_by_field_name("argument"):
                argv.extend(self.words.fields(arg))
            if self.words.substituted:
                self.opaque("command substitution in argv")
            if argv0[0] is not None and len(argv0) == 1:
                run(self, [argv0[0], *argv])
        for r in [*own_redirects, *redirects]:
            self.redirect(r)
        self.words.substituted = outer_subst

    def redirect(self, node: Node) -> None:
        if node.type == "herestring_redirect":
            for c in node.named_children:
                self.words.fields(c)
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
        outer_subst, self.words.substituted = self.words.substituted, False
        values = self.words.fields(dest)
        if self.words.substituted:
            self.opaque("command substitution in redirect")
        self.words.substituted = outer_subst
        for value in values:
            if ">" in op:
                self.write(value, "redirect")
            else:
                self.read(value, "redirect")


class _Words:
    """Static values of one source's words: quoting, ``~``, brace expansion, ``$v`` of a
    loop over a literal list; what a word runs (``$(...)``, ``<(...)``) goes back to the
    statement walk it is part of."""

    def __init__(self, walk: _Analyzer) -> None:
        # A proxy, not a reference: the walk holds its _Words, and a cycle would keep a
        # whole source (up to 1 MiB) and its tree alive until the next full collection.
        self.walk = weakref.proxy(walk)
        self.bindings: dict[str, list[str]] = {}  # for-loop variables over literal lists
        self.substituted = False  # set while evaluating a word that holds $(...)

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
        if (
            node.type in ("word", "concatenation", "brace_expression")
            and "{" in value
            and not any(c.type in ("string", "raw_string") for c in node.named_children)
        ):
            try:
                return list(bracex.expand(value, limit=MAX_BRACE))
            except Exception:  # bracex raises on over-limit / malformed; keep the text
                return [value]
        return [value]

    def eval(self, node: Node, first: bool = False) -> str | None:
        t = node.type
        if t == "word":
            text = re.sub(r"\\(.)", r"\1", self.walk.text(node), flags=re.S)
            if first and text.startswith("~") and (len(text) == 1 or text[1] == "/"):
                if self.walk.home is None:
                    return None
                text = self.walk.home + text[1:]
            return text
        if t in ("number", "brace_expression", "heredoc_content"):
            return self.walk.text(node)
        if t == "raw_string":
            return self.walk.text(node)[1:-1]
        if t == "ansi_c_string":
            return _ansi_c(self.walk.text(node)[2:-1])
        if t in ("string", "translated_string", "concatenation"):
            parts: list[str | None] = []
            for i, c in enumerate(node.children):
                if c.type == "string_content":
                    parts.append(re.sub(r'\\([$`"\\\n])', r"\1", self.walk.text(c)))
                elif c.is_named:
                    parts.append(self.eval(c, first=first and i == 0 and t == "concatenation"))
            return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
        if t in ("simple_expansion", "expansion"):
            return self.expansion(node)
        if t == "command_substitution":
            with self.walk.subshell():
                self.walk.visit_children(node)
            self.substituted = True  # after the visit: nested commands reset the flag
            return None
        if t == "process_substitution":
            with self.walk.subshell():
                self.walk.visit_children(node)
            return "/dev/fd/63"
        self.walk.scan(node)
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
        return self.bindings.get(self.walk.text(inner))

    def expansion(self, node: Node) -> str | None:
        names = [c for c in node.named_children if c.type == "variable_name"]
        plain = len(node.named_children) == 1 and len(names) == 1
        self.walk.scan(node)
        if plain:
            name = self.walk.text(names[0])
            if name == "HOME" and self.walk.home and name not in self.walk.assigned:
                return self.walk.home
            if name == "PWD" and self.walk.cwd and name not in self.walk.assigned:
                return self.walk.cwd
        return None


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
