"""aotrt/analysis.py's program analyses beside the kernel costs (tests/test_limits.py):
which tensors an instruction touches, and which constants one instruction alone reads."""

from __future__ import annotations

from aotrt import dtypes
from aotrt.analysis import referenced, sole_read_constants
from aotrt.program.records import NO_PARAMS, InstructionRecord, TensorRecord


def _t(root: str, index: int = 0) -> TensorRecord:
    return TensorRecord(root, index, 0, dtypes.float32, (1,), (1,))


def _k(*args: int) -> InstructionRecord:
    return InstructionRecord("kernel", "k", args, (), (), NO_PARAMS, "")


def _lib(outs: list[int], ins: list[int | None]) -> InstructionRecord:
    return InstructionRecord("library", "op", (), tuple(outs), tuple(ins), NO_PARAMS, "")


def _copy(dst: int, src: int) -> InstructionRecord:
    return InstructionRecord("copy", "", (), (dst,), (src,), NO_PARAMS, "")


def test_referenced_by_each_instruction_kind() -> None:
    assert referenced(_k(3, 1)) == [3, 1]
    assert referenced(_lib([4], [0, None, 2])) == [4, 0, 2]
    assert referenced(_copy(5, 6)) == [5, 6]


def test_sole_read_constants_counts_instructions_not_views() -> None:
    tensors = [_t("input"), _t("constant", 0), _t("constant", 0), _t("constant", 1),
               _t("constant", 2), _t("arena"), _t("output")]
    instructions = [
        _lib([5], [0, 1, 2]),       # two views of constant 0
        _k(5, 3),                   # constant 1 ...
        _copy(6, 3),                # ... read again
        _lib([6], [5, 4, None]),
    ]
    assert sole_read_constants(tensors, instructions) == {0, 2}
