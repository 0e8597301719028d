"""The package layout rules, checked on the source so they stay true.

``protocol/`` imports nothing else of the package; ``tokens`` (the token file format the
CLI and the kernel share) imports only ``protocol``; ``facade``, ``cli`` and ``client``
never import ``kernel``; ``kernel`` never imports ``facade`` or ``cli``; ``kernel/``
holds subsystem packages plus its entry points. Every import counts: absolute, relative,
the lazy ones inside functions, ``importlib.import_module("...")`` with a literal name,
and the Python-level imports of ``src/_frame.pyx`` (built as part of ``protocol``).
Modules stay within ``MAX_LINES`` unless ``LONG_MODULES`` says why.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "shoal_mcp"
COMPILED = SRC / "_frame.pyx"
COMPILED_MODULE = "shoal_mcp.protocol.framing._frame"  # what setup.py builds it as

# area of the importing module -> ("only", allowed areas) or ("never", forbidden areas).
# An area is the first name under shoal_mcp: "protocol", "kernel", "client", ...
RULES: dict[str, tuple[str, frozenset[str]]] = {
    "protocol": ("only", frozenset({"protocol"})),
    "tokens": ("only", frozenset({"protocol"})),
    "facade": ("never", frozenset({"kernel"})),
    "cli": ("never", frozenset({"kernel"})),
    "client": ("never", frozenset({"kernel"})),
    "kernel": ("never", frozenset({"facade", "cli"})),
}

# Imports that break a rule today and are being removed by another part of the same
# change. An entry that no longer matches an import fails the test: delete it then.
PENDING: dict[tuple[str, str], str] = {}

KERNEL_ENTRY_POINTS = frozenset({"__init__.py", "__main__.py", "app.py"})

MAX_LINES = 600
LONG_MODULES: dict[str, str] = {
    "src/shoal_mcp/kernel/effects/analyzer.py": (
        "one recursive walk over the tree-sitter-bash tree (statements, words, redirects, "
        "cwd scoping) under a ~45-line docstring that states the effect and reversibility "
        "rules; per-program knowledge is already split out to commands/netcommands"
    ),
    "src/shoal_mcp/kernel/effects/commands.py": (
        "a table of ~35 short, independent per-program handlers (file and text tools, "
        "shell state, wrappers); network programs are already apart in netcommands.py, "
        "and splitting the rest would scatter one lookup table"
    ),
}


@dataclass(frozen=True)
class Import:
    file: str  # path from the repository root
    line: int
    statement: str  # as written (ast.unparse for Python, the line for the .pyx)
    target: str  # absolute dotted name of what it imports

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.statement}  (-> {self.target})"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def area(name: str) -> str | None:
    """``kernel`` for shoal_mcp.kernel.x.y, ``""`` for shoal_mcp itself, None outside."""
    parts = name.split(".")
    if parts[0] != "shoal_mcp":
        return None
    return parts[1] if len(parts) > 1 else ""


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module a ``from`` import names (``level`` leading dots)."""
    if not level:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 >= len(base):
        raise ValueError(f"relative import beyond the top level in {module}")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_in_source(source: str, module: str, is_package: bool, file: str) -> Iterator[Import]:
    """Every import statement anywhere in ``source`` (functions and classes included)."""
    for node in ast.walk(ast.parse(source, file)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(file, node.lineno, ast.unparse(node), alias.name)
        elif isinstance(node, ast.ImportFrom):
            source_module = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                # `from pkg import name` may import the submodule pkg.name.
                target = source_module if alias.name == "*" else f"{source_module}.{alias.name}"
                yield Import(file, node.lineno, ast.unparse(node), target)
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("import_module", "__import__")
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield Import(file, node.lineno, ast.unparse(node), node.args[0].value)


_PYX_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+(?!.*\bcimport\b)|import\s+([\w.]+))")


def imports_in_pyx(path: Path) -> Iterator[Import]:
    """Python-level imports of the Cython core (``cimport`` is C-level and skipped)."""
    file = str(path.relative_to(ROOT))
    for lineno, text in enumerate(path.read_text().splitlines(), 1):
        if "cimport" in text:
            continue
        m = _PYX_IMPORT.match(text)
        if m:
            yield Import(file, lineno, text.strip(), m.group(1) or m.group(2))


def python_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def all_imports() -> list[tuple[str, Import]]:
    """(area of the importing module, import) for every module of the package."""
    out = []
    for path in python_files():
        module = module_name(path)
        file = str(path.relative_to(ROOT))
        source = path.read_text()
        for imp in imports_in_source(source, module, path.name == "__init__.py", file):
            out.append((area(module), imp))
    out += [(area(COMPILED_MODULE), imp) for imp in imports_in_pyx(COMPILED)]
    return out


def breaks(rule: tuple[str, frozenset[str]], target_area: str | None) -> bool:
    if target_area is None:  # stdlib or third party
        return False
    kind, areas = rule
    return target_area not in areas if kind == "only" else target_area in areas


