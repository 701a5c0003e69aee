"""No import cycles inside aotrt/: the module graph of top-level imports is acyclic, and
counting the imports inside functions too, a cycle runs only inside one backend.

The graph is built with ast from aotrt/**/*.py. Imports under `if TYPE_CHECKING:` never run
and are left out. The first graph leaves out imports inside functions (deferred, so that
`import aotrt` stays free of torch): they do not run at import time. The second counts them,
and the packages above each imported module (importing a.b.c runs a/b/__init__.py), as a
module that calls a function does import what it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "aotrt"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path = ROOT) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


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
    assert "aotrt.program.validate" in graph["aotrt.program.format"]
    # deferred and TYPE_CHECKING imports are not edges
    assert "aotrt.exporter" not in graph["aotrt"]
    assert "aotrt.exporter.lower" not in graph["aotrt.exporter.rules.views"]


def test_no_import_cycles_in_aotrt() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import of a module, inside functions too, but not under `if TYPE_CHECKING:`."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            hidden.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return [n for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in hidden]


def full_import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the aotrt modules it imports at any time, and the packages above them that
    the import runs (not its own packages: they are imported before it); `root`: the aotrt
    package directory to read (a test's copy)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        for node in _all_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level == 0 and node.module is not None:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            else:
                targets = []
            for t in targets:
                dep = _resolve(t, modules)
                if dep is None or dep == mod:
                    continue
                graph[mod].add(dep)
                parts = dep.split(".")
                for i in range(1, len(parts)):
                    pkg = ".".join(parts[:i])
                    if pkg in modules and not mod.startswith(pkg + "."):
                        graph[mod].add(pkg)
    return graph


BACKENDS = "aotrt.runtime.backends."


def backend(module: str) -> str | None:
    """The backend a module belongs to (the package under aotrt/runtime/backends/ it is
    in: cpu or cuda), or None for a generic one."""
    if not module.startswith(BACKENDS):
        return None
    return module[len(BACKENDS):].split(".")[0]


# Cycles through generic modules held open by imports inside functions, recorded when the
# cross-backend one was broken (issue 36): they may shrink, never grow or gain a member.
KNOWN_GENERIC_CYCLES = [
    ["aotrt.runtime.device", "aotrt.runtime.memory"],
]


def test_backend_membership() -> None:
    assert backend("aotrt.runtime.backends.cpu.stream") == "cpu"
    assert backend("aotrt.runtime.backends.cpu.dnnl") == "cpu"
    assert backend("aotrt.runtime.backends.cuda.graphs") == "cuda"
    assert backend("aotrt.runtime.backends.cuda.ops.conv") == "cuda"
    assert backend("aotrt.runtime.ops.conv") is None
    assert backend("aotrt.runtime.ops") is None
    assert backend("aotrt.runtime.device") is None


def test_full_graph_counts_deferred_imports_and_packages() -> None:
    graph = full_import_graph()
    # inside a function (backends/cpu/device.py registers its ops once CpuDevice exists)
    assert "aotrt.runtime.backends.cpu.ops.conv" in graph["aotrt.runtime.backends.cpu.device"]
    # importing backends/cpu/ops/conv.py runs backends/cpu/ops/__init__.py
    assert "aotrt.runtime.backends.cpu.ops" in graph["aotrt.runtime.backends.cpu.device"]
    # TYPE_CHECKING imports stay out
    assert "aotrt.runtime.backends.cpu.device" not in \
        graph["aotrt.runtime.backends.cpu.ops.activation"]


def test_the_backend_rule_catches_a_cross_backend_cycle() -> None:
    graph = {"aotrt.runtime.ops.conv": {"aotrt.runtime.backends.cpu.device"},
             "aotrt.runtime.backends.cpu.device": {"aotrt.runtime.ops.conv"},
             "aotrt.runtime.backends.cpu.ops.a": {"aotrt.runtime.backends.cpu.b"},
             "aotrt.runtime.backends.cpu.b": {"aotrt.runtime.backends.cpu.ops.a"}}
    assert _cross_backend(cycles(graph)) == [["aotrt.runtime.backends.cpu.device",
                                              "aotrt.runtime.ops.conv"]]


def _cross_backend(found: list[list[str]]) -> list[list[str]]:
    """The cycles that are not all of one backend."""
    out = []
    for comp in found:
        kinds = {backend(m) for m in comp}
        if len(kinds) != 1 or None in kinds:
            out.append(comp)
    return out


def test_import_cycles_counting_deferred_imports_stay_inside_one_backend() -> None:
    bad = _cross_backend(cycles(full_import_graph()))
    grown = [comp for comp in bad if comp not in KNOWN_GENERIC_CYCLES]
    assert not grown, "import cycles across backends or generic modules (counting imports " \
        "inside functions): " + "; ".join(" <-> ".join(c) for c in grown)
