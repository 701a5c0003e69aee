"""No import cycles inside aotrt/: the module graph of top-level imports is acyclic.

The graph is built with ast from aotrt/**/*.py. Imports inside functions (deferred, so that
`import aotrt` stays free of torch) and under `if TYPE_CHECKING:` are left out: they do not
run at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "aotrt"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The aotrt module an imported dotted name refers to (longest known prefix)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: module level, also inside top-level
    try/if blocks, but not in functions, classes' methods or `if TYPE_CHECKING:`."""
    out: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                stack.extend(node.body)
            stack.extend(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                stack.extend(block)
            for h in node.handlers:
                stack.extend(h.body)
        elif isinstance(node, ast.ClassDef):
            stack.extend(s for s in node.body if not isinstance(
                s, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the aotrt modules its top-level imports load (parent packages left out:
    every submodule import runs them, and they are checked as modules of their own)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _top_level_imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level == 0 and node.module is not None:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                dep = _resolve(t, modules)
                if dep is not None and dep != mod:
                    graph[mod].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_the_modules_and_their_imports() -> None:
    graph = import_graph()
    assert "aotrt.exporter.rules.registry" in graph
    assert "aotrt.program_check" in graph["aotrt.program"]
    # deferred and TYPE_CHECKING imports are not edges
    assert "aotrt.exporter" not in graph["aotrt"]
    assert "aotrt.exporter.lower" not in graph["aotrt.exporter.rules.views"]


def test_no_import_cycles_in_aotrt() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
