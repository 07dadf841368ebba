"""Measure the shape of the code: module and function sizes, the package import graph and its cycles.

Run it to print the figures (`python tests/architecture/structure.py`); `test_structure.py` holds the
limits. Only the standard library: it reads source with `ast` and never imports the code it measures.

Definitions:
- a *package* is `sentinel.<first folder>` for code in a folder, `sentinel.<module>` for a top-level module;
  `collectors` is one package;
- the *edge* is what composes and serves the rest: the composition root (`sentinel.app`, `sentinel.cli`,
  `sentinel.runtime`), the routers' kit `sentinel.deps`, and in every package its routers (`api.py`), commands
  (`cli.py`) and FastAPI dependencies (`deps.py`). The edge may import any domain; nothing below the edge may
  import it (a *backward import*);
- the *domain graph* is the package graph of everything below the edge: it must have no cycle. The *literal
  graph* also counts each router and command inside its package (only the composition root left out); it is
  printed for comparison: two domains whose routers show each other's data (a node's accelerators, an
  accelerator's node) form a cycle there without any domain code depending on the other;
- every import counts, including one inside a function (a lazy import hides a cycle, it does not remove it).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("sentinel", "collectors")
COMPOSITION = frozenset({"sentinel.app", "sentinel.cli", "sentinel.runtime"})
EDGE_MODULES = COMPOSITION | {"sentinel.deps"}
EDGE_FILES = frozenset({"api.py", "cli.py", "deps.py"})


@dataclass(frozen=True)
class Function:
    module: str
    name: str
    lines: int


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: set[str] = field(default_factory=set)  # absolute module names, resolved against the tree

    @property
    def package(self) -> str:
        return package_of(self.name)

    @property
    def is_edge(self) -> bool:
        return self.name in EDGE_MODULES or self.path.name in EDGE_FILES


def package_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "sentinel":
        return parts[0]
    return ".".join(parts[:2])


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(tree: ast.AST, current: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, current, is_package)
            names = [f"{target}.{alias.name}" for alias in node.names] + [target]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != current:
                found.add(name)
    return found


def load(root: Path = ROOT, sources: tuple[str, ...] = SOURCES) -> dict[str, Module]:
    paths = [p for src in sources for p in sorted((root / src).rglob("*.py"))]
    known = {module_name(p, root) for p in paths}
    modules: dict[str, Module] = {}
    for path in paths:
        name = module_name(path, root)
        text = path.read_text()
        tree = ast.parse(text)
        modules[name] = Module(name, path, len(text.splitlines()),
                               _imports(tree, name, path.name == "__init__.py", known))
    return modules


def functions(root: Path = ROOT, sources: tuple[str, ...] = SOURCES) -> Iterator[Function]:
    for src in sources:
        for path in sorted((root / src).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                    yield Function(module_name(path, root), node.name, node.end_lineno - node.lineno + 1)


def package_graph(modules: dict[str, Module], *, literal: bool = False) -> dict[str, set[str]]:
    """Package → packages it imports. The domain graph (default) leaves out the edge; the literal graph
    leaves out only the composition root (it imports everything by design)."""
    exclude = COMPOSITION if literal else {m.name for m in modules.values() if m.is_edge}
    graph: dict[str, set[str]] = {}
    for module in modules.values():
        if module.name in exclude:
            continue
        graph.setdefault(module.package, set())
        for target in module.imports:
            if target in exclude:
                continue
            pkg = package_of(target)
            if pkg != module.package:
                graph[module.package].add(pkg)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found, key=len, reverse=True)


def backward_imports(modules: dict[str, Module]) -> list[tuple[str, str]]:
    """(importer, imported) where code below the edge imports the edge: a router, a command, the runtime."""
    edge = {m.name for m in modules.values() if m.is_edge}
    return sorted((m.name, t) for m in modules.values() if not m.is_edge for t in m.imports if t in edge)


def router_imports(modules: dict[str, Module]) -> list[tuple[str, str]]:
    """(router, router) pairs: one router reusing another's code."""
    routers = {m.name for m in modules.values() if m.path.name == "api.py"}
    return sorted((m.name, t) for m in modules.values() if m.name in routers for t in m.imports if t in routers)


def runtime_importers(modules: dict[str, Module]) -> list[str]:
    """Modules outside the composition root that import `sentinel.runtime`."""
    return sorted(m.name for m in modules.values()
                  if "sentinel.runtime" in m.imports and m.name not in COMPOSITION)


def report(root: Path = ROOT) -> str:
    modules = load(root)
    funcs = list(functions(root))
    largest = max(modules.values(), key=lambda m: m.lines)
    longest = max(funcs, key=lambda f: f.lines)
    knots = cycles(package_graph(modules))
    literal = cycles(package_graph(modules, literal=True))
    lines = [
        f"modules: {len(modules)}; largest: {largest.name} ({largest.lines} lines); "
        f"over 400 lines: {sum(m.lines > 400 for m in modules.values())}",
        f"functions: {len(funcs)}; longest: {longest.module}.{longest.name} ({longest.lines} lines); "
        f"over 40 lines: {sum(f.lines > 40 for f in funcs)}; over 60: {sum(f.lines > 60 for f in funcs)}",
        f"package cycles in the domain graph (below the edge): {len(knots)}; packages in them: "
        f"{sum(map(len, knots))}",
        *[f"  cycle: {' '.join(k)}" for k in knots],
        f"package cycles in the literal graph (routers and commands inside their packages; outside "
        f"app/cli/runtime): {len(literal)}; packages in them: {sum(map(len, literal))}",
        *[f"  cycle: {' '.join(k)}" for k in literal],
        f"backward imports (below the edge importing a router, a command or the runtime): "
        f"{len(backward_imports(modules))}",
        *[f"  {a} -> {b}" for a, b in backward_imports(modules)],
        f"router -> router imports: {len(router_imports(modules))}",
        *[f"  {a} -> {b}" for a, b in router_imports(modules)],
        f"modules outside app/cli/runtime importing runtime: {len(runtime_importers(modules))}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT))
