"""Layout rules of aotrt/ (issue 36), checked with ast over aotrt/**/*.py:

- no code dispatches on a device's name: no comparison with, and no table lookup by, a
  device's `.name` (DESIGN principle 8: ask a device for a capability; ops dispatch through
  the registry the backends fill, `ops.register`). A name in an error or log message is fine.
- no unit of work is a function carrying attributes: `.native`, `.native_jobs` and `.keep`
  belong to a `aotrt.runtime.work.Work`, never set on a function nor found by getattr.
- one package per backend (aotrt/runtime/backends/<name>/): a module outside a backend
  imports it only through its entry point, `aotrt.runtime.backends.<name>.device` (the
  module device.DEVICES names; get_device loads it), and a backend imports no other backend.
  Imports inside functions count. A backend reaches generic code the other way: it
  registers its op implementations with `ops.register` when its device module is imported.
  The cycle rule (a cycle runs only inside one backend) is tests/test_imports.py's.
- the program model (aotrt/program/) is below the runtime and the exporter: nothing it
  imports, directly or through the modules it imports (inside functions too), is in
  aotrt.runtime or aotrt.exporter (issue 35 item 1). The runtime gives it the library ops'
  signatures by registering them (aotrt/program/library.py).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from tests.test_imports import _cross_backend, backend, cycles, full_import_graph

ROOT = Path(__file__).resolve().parents[1] / "aotrt"
WORK_ATTRS = ("native", "native_jobs", "keep")
DEVICE_NAMES = ("cpu", "cuda")


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _in_message(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Inside an f-string, a raise, or a call of a logger or warnings: text for people."""
    cur: ast.AST | None = node
    while cur is not None:
        if isinstance(cur, (ast.JoinedStr, ast.Raise)):
            return True
        if isinstance(cur, ast.Call) and isinstance(cur.func, ast.Attribute) and \
                isinstance(cur.func.value, ast.Name) and cur.func.value.id in (
                    "log", "logger", "logging", "warnings"):
            return True
        cur = parents.get(id(cur))
    return False


def _is_device_name(e: ast.AST) -> bool:
    """`<something naming a device>.name`: device.name, dev.name, stream.device.name ..."""
    return isinstance(e, ast.Attribute) and e.attr == "name" and \
        "dev" in ast.unparse(e.value).lower()


def _is_name_constant(e: ast.AST) -> bool:
    return isinstance(e, ast.Constant) and e.value in DEVICE_NAMES