@pytest.mark.parametrize("importer", sorted(RULES))
def test_import_rule(importer: str) -> None:
    rule = RULES[importer]
    seen = [imp for who, imp in all_imports() if who == importer]
    assert seen, f"no imports found for {importer!r}: is the walk looking at {PACKAGE}?"
    bad = [imp for imp in seen if breaks(rule, area(imp.target))]
    offending = [imp for imp in bad if (imp.file, _module_of(imp.target)) not in PENDING]
    kind, areas = rule
    names = " or ".join(f"shoal_mcp.{a}" for a in sorted(areas))
    wording = f"may import nothing of the package but {names}"
    if kind == "never":
        wording = f"must never import {names}"
    assert not offending, f"shoal_mcp.{importer} {wording}; offending imports:\n" + "\n".join(
        f"  {imp}" for imp in offending
    )


def _module_of(target: str) -> str:
    """The importable module behind a target (drops a trailing attribute name)."""
    parts = target.split(".")
    while parts:
        candidate = SRC.joinpath(*parts)
        if candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return target


def test_pending_exceptions_still_exist() -> None:
    found = {(imp.file, _module_of(imp.target)) for _, imp in all_imports()}
    stale = [f"{file} -> {target}" for file, target in PENDING if (file, target) not in found]
    assert not stale, "PENDING lists imports that are gone; delete these entries:\n" + "\n".join(
        stale
    )


def test_kernel_shows_its_subsystems() -> None:
    kernel = PACKAGE / "kernel"
    loose = sorted(p.name for p in kernel.glob("*.py") if p.name not in KERNEL_ENTRY_POINTS)
    assert not loose, (
        f"kernel/ holds subsystem packages and only {sorted(KERNEL_ENTRY_POINTS)} as "
        f"modules; move these into a subsystem: {loose}"
    )
    folders = [p for p in kernel.iterdir() if p.is_dir() and p.name != "__pycache__"]
    not_packages = sorted(p.name for p in folders if not (p / "__init__.py").is_file())
    assert not not_packages, f"kernel/ folders without __init__.py: {not_packages}"
    assert len(folders) >= 2, folders


def test_modules_stay_short() -> None:
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in python_files()}
    too_long = [
        f"{file}: {n} lines"
        for file, n in sorted(lengths.items())
        if n > MAX_LINES and file not in LONG_MODULES
    ]
    assert not too_long, (
        f"modules over {MAX_LINES} lines (split them, or add them to LONG_MODULES with a "
        "reason):\n" + "\n".join(f"  {line}" for line in too_long)
    )
    stale = [f for f in LONG_MODULES if lengths.get(f, 0) <= MAX_LINES]
    assert not stale, f"LONG_MODULES entries no longer over {MAX_LINES} lines (delete): {stale}"
    assert all(why.strip() for why in LONG_MODULES.values())


# --- the checker itself --------------------------------------------------------------


LAZY_AND_RELATIVE = """
import os
from . import sibling
from .. import kernel
from ..protocol.errors import ErrorCode

def late():
    from ..kernel.values import elision
    import shoal_mcp.facade.server
    return importlib.import_module("shoal_mcp.cli.admin")
"""


def test_the_walk_finds_relative_lazy_and_dynamic_imports() -> None:
    found = imports_in_source(LAZY_AND_RELATIVE, "shoal_mcp.cli.admin", False, "x.py")
    assert [imp.target for imp in found] == [
        "os",
        "shoal_mcp.cli.sibling",
        "shoal_mcp.kernel",
        "shoal_mcp.protocol.errors.ErrorCode",
        "shoal_mcp.kernel.values.elision",
        "shoal_mcp.facade.server",
        "shoal_mcp.cli.admin",
    ]
    # In an __init__.py one dot is the package itself.
    (imp,) = imports_in_source("from .framing import x", "shoal_mcp.protocol", True, "p.py")
    assert imp.target == "shoal_mcp.protocol.framing.x"
    with pytest.raises(ValueError, match="beyond the top level"):
        list(imports_in_source("from ... import x", "shoal_mcp.cli.admin", False, "x.py"))


def test_a_broken_rule_names_the_file_and_the_import() -> None:
    source = "def f():\n    from ..kernel import app\n"
    file = "src/shoal_mcp/facade/server.py"
    (imp,) = imports_in_source(source, "shoal_mcp.facade.server", False, file)
    assert breaks(RULES["facade"], area(imp.target))
    assert str(imp) == f"{file}:2: from ..kernel import app  (-> shoal_mcp.kernel.app)"
    assert not breaks(RULES["protocol"], area("orjson"))
    assert breaks(RULES["protocol"], area("shoal_mcp"))  # even the root package
    assert not breaks(RULES["kernel"], area("shoal_mcp.tokens"))


def test_pyx_imports_are_read() -> None:
    targets = {imp.target for imp in imports_in_pyx(COMPILED)}
    assert "shoal_mcp.protocol.limits" in targets and "operator" in targets
    assert not any(t.startswith(("libc", "cpython", "posix")) for t in targets)
