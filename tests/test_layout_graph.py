"""The package's module import graph has no circle, and ``kernel/values`` stays below
``kernel/exec``.

The graph is built from the same walk as ``test_layout.py`` (every import counts:
module level, lazy inside functions, ``if TYPE_CHECKING:`` ones, ``import_module``
with a literal name, and the Python-level imports of ``src/_frame.pyx``). A
``from pkg import name`` points at the deepest module it names: ``pkg.name`` when that
is a module, else ``pkg``. A circle is a strongly connected component of more than one
module; a test names each one with the imports that close it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tests.test_layout import (
    COMPILED,
    COMPILED_MODULE,
    ROOT,
    Import,
    all_imports,
    module_name,
    python_files,
)

Graph = Mapping[str, Iterable[str]]


def package_modules() -> frozenset[str]:
    """Every module of the package, the compiled framing core included."""
    return frozenset({module_name(path) for path in python_files()} | {COMPILED_MODULE})


def deepest_module(target: str, modules: frozenset[str]) -> str | None:
    """The module of ``modules`` a dotted import target names (its longest prefix that
    is a module), or None for a target outside the package."""
    parts = target.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        parts.pop()
    return None


def importer_of(imp: Import) -> str:
    """The dotted name of the module an import was found in."""
    if imp.file == str(COMPILED.relative_to(ROOT)):
        return COMPILED_MODULE
    return module_name(ROOT / imp.file)


def import_edges() -> dict[tuple[str, str], list[Import]]:
    """(importer, imported module) -> the import statements behind that edge."""
    modules = package_modules()
    edges: dict[tuple[str, str], list[Import]] = {}
    for _, imp in all_imports():
        importer = importer_of(imp)
        imported = deepest_module(imp.target, modules)
        if imported is not None and imported != importer:
            edges.setdefault((importer, imported), []).append(imp)
    return edges


def import_graph(edges: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in package_modules()}
    for importer, imported in edges:
        graph.setdefault(importer, set()).add(imported)
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one node, each sorted, in order.

    Tarjan's algorithm, iterative (no recursion limit): ``index`` numbers nodes in
    visiting order, ``low`` is the smallest index reachable from a node's subtree
    through nodes still on the stack; a node whose ``low`` is its own index roots a
    component, which is what lies above it on the stack.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe(circle: list[str], edges: Mapping[tuple[str, str], list[Import]]) -> str:
    """A circle's modules and the imports between them (file:line: statement)."""
    members = set(circle)
    inside = {  # one line per statement, however many names it imports
        f"    {imp.file}:{imp.line}: {imp.statement}": None
        for (importer, imported), imps in sorted(edges.items())
        if importer in members and imported in members
        for imp in imps
    }
    return "  " + " <-> ".join(circle) + "\n" + "\n".join(inside)


def test_no_import_circle_in_src() -> None:
    edges = import_edges()
    graph = import_graph(edges)
    assert len(edges) > len(graph), f"only {len(edges)} import edges found under src/"
    found = circles(graph)
    assert not found, (
        "import circles in src/ (make the dependency go one way: move the shared name "
        "down, or let the lower module define the interface it needs):\n"
        + "\n".join(describe(circle, edges) for circle in found)
    )


def test_kernel_values_imports_nothing_of_kernel_exec() -> None:
    edges = import_edges()
    values = [key for key in edges if key[0].startswith("shoal_mcp.kernel.values.")]
    assert values, "no imports found for shoal_mcp.kernel.values"
    upward = [
        imp
        for (importer, imported), imps in sorted(edges.items())
        if importer.startswith("shoal_mcp.kernel.values.")
        and (imported + ".").startswith("shoal_mcp.kernel.exec.")
        for imp in imps
    ]
    assert not upward, (
        "shoal_mcp.kernel.values sits below kernel.exec and must not import it (name what "
        "it needs as a protocol in values/, as values/task_view.py does):\n"
        + "\n".join(f"  {imp}" for imp in upward)
    )


# --- the detector itself -------------------------------------------------------------


def test_the_detector_finds_circles_and_only_them() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},  # a -> b -> c -> a, and out to d
        "d": {"e"},
        "e": {"d"},  # a second circle reached from the first
        "f": {"a", "g"},  # above both, in no circle
        "g": set(),
    }
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    # A node only named as a successor counts as well.
    assert circles({"x": {"y"}, "y": {"x", "z"}}) == [["x", "y"]]


def test_the_detector_handles_a_long_chain_without_recursion() -> None:
    length = 5000  # deeper than Python's default recursion limit
    graph = {f"m{i}": {f"m{i + 1}"} for i in range(length)}
    assert circles(graph) == []
    graph[f"m{length}"] = {"m0"}
    (circle,) = circles(graph)
    assert len(circle) == length + 1


def test_a_from_import_maps_to_the_deepest_module() -> None:
    modules = frozenset({"p", "p.sub", "p.sub.mod"})
    assert deepest_module("p.sub.mod.NAME", modules) == "p.sub.mod"
    assert deepest_module("p.sub.mod", modules) == "p.sub.mod"
    assert deepest_module("p.sub.NAME", modules) == "p.sub"  # a name in p/sub/__init__.py
    assert deepest_module("os.path", modules) is None
    real = package_modules()
    assert deepest_module("shoal_mcp.kernel.rpc.call.Call", real) == "shoal_mcp.kernel.rpc.call"


def test_a_circle_is_named_with_its_imports() -> None:
    a = Import("src/shoal_mcp/a.py", 3, "from . import b", "shoal_mcp.b")
    b_x = Import("src/shoal_mcp/b.py", 9, "from .a import X, Y", "shoal_mcp.a.X")
    b_y = Import("src/shoal_mcp/b.py", 9, "from .a import X, Y", "shoal_mcp.a.Y")
    edges = {("shoal_mcp.a", "shoal_mcp.b"): [a], ("shoal_mcp.b", "shoal_mcp.a"): [b_x, b_y]}
    (circle,) = circles(import_graph(edges))
    assert circle == ["shoal_mcp.a", "shoal_mcp.b"]
    assert describe(circle, edges) == (
        "  shoal_mcp.a <-> shoal_mcp.b\n"
        "    src/shoal_mcp/a.py:3: from . import b\n"
        "    src/shoal_mcp/b.py:9: from .a import X, Y"
    )