def device_name_dispatch(source: str) -> list[str]:
    """The expressions of `source` that branch on, or look up by, a device's name."""
    tree = ast.parse(source)
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            hit = any(_is_device_name(s) for s in sides) or (
                any(_is_name_constant(s) for s in sides)
                and any(isinstance(s, ast.Attribute) and s.attr == "name" for s in sides))
        elif isinstance(node, ast.Subscript):
            hit = _is_device_name(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "pop", "setdefault") and node.args:
            hit = _is_device_name(node.args[0])
        if hit and not _in_message(node, parents):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def function_attribute_work(source: str) -> list[str]:
    """Assignments of work attributes onto functions, and getattr looking them up."""
    tree = ast.parse(source)
    functions = {n.name for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in WORK_ATTRS and \
                    isinstance(t.value, ast.Name) and t.value.id in functions:
                found.append(f"line {node.lineno}: {ast.unparse(t)} = ...")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value in WORK_ATTRS:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _scan(check) -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for hit in check(path.read_text()):
            out.append(f"{path.relative_to(ROOT.parent)}: {hit}")
    return out


def test_the_name_scan_finds_dispatch_and_spares_messages() -> None:
    src = '''
def f(stream, dev, impls, h):
    make = impls.get(stream.device.name)
    if dev.name == "cpu":
        pass
    if h.device.name in ("cpu", "cuda"):
        pass
    x = TABLE[self.device.name]
    if spec.name != "cuda":
        pass
    raise ValueError(f"not on {stream.device.name}")
    log.debug("on %s", dev.name)
    return dev.name
'''
    found = device_name_dispatch(src)
    assert [f.split(":")[0] for f in found] == ["line 3", "line 4", "line 6", "line 8",
                                                "line 9"], found


def test_the_work_scan_finds_function_attributes() -> None:
    src = '''
def make():
    def work():
        pass
    work.native = lambda: None
    work.keep = (1, 2)
    return work

def read(work, obj):
    obj.keep = 3            # an object's attribute: fine
    return getattr(work, "native", None)
'''
    found = function_attribute_work(src)
    assert [f.split(":")[0] for f in found] == ["line 5", "line 6", "line 11"], found


def test_no_code_dispatches_on_a_device_name() -> None:
    found = _scan(device_name_dispatch)
    assert not found, "device-name dispatch (ask the device for a capability, or register " \
        "the op per device class): " + "; ".join(found)


def test_no_work_is_a_function_with_attributes() -> None:
    found = _scan(function_attribute_work)
    assert not found, "work attributes on functions (use aotrt.runtime.work.Work): " + \
        "; ".join(found)


def entry_point(name: str) -> str:
    """The one module of backend `name` that code outside it may import."""
    return f"aotrt.runtime.backends.{name}.device"


def boundary_crossings(graph: dict[str, set[str]]) -> list[str]:
    """The imports of `graph` (module -> modules it imports) that enter a backend other than
    through its entry point (or the packages above it), or that go from one backend to
    another."""
    found = []
    for mod, deps in sorted(graph.items()):
        own = backend(mod)
        for dep in sorted(deps):
            other = backend(dep)
            if other is None or other == own:
                continue
            entry = entry_point(other)
            through_entry = dep == entry or entry.startswith(dep + ".")
            if own is not None or not through_entry:
                found.append(f"{mod} imports {dep}")
    return found


def test_the_boundary_rule_on_a_synthetic_graph() -> None:
    b = "aotrt.runtime.backends."
    graph = {
        "aotrt.runtime.device": set(),                            # entry by name: no edge
        "aotrt.runtime.loaded": {b + "cpu.device", b + "cpu"},    # the entry point: fine
        "aotrt.runtime.ops.conv": {b + "cpu.dnnl"},               # past the entry point
        b + "cpu.device": {b + "cpu.ops.conv", "aotrt.runtime.ops._common"},
        b + "cuda.device": {b + "cpu.device"},                    # one backend into another
        b + "cuda.ops.gemm": {b + "cuda.device", b + "cuda.libraries"},
    }
    assert sorted(boundary_crossings(graph)) == sorted([
        f"{b}cuda.device imports {b}cpu.device",
        f"aotrt.runtime.ops.conv imports {b}cpu.dnnl"])


def test_the_entry_points_are_the_registered_devices() -> None:
    from aotrt.runtime.device import DEVICES

    assert {name: spec.partition(":")[0] for name, spec in DEVICES.items()} == \
        {name: entry_point(name) for name in DEVICES}
    backends = {p.name for p in (ROOT / "runtime" / "backends").iterdir()
                if (p / "__init__.py").exists()}
    assert backends == set(DEVICES)


def test_no_module_enters_a_backend_but_through_its_device() -> None:
    found = boundary_crossings(full_import_graph())
    assert not found, "imports into a backend other than its entry point " \
        "(aotrt.runtime.backends.<name>.device), counting imports inside functions: " + \
        "; ".join(found)


def test_the_rules_fail_on_a_bad_import_in_a_copy(tmp_path: Path) -> None:
    """A copy of aotrt/ with a generic op importing the cpu backend's oneDNN inside a
    function, and the cpu backend importing that op back: both rules see it."""
    root = tmp_path / "aotrt"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    assert not boundary_crossings(full_import_graph(root))
    op = root / "runtime" / "ops" / "conv.py"
    op.write_text(op.read_text() + "\n\ndef _bad() -> None:\n"
                  "    from aotrt.runtime.backends.cpu import dnnl  # noqa: F401\n")
    dnnl = root / "runtime" / "backends" / "cpu" / "dnnl.py"
    dnnl.write_text(dnnl.read_text() + "\n\nimport aotrt.runtime.ops.conv  # noqa: E402\n")
    graph = full_import_graph(root)
    assert boundary_crossings(graph) == [
        "aotrt.runtime.ops.conv imports aotrt.runtime.backends.cpu.dnnl"]
    assert any("aotrt.runtime.ops.conv" in comp and "aotrt.runtime.backends.cpu.dnnl" in comp
               for comp in _cross_backend(cycles(graph)))


PROGRAM = "aotrt.program"
ABOVE_PROGRAM = ("aotrt.runtime", "aotrt.exporter")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def program_reaches_up(graph: dict[str, set[str]]) -> list[str]:
    """The import chains of `graph` from a module of the program package to one of the
    runtime or the exporter (the shortest per program module)."""
    found = []
    for start in sorted(m for m in graph if _within(m, PROGRAM)):
        seen, queue = {start: [start]}, [start]
        while queue:
            mod = queue.pop(0)
            if any(_within(mod, up) for up in ABOVE_PROGRAM):
                found.append(" imports ".join(seen[mod]))
                break
            for dep in sorted(graph.get(mod, ())):
                if dep not in seen:
                    seen[dep] = [*seen[mod], dep]
                    queue.append(dep)
    return found


def test_the_program_rule_on_a_synthetic_graph() -> None:
    graph = {
        "aotrt.program": {"aotrt.program.format"},
        "aotrt.program.format": {"aotrt.program.validate", "aotrt.analysis"},
        "aotrt.program.validate": {"aotrt.kernels.ir"},
        "aotrt.program.symbols": {"aotrt.exporter.dynamic"},           # up, directly
        "aotrt.analysis": {"aotrt.runtime.tensor"},                      # up, through another
        "aotrt.kernels.ir": set(),
        "aotrt.runtime.tensor": {"aotrt.program.strides"},              # down: fine
        "aotrt.program.strides": set(),
        "aotrt.programs_elsewhere": {"aotrt.runtime.tensor"},            # not the package
    }
    assert program_reaches_up(graph) == [
        "aotrt.program imports aotrt.program.format imports aotrt.analysis imports "
        "aotrt.runtime.tensor",
        "aotrt.program.format imports aotrt.analysis imports aotrt.runtime.tensor",
        "aotrt.program.symbols imports aotrt.exporter.dynamic"]


def test_the_program_model_imports_neither_the_runtime_nor_the_exporter() -> None:
    found = program_reaches_up(full_import_graph())
    assert not found, "the program model (aotrt/program/) reaches the runtime or the " \
        "exporter, counting imports inside functions: " + "; ".join(found)


def test_the_program_rule_fails_on_a_bad_import_in_a_copy(tmp_path: Path) -> None:
    """A copy of aotrt/ whose validator imports the runtime's ops inside a function (as it
    did before the signatures were registered): the rule names the chain."""
    root = tmp_path / "aotrt"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    assert not program_reaches_up(full_import_graph(root))
    validate = root / "program" / "validate.py"
    validate.write_text(validate.read_text() + "\n\ndef _bad() -> None:\n"
                        "    from aotrt.runtime.ops import check  # noqa: F401\n")
    found = program_reaches_up(full_import_graph(root))
    assert "aotrt.program.validate imports aotrt.runtime" in found, found
