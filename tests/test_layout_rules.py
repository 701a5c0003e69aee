"""Layout rules of aotrt/ (issue 36), checked with ast over aotrt/**/*.py:

- no code dispatches on a device's name: no comparison with, and no table lookup by, a
  device's `.name` (DESIGN principle 8: ask a device for a capability; ops dispatch through
  the registry the backends fill, `ops.register`). A name in an error or log message is fine.
- no unit of work is a function carrying attributes: `.native`, `.native_jobs` and `.keep`
  belong to a `aotrt.runtime.work.Work`, never set on a function nor found by getattr.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
