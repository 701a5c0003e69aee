"""aotrt/analysis.py's program analyses beside the kernel costs (tests/test_limits.py):
which tensors an instruction touches, and which constants one instruction alone reads."""

from __future__ import annotations

from aotrt.analysis import referenced, sole_read_constants


def _t(root: str, index: int = 0) -> dict:
    return {"root": root, "index": index}


def test_referenced_by_each_instruction_kind() -> None:
    assert referenced({"op": "kernel", "args": [3, 1]}) == [3, 1]
    assert referenced({"op": "library", "outs": [4], "ins": [0, None, 2]}) == [4, 0, 2]
    assert referenced({"op": "copy", "dst": 5, "src": 6}) == [5, 6]


def test_sole_read_constants_counts_instructions_not_views() -> None:
    tensors = [_t("input"), _t("constant", 0), _t("constant", 0), _t("constant", 1),
               _t("constant", 2), _t("arena"), _t("output")]
    instructions = [
        {"op": "library", "outs": [5], "ins": [0, 1, 2]},   # two views of constant 0
        {"op": "kernel", "args": [5, 3]},                   # constant 1 ...
        {"op": "copy", "dst": 6, "src": 3},                 # ... read again
        {"op": "library", "outs": [6], "ins": [5, 4, None]},
    ]
    assert sole_read_constants(tensors, instructions) == {0, 2}
