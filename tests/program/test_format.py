"""aotrt/program/format.py: the .aotp file round trip, the builder, and every refusal of a
bad file."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotrt.errors import InvalidArgument, ProgramError
from aotrt.kernels import ir
from aotrt.exporter.builder import ProgramBuilder
from aotrt.kernels.bounds import kernel_accesses
from aotrt.program import METADATA_KEY, Program, read_safetensors
from tests.support import bounded_steps


def add_kernel(name: str = "k_add", shape=(4, 3)) -> ir.Kernel:
    """out = a + b over a row-major `shape`; args (a r, b r, out w)."""
    st = [shape[1], 1]
    val = ir.Op("add", (ir.load(0, st, "float32"), ir.load(1, st, "float32")), "float32")
    return ir.Kernel(name, tuple(shape), (), (ir.Arg("float32", "r"), ir.Arg("float32", "r"),
                                             ir.Arg("float32", "w")), (ir.store(2, st, val),))


def small_program() -> Program:
    """x + w -> buffer -> copy into out; plus a bf16 constant and a library op."""
    b = ProgramBuilder("Small", {"torch": "2.14.1"})
    x = b.input("x", "float32", [4, 3])
    w = b.constant("w", np.arange(12, dtype=np.float32).reshape(4, 3))
    b.constant("wb", np.ones((2, 5), dtype=ml_dtypes.bfloat16))
    o = b.output("out", "float32", [4, 3])
    buf = b.buffer(48)
    t = b.in_buffer(buf, 0, "float32", [4, 3])
    b.kernel(add_kernel(), [x, w, t], src="aten.add.Tensor at m.py:3")
    mm_out = b.in_buffer(b.buffer(64), 0, "float32", [4, 4])
    b.library("mm", [mm_out], [t, b.alias(w, [3, 4], [1, 3], 0)], {}, src="aten.mm")
    b.copy(o, t, "m.py:4")
    return b.build()


def write_raw(path: Path, doc: Any, arrays: dict[str, np.ndarray]) -> None:
    """Write a safetensors file holding `doc` as the program document, unvalidated."""
    text = doc if isinstance(doc, str) else json.dumps(doc)
    safetensors.numpy.save_file(arrays, str(path), metadata={METADATA_KEY: text})


def doc_and_arrays() -> tuple[dict, dict[str, np.ndarray]]:
    p = small_program()
    return json.loads(json.dumps(p.to_json())), dict(p.constants)


# -- round trip --------------------------------------------------------------------------------


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    p = small_program()
    path = tmp_path / "m.aotp"
    p.save(path)
    q = Program.load(path)
    assert q.to_json() == p.to_json()
    assert list(q.constants) == ["w", "wb"]
    for name in p.constants:
        assert q.constants[name].dtype == p.constants[name].dtype
        np.testing.assert_array_equal(q.constants[name], p.constants[name])
    assert q.kernels == p.kernels
    assert q.provenance["torch"] == "2.14.1" and q.provenance["module"] == "Small"


def test_file_is_plain_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "m.aotp"
    small_program().save(path)
    arrays = safetensors.numpy.load_file(str(path))
    assert set(arrays) == {"w", "wb"}
    assert arrays["wb"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_save_validates_first(tmp_path: Path) -> None:
    p = small_program()
    p.instructions.append({"op": "jump", "to": 0})
    with pytest.raises(ProgramError, match="unknown opcode 'jump'"):
        p.save(tmp_path / "bad.aotp")
    assert not (tmp_path / "bad.aotp").exists()
    assert not list(tmp_path.iterdir())


def test_summary_lists_the_parts() -> None:
    text = small_program().summary()
    assert "input 0 x: float32[4, 3]" in text
    assert "library mm: 1" in text and "kernel: 1" in text and "copy: 1" in text
    assert "constants: 2" in text


def test_loads_from_bytes_equals_load(tmp_path: Path) -> None:
    path = tmp_path / "m.aotp"
    small_program().save(path)
    assert Program.loads(path.read_bytes()).to_json() == Program.load(path).to_json()


# -- builder -----------------------------------------------------------------------------------


def test_builder_plans_buffers_apart_when_live_together() -> None:
    b = ProgramBuilder("P")
    x = b.input("x", "float32", [16])
    o = b.output("o", "float32", [16])
    k = ir.Kernel("k_cp", (16,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, [1], ir.load(0, [1], "float32")),))
    bufs = [b.in_buffer(b.buffer(64), 0, "float32", [16]) for _ in range(3)]
    b.kernel(k, [x, bufs[0]])
    b.kernel(k, [bufs[0], bufs[1]])    # 0 and 1 live together
    b.kernel(k, [bufs[1], bufs[2]])    # 1 and 2 live together; 0 is dead: 2 may reuse it
    b.kernel(k, [bufs[2], o])
    p = b.build()
    offs = [p.tensors[t]["byte_offset"] for t in bufs]
    assert all(p.tensors[t]["root"] == "arena" for t in bufs)
    assert offs[0] != offs[1] and offs[1] != offs[2]
    assert offs[2] == offs[0]
    assert p.arena_nbytes == 128


def test_builder_refuses_two_kernels_with_one_name() -> None:
    b = ProgramBuilder()
    x = b.input("x", "float32", [4, 3])
    b.kernel(add_kernel(), [x, x, b.output("o", "float32", [4, 3])])
    with pytest.raises(InvalidArgument, match="two different kernels"):
        b.kernel(add_kernel(shape=(3, 4)), [x, x, x])


def test_builder_alias_counts_offset_from_the_root() -> None:
    b = ProgramBuilder()
    w = b.constant("w", np.zeros((4, 8), np.float32))
    v = b.alias(w, [4, 4], [8, 1], 4)
    assert b.tensors[v] == {"root": "constant", "index": 0, "byte_offset": 16,
                            "dtype": "float32", "sizes": [4, 4], "strides": [8, 1]}
    assert b.alias(w, [4, 4], [8, 1], 4) == v     # same view, same id


# -- refusals ----------------------------------------------------------------------------------


def load_doc(tmp_path: Path, doc: Any, arrays: dict[str, np.ndarray] | None = None) -> Program:
    path = tmp_path / "bad.aotp"
    write_raw(path, doc, doc_and_arrays()[1] if arrays is None else arrays)
    return Program.load(path)


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        keys = path.split(".")
        node = doc
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


def _tensor_index(doc: dict, root: str) -> int:
    return next(i for i, t in enumerate(doc["tensors"]) if t["root"] == root)


def _instr(doc: dict, op: str) -> dict:
    return next(i for i in doc["instructions"] if i["op"] == op)


BAD_DOCS: list[tuple[str, Callable[[dict], None], str]] = [
    ("wrong version", _set("version", 3), "unknown format version 3"),
    ("version as bool", _set("version", True), "unknown format version"),
    ("wrong format", _set("format", "onnx"), "format: expected 'aotrt.program'"),
    ("unknown top field", lambda d: d.update(extra=1), r"unknown field\(s\) \['extra'\]"),
    ("missing field", lambda d: d.pop("tensors"), r"missing field\(s\) \['tensors'\]"),
    ("unknown opcode", lambda d: d["instructions"].append({"op": "jump"}),
     r"instructions\[3\]\.op: unknown opcode 'jump'"),
    ("instruction not an object", lambda d: d["instructions"].append(7),
     r"instructions\[3\]: expected an object"),
    ("extra instruction field", lambda d: _instr(d, "copy").update(bogus=1),
     r"instructions\[2\]: unknown field"),
    ("kernel arg id out of range", lambda d: _instr(d, "kernel")["args"].__setitem__(0, 999),
     r"instructions\[0\] \(kernel\)\.args\[0\]: 999 is outside"),
    ("negative id", lambda d: _instr(d, "copy").__setitem__("dst", -1),
     r"\.dst: -1 is outside"),
    ("id is a float", lambda d: _instr(d, "copy").__setitem__("src", 1.0),
     r"\.src: expected an integer"),
    ("library input id out of range", lambda d: _instr(d, "library")["ins"].append(10 ** 30),
     r"\.ins\[2\]: .* is outside"),
    ("outputs_tensors id out of range", _set("outputs_tensors.0", 50),
     r"outputs_tensors\[0\]: 50 is outside"),
    ("outputs_tensors not the output", lambda d: d["outputs_tensors"].__setitem__(
        0, _tensor_index(d, "input")), r"outputs_tensors\[0\]: tensor 0 must be the whole"),
    ("outputs count", lambda d: d["outputs_tensors"].append(0), "2 entries for 1 outputs"),
    ("tensor outside arena", lambda d: d["tensors"][_tensor_index(d, "arena")].__setitem__(
        "byte_offset", 4096), r"tensors\[\d+\]: view bytes \[4096, 4144\) lie outside arena 0"),
    ("tensor outside constant", lambda d: d["tensors"][_tensor_index(d, "constant")].__setitem__(
        "sizes", [4, 4]), r"lie outside constant 0 of 48 bytes"),
    ("tensor outside input", lambda d: d["tensors"][_tensor_index(d, "input")].__setitem__(
        "strides", [4, 1]), r"lie outside input 0 of 48 bytes"),
    ("arena shrunk under its tensors", _set("arena.nbytes", 16), r"lie outside arena 0 of 16"),
    ("unknown root", lambda d: d["tensors"][0].__setitem__("root", "heap"),
     "unknown root 'heap'"),
    ("root index out of range", lambda d: d["tensors"][_tensor_index(d, "input")].__setitem__(
        "index", 3), r"\.index: 3 is outside|input 3 does not exist"),
    ("misaligned offset", lambda d: d["tensors"][_tensor_index(d, "arena")].__setitem__(
        "byte_offset", 2), "2 is not a multiple of float32's size 4"),
    ("negative size", lambda d: d["tensors"][0]["sizes"].__setitem__(0, -1),
     r"sizes\[0\]: -1 is outside"),
    ("size overflows int32", lambda d: d["tensors"][0]["sizes"].__setitem__(0, 1 << 40),
     r"sizes\[0\]: 1099511627776 is outside \[0, 2147483648\)"),
    ("stride overflows", lambda d: d["tensors"][0]["strides"].__setitem__(0, 1 << 62),
     r"strides\[0\]: 4611686018427387904 is outside"),
    ("offset overflows", lambda d: d["tensors"][0].__setitem__("byte_offset", 1 << 63),
     r"byte_offset: 9223372036854775808 is outside"),
    ("arena overflows", _set("arena.nbytes", 1 << 64), r"arena\.nbytes: .* is outside"),
    ("input numel overflows bytes", lambda d: d["inputs"][0].update(
        shape=[2 ** 31 - 1] * 2, strides=[2 ** 31 - 1, 1]),
     r"inputs\[0\]: float32\[2147483647, 2147483647\] overflows 2\*\*62 bytes"),
    ("stride overflows int32", lambda d: d["tensors"][0]["strides"].__setitem__(0, 1 << 31),
     r"strides\[0\]: stride 2147483648 does not fit int32"),
    ("huge rank", lambda d: d["tensors"][0].update(sizes=[1] * 65, strides=[1] * 65),
     "65 entries exceed the limit of 64"),
    ("strides count", lambda d: d["tensors"][0]["strides"].append(1), "3 strides for 2 sizes"),
    ("unknown dtype", lambda d: d["tensors"][0].__setitem__("dtype", "complex64"),
     "unknown dtype 'complex64'"),
    ("kernel arg dtype", lambda d: d["tensors"][_instr(d, "kernel")["args"][0]].__setitem__(
        "dtype", "int32"), "kernel k_add wants float32, tensor 0 is int32"),
    ("kernel arg count", lambda d: _instr(d, "kernel")["args"].pop(),
     "kernel k_add takes 3 arguments, got 2"),
    ("unknown kernel", lambda d: _instr(d, "kernel").__setitem__("name", "k_nope"),
     "no kernel named 'k_nope'"),
    ("kernel writes an input", lambda d: _instr(d, "kernel")["args"].__setitem__(
        2, _tensor_index(d, "input")), "is a view of an input, which programs never write"),
    ("copy writes a constant", lambda d: _instr(d, "copy").__setitem__(
        "dst", _tensor_index(d, "constant")), "view of an constant|view of a constant|constant"),
    ("copy dtype mismatch", lambda d: _instr(d, "copy").__setitem__("src", _instr(
        d, "library")["ins"][1]), r"dst tensor \d+ is float32\[4, 3\] but src tensor"),
    ("bad library name", lambda d: _instr(d, "library").__setitem__("fn", "os.system"),
     "'os.system' is not a library op name"),
    ("bad param name", lambda d: _instr(d, "library").__setitem__("params", {"stream": 1}),
     "bad parameter name 'stream'"),
    ("non-finite param", lambda d: _instr(d, "library").__setitem__("params", {"a": float("nan")}),
     r"params\.a: nan is not finite"),
    ("fill is no opcode", lambda d: d["instructions"].append(
        {"op": "fill", "dst": _tensor_index(d, "arena"), "byte": 0}),
     r"\.op: unknown opcode 'fill' \(known: \['kernel', 'library', 'copy'\]\)"),
    ("duplicate input name", lambda d: d["inputs"].append(dict(d["inputs"][0])),
     r"inputs\[1\]\.name: duplicate name 'x'"),
    ("spec with holes", lambda d: d["inputs"][0].__setitem__("strides", [6, 1]),
     r"inputs\[0\]\.strides: \[6, 1\] for shape \[4, 3\] leave holes"),
    ("provenance not strings", _set("provenance", {"torch": 2}), "provenance"),
    ("constant missing data", lambda d: d["constants"].append(
        {"name": "ghost", "dtype": "float32", "shape": [1]}), "constant 'ghost' has no data"),
    ("constant shape mismatch", lambda d: d["constants"][0].__setitem__("shape", [3, 4]),
     r"constant 'w' is float32\[4, 3\] in the file but float32\[3, 4\] in the document"),
    ("unlisted constant", lambda d: d["constants"].pop(), r"tensors \['wb'\] in the file are not"),
    # kernel IR
    ("bad IR node type", lambda d: d["kernels"][0]["stores"][0]["value"].update(t="Eval"),
     r"kernels\[0\]: invalid kernel IR: unknown IR node type 'Eval'"),
    ("bad IR op", lambda d: d["kernels"][0]["stores"][0]["value"].update(op="system"),
     r"kernels\[0\]: invalid kernel IR: .*bad op 'system'"),
    ("IR store to read arg", lambda d: d["kernels"][0]["stores"][0].update(arg=0),
     r"kernels\[0\]: invalid kernel IR: .*store to non-output argument 0"),
    ("IR missing field", lambda d: d["kernels"][0].pop("rshape"),
     r"kernels\[0\]: invalid kernel IR: IR node Kernel has fields"),
    ("IR name injection", lambda d: d["kernels"][0].update(name="k(){}; void x"),
     r"kernels\[0\]: invalid kernel IR: .*not an identifier"),
    ("IR float in index", lambda d: d["kernels"][0]["stores"][0]["index"].update(
        t="Const", value=1.5, dtype="float32") or [d["kernels"][0]["stores"][0]["index"].pop(k)
                                                    for k in ("op", "args")],
     "at a non-integer index"),
    ("IR wrong type in args", lambda d: d["kernels"][0]["args"].__setitem__(
        0, {"t": "Idx", "dim": 0, "dtype": "int64"}), r"kernels\[0\]"),
    ("IR huge constant", lambda d: d["kernels"][0]["stores"][0]["index"]["args"][0][
        "args"].__setitem__(1, {"t": "Const", "value": 1 << 70, "dtype": "int64"}),
     "overflows int64"),
    ("IR kernel reads past its view", lambda d: d["kernels"][0].update(shape=[5, 3]),
     r"kernel k_add (loads from|stores to) argument \d \(tensor \d, float32\[4, 3\] of "
     r"(input|arena|constant) 0\) at element indices \[0, 14\], outside the view's \[0, 12\)"),
]


@pytest.mark.parametrize("depth", [100, 5000, 100000])
def test_deeply_nested_ir_is_refused(tmp_path: Path, depth: int) -> None:
    doc, arrays = doc_and_arrays()
    marker = '"MARK"'
    doc["kernels"][0]["stores"][0]["value"] = "MARK"
    deep = '{"t":"Op","op":"neg","dtype":"float32","args":[' * depth + \
        '{"t":"Const","value":1.0,"dtype":"float32"}' + "]}" * depth
    text = json.dumps(doc).replace(marker, deep)
    if depth == 100:
        load_doc(tmp_path, text, arrays)    # deep but fine
        return
    with pytest.raises(ProgramError, match=r"kernels\[0\]: invalid kernel IR|not valid JSON"):
        load_doc(tmp_path, text, arrays)


@pytest.mark.parametrize("name,mutate,match", BAD_DOCS, ids=[b[0] for b in BAD_DOCS])
def test_bad_document_is_refused(tmp_path: Path, name: str, mutate: Callable, match: str) -> None:
    doc, arrays = doc_and_arrays()
    load_doc(tmp_path, doc, arrays)   # the unmodified document loads
    doc = copy.deepcopy(doc)
    mutate(doc)
    with pytest.raises(ProgramError, match=match) as info:
        load_doc(tmp_path, doc, arrays)
    assert str(info.value).startswith(str(tmp_path / "bad.aotp"))


def test_every_bad_document_is_refused_by_validate_too() -> None:
    # A hand-built Program takes the same checks (delegates call validate()).
    for name, mutate, match in BAD_DOCS:
        doc, arrays = doc_and_arrays()
        mutate(doc)
        with pytest.raises(ProgramError):
            p = Program.from_json(doc, arrays)
            p.validate()


# -- kernel index ranges -----------------------------------------------------------------------


def gather_program(clamp: bool) -> Program:
    """out[i, :] = table[ids[i], :]: a data-dependent index, clamped or not."""
    b = ProgramBuilder("Gather")
    ids = b.input("ids", "int64", [3])
    table = b.constant("table", np.arange(20, dtype=np.float32).reshape(5, 4))
    out = b.output("out", "float32", [3, 4])
    row: ir.Expr = ir.Load(0, ir.Idx(0), "int64")
    if clamp:
        row = ir.Op("minimum", (ir.Op("maximum", (row, ir.const(0, "int64")), "int64"),
                                ir.const(4, "int64")), "int64")
    index = ir.Op("add", (ir.Op("mul", (row, ir.const(4, "int64")), "int64"), ir.Idx(1)),
                  "int64")
    k = ir.Kernel("k_gather", (3, 4), (), (ir.Arg("int64", "r"), ir.Arg("float32", "r"),
                                          ir.Arg("float32", "w")),
                  (ir.store(2, [4, 1], ir.Load(1, index, "float32")),))
    b.kernel(k, [ids, table, out])
    return b.build()


def test_clamped_gather_is_accepted() -> None:
    gather_program(clamp=True).validate()


def test_unclamped_gather_is_refused() -> None:
    with pytest.raises(ProgramError, match=r"k_gather loads from argument 1 .* clamp"):
        gather_program(clamp=False)


def test_ranges_of_common_index_forms() -> None:
    # (i // 2) * 3 + i % 2 over i < 8: [0, 10]; reduction dims bound too.
    i = ir.Idx(0)
    idx = ir.Op("add", (ir.Op("mul", (ir.Op("floordiv", (i, ir.const(2, "int64")), "int64"),
                                      ir.const(3, "int64")), "int64"),
                        ir.Op("mod", (i, ir.const(2, "int64")), "int64")), "int64")
    red = ir.Reduce("sum", ir.load(0, [5, 1], "float32", dims=[0, 1]), "float32")
    k = ir.Kernel("k_r", (8,), (5,), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, idx, red),))
    acc = {(a, s): r for a, r, s in kernel_accesses(k)}
    assert acc[(1, True)] == (0, 10)
    assert acc[(0, False)] == (0, 7 * 5 + 4)
    empty = ir.Kernel("k_e", (0,), (), (ir.Arg("float32", "w"),),
                      (ir.store(0, [1 << 40], ir.const(1.0, "float32")),))
    assert kernel_accesses(empty) == []


# -- broken files ------------------------------------------------------------------------------


def saved_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "good.aotp"
    small_program().save(path)
    return path.read_bytes()


@pytest.mark.parametrize("cut", [0, 3, 8, 20, -1, -30])
def test_truncated_file_is_refused(tmp_path: Path, cut: int) -> None:
    data = saved_bytes(tmp_path)
    path = tmp_path / "cut.aotp"
    path.write_bytes(data[:cut] if cut >= 0 else data[:len(data) + cut])
    with pytest.raises(ProgramError, match="truncated"):
        Program.load(path)


def test_corrupt_header_is_refused(tmp_path: Path) -> None:
    data = bytearray(saved_bytes(tmp_path))
    data[8:12] = b"\xff\xfe{["
    path = tmp_path / "bad.aotp"
    path.write_bytes(bytes(data))
    with pytest.raises(ProgramError, match="corrupt file: the safetensors header is not JSON"):
        Program.load(path)


def test_huge_header_length_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.aotp"
    path.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    with pytest.raises(ProgramError, match="header length .* exceeds"):
        Program.load(path)


def test_random_bytes_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "noise.aotp"
    for _ in range(20):
        path.write_bytes(rng.integers(0, 256, size=int(rng.integers(0, 400)),
                                      dtype=np.uint8).tobytes())
        with pytest.raises(ProgramError):
            Program.load(path)


def test_flipped_bytes_never_crash(tmp_path: Path) -> None:
    """Any single corrupted byte gives a Program or a ProgramError, nothing else."""
    data = saved_bytes(tmp_path)
    rng = np.random.default_rng(1)
    for pos in rng.integers(0, len(data), size=300):
        bad = bytearray(data)
        bad[pos] ^= int(rng.integers(1, 256))
        try:
            Program.loads(bytes(bad))
        except ProgramError:
            pass


def test_overlapping_file_tensors_are_refused() -> None:
    header = {"__metadata__": {}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + bytes(12)
    with pytest.raises(ProgramError, match="overlap in the file"):
        read_safetensors(data)


def test_file_tensor_size_mismatch_is_refused() -> None:
    header = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    raw = json.dumps(header).encode()
    with pytest.raises(ProgramError, match=r"hold 8 bytes, but F32\[3\] needs 12"):
        read_safetensors(struct.pack("<Q", len(raw)) + raw + bytes(8))


def test_unknown_file_dtype_is_refused() -> None:
    header = {"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}
    raw = json.dumps(header).encode()
    with pytest.raises(ProgramError, match="unsupported safetensors dtype 'F64'"):
        read_safetensors(struct.pack("<Q", len(raw)) + raw + bytes(8))


def test_file_without_program_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    safetensors.numpy.save_file({"w": np.ones(3, np.float32)}, str(path))
    with pytest.raises(ProgramError, match="not an aotrt program"):
        Program.load(path)


def test_program_document_not_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProgramError, match="not valid JSON"):
        load_doc(tmp_path, "{not json")


def test_missing_file_is_a_program_error(tmp_path: Path) -> None:
    with pytest.raises(ProgramError, match="cannot read program file"):
        Program.load(tmp_path / "nope.aotp")


def test_validate_catches_hand_built_garbage() -> None:
    p = small_program()
    p.tensors[0] = "not a tensor"
    with pytest.raises(ProgramError, match=r"tensors\[0\]: expected an object"):
        p.validate()
    p = small_program()
    p.kernels.append("not a kernel")
    with pytest.raises(ProgramError, match=r"kernels\[1\]: expected an ir.Kernel"):
        p.validate()
    p = small_program()
    p.constants["bad"] = [1, 2]
    with pytest.raises(ProgramError, match="expected a numpy array"):
        p.validate()


# -- fuzzing: whatever validates also runs inside its own memory ------------------------------


def _int_slots(doc: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every integer in the document's tensors, instructions and kernel shapes."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _int_slots(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _int_slots(v, path + (i,))
    elif isinstance(doc, int) and not isinstance(doc, bool):
        out.append(path)
    return out


def _put(doc: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


def test_mutated_programs_load_and_run_or_are_refused() -> None:
    """Random integer changes (offsets, sizes, strides, ids, kernel shapes): each document is
    refused with ProgramError, or it loads and runs (a run may fail only with an AotrtError:
    nothing reads or writes outside the runtime's own memory, which would crash here)."""
    import aotrt
    from aotrt.errors import AotrtError

    base, arrays = doc_and_arrays()
    slots = [p for p in _int_slots(base) if p[0] in ("tensors", "instructions", "arena")
             or (p[0] == "kernels" and p[2] in ("shape", "rshape"))]
    rng = np.random.default_rng(123)
    accepted = 0
    for trial in range(150):
        doc = copy.deepcopy(base)
        for _ in range(int(rng.integers(1, 4))):
            path = slots[int(rng.integers(len(slots)))]
            old = doc
            for k in path:
                old = old[k]
            choice = rng.integers(6)
            value = [0, 1, old + 1, old - 1, old * 2 + 3, int(rng.integers(-5, 200))][choice]
            _put(doc, path, int(value))
        try:
            prog = Program.from_json(doc, arrays)
        except ProgramError:
            continue
        accepted += 1
        try:
            with aotrt.load(prog, check_hazards=True) as m:
                m.run(np.ones((4, 3), np.float32))
        except AotrtError:
            pass
    assert accepted > 10, accepted


# -- every output byte is written before it is returned (issue 7, item 8b) ---------------------


def _out_program(shape: list[int], instrs: Callable[[ProgramBuilder, int, int], None],
                 dtype: str = "float32") -> Program:
    b = ProgramBuilder("Cover")
    x = b.input("x", dtype, shape)
    o = b.output("o", dtype, shape)
    instrs(b, x, o)
    return b.build()


def _store_kernel(name: str, shape: tuple, index: ir.Expr, n_out: int) -> ir.Kernel:
    """out[index] = 1.0 over `shape`."""
    return ir.Kernel(name, shape, (), (ir.Arg("float32", "w"),),
                     (ir.Store(0, index, ir.Const(1.0, "float32")),))


def _i(d: int) -> ir.Expr:
    return ir.Idx(d)


def _c(v: int) -> ir.Expr:
    return ir.Const(v, "int64")


def _op(name: str, *args: ir.Expr) -> ir.Expr:
    return ir.Op(name, tuple(args), "int64")


def test_output_never_written_is_refused() -> None:
    with pytest.raises(ProgramError, match=r"outputs\[0\] 'o': byte 0 of its 48 is never "
                                           r"written"):
        _out_program([4, 3], lambda b, x, o: None)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_output_partly_copied_is_refused(rows: int) -> None:
    def instrs(b: ProgramBuilder, x: int, o: int) -> None:
        b.copy(b.alias(o, [rows, 3], [3, 1], 0), b.alias(x, [rows, 3], [3, 1], 0))

    with pytest.raises(ProgramError, match=f"byte {rows * 12} of its 48 is never written"):
        _out_program([4, 3], instrs)


def test_output_written_in_pieces_by_copies_and_library_is_accepted() -> None:
    def instrs(b: ProgramBuilder, x: int, o: int) -> None:
        b.copy(b.alias(o, [2, 3], [3, 1], 6), b.alias(x, [2, 3], [3, 1], 6))    # rows 2-3
        b.copy(b.alias(o, [3], [1], 0), b.alias(x, [3], [1], 0))                 # row 0
        a = b.alias(x, [1, 3], [3, 1], 0)
        w = b.constant("w", np.ones((3, 3), np.float32))
        b.library("mm", [b.alias(o, [1, 3], [3, 1], 3)], [a, w])                  # row 1

    _out_program([4, 3], instrs)


def test_copy_through_a_byte_view_covers_the_bytes_it_writes() -> None:
    def instrs(b: ProgramBuilder, x: int, o: int) -> None:
        b.copy(b.alias(o, [40], [1], 0, "uint8"), b.alias(x, [40], [1], 0, "uint8"))  # 40 of 48

    with pytest.raises(ProgramError, match="byte 40 of its 48"):
        _out_program([4, 3], instrs)


INDEX_FORMS = [
    # (name, kernel shape, store index, covers the 12 elements of out [4, 3])
    ("row_major", (4, 3), _op("add", _op("mul", _i(0), _c(3)), _i(1)), True),
    ("transposed", (3, 4), _op("add", _i(0), _op("mul", _i(1), _c(3))), True),
    ("reversed", (12,), _op("sub", _c(11), _i(0)), True),
    ("negated", (12,), _op("add", _op("neg", _i(0)), _c(11)), True),
    ("const_times_idx", (12,), _op("mul", _c(1), _i(0)), True),
    ("cast_int64", (12,), ir.Op("cast", (_i(0),), "int64"), True),
    ("folded", (4, 3), _op("add", _op("add", _op("mul", _i(0), _c(2)), _i(0)), _i(1)), True),
    ("half", (6,), _i(0), False),
    ("evens", (6,), _op("mul", _i(0), _c(2)), False),
    ("idx_times_idx", (4, 3), _op("mul", _i(0), _i(1)), False),
    ("floordiv", (12,), _op("floordiv", _i(0), _c(1)), False),     # covers, but not affine
    ("clamped", (12,), _op("minimum", _i(0), _c(11)), False),      # covers, but not affine
    ("loaded", (12,), _op("add", _i(0), _op("mul", ir.Load(1, _c(0), "int64"), _c(0))),
     False),
]


@pytest.mark.parametrize("name,shape,index,covers", INDEX_FORMS,
                         ids=[f[0] for f in INDEX_FORMS])
def test_kernel_stores_cover_exactly_their_affine_index_set(name: str, shape: tuple,
                                                            index: ir.Expr,
                                                            covers: bool) -> None:
    args = (ir.Arg("float32", "w"), ir.Arg("int64", "r"))
    k = ir.Kernel(f"k_{name}", shape, (), args,
                  (ir.Store(0, index, ir.Const(1.0, "float32")),))

    def instrs(b: ProgramBuilder, x: int, o: int) -> None:
        b.kernel(k, [b.alias(o, [12], [1], 0), b.constant("c", np.zeros(1, np.int64))])

    if covers:
        _out_program([4, 3], instrs)
    else:
        with pytest.raises(ProgramError, match="is never written"):
            _out_program([4, 3], instrs)


@pytest.mark.parametrize("rshape,covers", [((3,), True), ((0,), False)])
def test_a_store_in_the_reduce_loop_covers_outer_times_reduce(rshape: tuple,
                                                               covers: bool) -> None:
    """out[i * 3 + j] over outer (4,) and reduce dim j (as layer norms store): all 12, or
    none when the reduce domain is empty (the loop never runs)."""
    k = ir.Kernel("k_inner", (4,), rshape, (ir.Arg("float32", "w"),),
                  (ir.Store(0, _op("add", _op("mul", _i(0), _c(3)), _i(1)),
                            ir.Const(1.0, "float32")),))

    def instrs(b: ProgramBuilder, x: int, o: int) -> None:
        b.kernel(k, [b.alias(o, [12], [1], 0)])

    if covers:
        _out_program([4, 3], instrs)
    else:
        with pytest.raises(ProgramError, match="never written"):
            _out_program([4, 3], instrs)


def test_interleaved_strided_stores_are_marked_byte_by_byte() -> None:
    evens = _store_kernel("k_even", (6,), _op("mul", _i(0), _c(2)), 12)
    odds = _store_kernel("k_odd", (6,), _op("add", _op("mul", _i(0), _c(2)), _c(1)), 12)

    def instrs(b: ProgramBuilder, x: int, o: int) -> None:
        flat = b.alias(o, [12], [1], 0)
        b.kernel(evens, [flat])
        b.kernel(odds, [flat])

    _out_program([12], instrs)
    with pytest.raises(ProgramError, match="byte 4 of its 48"):
        _out_program([12], lambda b, x, o: b.kernel(evens, [b.alias(o, [12], [1], 0)]))


def test_sparse_writes_into_an_output_over_the_map_limit_are_refused() -> None:
    from aotrt.limits import Limits

    evens = _store_kernel("k_even", (6,), _op("mul", _i(0), _c(2)), 12)
    odds = _store_kernel("k_odd", (6,), _op("add", _op("mul", _i(0), _c(2)), _c(1)), 12)

    def instrs(b: ProgramBuilder, x: int, o: int) -> None:
        flat = b.alias(o, [12], [1], 0)
        b.kernel(evens, [flat])
        b.kernel(odds, [flat])

    p = _out_program([12], instrs)
    with pytest.raises(ProgramError, match="bytes to map.*48 exceeds the load limit "
                                           "max_coverage_bytes=47"):
        p.validate(Limits(max_coverage_bytes=47))
    # Dense writes need no map, whatever the output's size.
    q = _out_program([12], lambda b, x, o: b.copy(o, x))
    q.validate(Limits(max_coverage_bytes=0))


#: lines of aotrt code a build of a small program may run (tests/support.bounded_steps)
FEW_STEPS = 200_000
#: lines that a pass independent of a size may run more on the big size than on the small one
#: (a branch on the number's magnitude; a pass over the elements would run millions more)
SIZE_SLACK = 200


def _steps(fn: Callable[[], Any]) -> int:
    """Lines of aotrt code that `fn()` runs (at most FEW_STEPS, else TooMuchWork)."""
    with bounded_steps(FEW_STEPS) as steps:
        fn()
    return steps.count


def test_huge_outputs_are_covered_in_time_independent_of_their_size() -> None:
    """A 2**37-byte output written by two dense halves (validate only, no allocation) costs
    what a 2**12-byte one does."""
    def halves(n: int) -> ProgramBuilder:
        b = ProgramBuilder("Huge")
        x = b.input("x", "float32", [256, n])
        o = b.output("o", "float32", [256, n])
        for part in (1, 0):
            b.copy(b.alias(o, [128, n], [n, 1], part * 128 * n),
                   b.alias(x, [128, n], [n, 1], part * 128 * n))
        return b

    huge, small = halves(1 << 27), halves(4)
    assert _steps(huge.build) <= _steps(small.build) + SIZE_SLACK


def test_outputs_without_elements_need_no_write() -> None:
    _out_program([0, 3], lambda b, x, o: None)


def test_a_sixty_four_byte_marking_is_o_bytes_even_for_overlapping_strides() -> None:
    """A stride-0 dim of 2**30 elements writes one element: marking it costs what a
    stride-0 dim of 2 does."""
    k_odd = _store_kernel("k_odd", (6,), _op("add", _op("mul", _i(0), _c(2)), _c(1)), 12)

    def marking(n: int) -> Callable[[], Program]:
        k = ir.Kernel("k_rep", (12, n), (), (ir.Arg("float32", "w"),),
                      (ir.Store(0, _op("add", _op("mul", _i(0), _c(1)),
                                       _op("mul", _i(1), _c(0))), ir.Const(1.0, "float32")),))

        def instrs(b: ProgramBuilder, x: int, o: int) -> None:
            flat = b.alias(o, [12], [1], 0)
            b.kernel(k, [flat])
            b.kernel(k_odd, [flat])
        return lambda: _out_program([12], instrs)

    assert _steps(marking(1 << 30)) <= _steps(marking(2)) + SIZE_SLACK


# -- library ops are checked at load (issue 7, item 12) ---------------------------------------


def _lib_program(fn: str, params: dict, a_shape=(4, 3), b_shape=(3, 5), dtype="float32",
                 out_shape=(4, 5)) -> Program:
    b = ProgramBuilder("Lib")
    a = b.input("a", dtype, list(a_shape))
    bb = b.input("b", dtype, list(b_shape))
    o = b.output("o", "float32", list(out_shape))
    b.library(fn, [o], [a, bb], params)
    return b.build()


def test_good_library_instruction_is_accepted() -> None:
    _lib_program("mm", {})


LIB_BAD = [
    ("unknown_op", dict(fn="frobnicate", params={}), r"instructions\[0\] \(library\)\.fn: "
                                                     r"library op 'frobnicate' is not"),
    ("unknown_param", dict(fn="mm", params={"stride": 1}),
     r"\(library\)\.params: library op mm: params: unknown \['stride'\]"),
    ("inner_dims", dict(fn="mm", params={}, b_shape=(4, 5)),
     r"\(library\): library op mm: b: K mismatch, a is \[4, 3\] and b \[4, 5\]"),
    ("out_shape", dict(fn="mm", params={}, out_shape=(4, 6)),
     r"\(library\): library op mm: out: expected sizes \[4, 5\], got \[4, 6\]"),
    ("int_dtype", dict(fn="mm", params={}, dtype="int32"),
     r"\(library\): library op mm: a: dtype int32 does not match out's float32"),
    ("bmm_rank", dict(fn="bmm", params={}),
     r"\(library\): library op bmm: a: expected a 3-D tensor, got 2-D \[4, 3\]"),
]


@pytest.mark.parametrize("name,kw,match", LIB_BAD, ids=[c[0] for c in LIB_BAD])
def test_bad_library_instruction_is_refused_at_load(name: str, kw: dict, match: str) -> None:
    with pytest.raises(ProgramError, match=match):
        _lib_program(**kw)


def _conv_program(params: dict) -> Program:
    b = ProgramBuilder("Conv")
    x = b.input("x", "float32", [1, 2, 8, 8])
    w = b.constant("w", np.ones((3, 2, 3, 3), np.float32))
    o = b.output("o", "float32", [1, 3, 6, 6])
    b.library("convolution", [o], [x, w, None], params)
    return b.build()


@pytest.mark.parametrize("params,field", [
    ({"stride": [0, 1]}, "stride"), ({"stride": [1, 1, 1]}, "stride"),
    ({"padding": [-1, 0]}, "padding"), ({"dilation": [0, 0]}, "dilation"),
    ({"groups": 0}, "groups"), ({"stride": "x"}, "stride"),
])
def test_bad_convolution_params_name_their_field(params: dict, field: str) -> None:
    with pytest.raises(ProgramError, match=rf"instructions\[0\] \(library\)\.params\.{field}"):
        _conv_program(params)


def test_good_convolution_is_accepted() -> None:
    _conv_program({"stride": [1, 1], "padding": [0, 0]})


def test_bad_max_pool2d_kernel_size_names_its_field() -> None:
    b = ProgramBuilder("Pool")
    x = b.input("x", "float32", [1, 1, 4, 4])
    o = b.output("o", "float32", [1, 1, 2, 2])
    b.library("max_pool2d", [o], [x], {"kernel_size": [2, 2, 2]})
    with pytest.raises(ProgramError, match=r"\(library\)\.params\.kernel_size"):
        b.build()


# -- safetensors headers of every wrong type (issue 7, item 9) ---------------------------------


def _st_bytes(header: Any, body: bytes = b"\0" * 16) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


GOOD_ENTRY = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
ST_BAD = [
    ("dtype_list", {"dtype": ["F32"]}), ("dtype_int", {"dtype": 3}),
    ("dtype_dict", {"dtype": {"a": 1}}), ("dtype_null", {"dtype": None}),
    ("dtype_bool", {"dtype": True}), ("shape_str", {"shape": "2,2"}),
    ("shape_float", {"shape": [2.0, 2]}), ("shape_nan", {"shape": [float("nan"), 2]}),
    ("shape_inf", {"shape": [float("inf"), 2]}), ("shape_bool", {"shape": [True, 4]}),
    ("shape_nested", {"shape": [[2], 2]}), ("shape_negative", {"shape": [-2, -2]}),
    ("offsets_dict", {"data_offsets": {"0": 16}}), ("offsets_float", {"data_offsets": [0, 16.0]}),
    ("offsets_nan", {"data_offsets": [float("nan"), 16]}), ("offsets_one", {"data_offsets": [0]}),
    ("offsets_huge", {"data_offsets": [0, 1 << 70]}), ("offsets_null", {"data_offsets": None}),
]


@pytest.mark.parametrize("name,change", ST_BAD, ids=[c[0] for c in ST_BAD])
def test_wrong_typed_safetensors_fields_are_program_errors(name: str, change: dict) -> None:
    read_safetensors(_st_bytes({"t": GOOD_ENTRY}))
    with pytest.raises(ProgramError):
        read_safetensors(_st_bytes({"t": {**GOOD_ENTRY, **change}}))


@pytest.mark.parametrize("header", [[], "x", 3, None, {"t": []}, {"t": "F32"},
                                    {"__metadata__": []}, {"__metadata__": {"a": 1}},
                                    {"__metadata__": {"a": ["b"]}}])
def test_wrong_typed_safetensors_structures_are_program_errors(header: Any) -> None:
    with pytest.raises(ProgramError):
        read_safetensors(_st_bytes(header))


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                       st.sampled_from(["F32", "I64", "BOOL", "BF16", "dtype", "shape",
                                        "data_offsets", "__metadata__"]))
_json = st.recursive(_json_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=4),
    st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "t", "__metadata__",
                                     METADATA_KEY]), kids, max_size=4)), max_leaves=12)
_entry = st.fixed_dictionaries({}, optional={"dtype": _json, "shape": _json,
                                             "data_offsets": _json, "x": _json})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=st.one_of(_json, st.dictionaries(st.text(max_size=3), st.one_of(_entry, _json),
                                               max_size=3)),
       body=st.binary(max_size=40))
def test_read_safetensors_is_total_over_hostile_headers(header: Any, body: bytes) -> None:
    try:
        meta, arrays = read_safetensors(_st_bytes(header, body))
    except ProgramError:
        return
    assert isinstance(meta, dict) and isinstance(arrays, dict)


def test_save_refuses_ir_whose_tree_would_not_fit_a_file(tmp_path: Path) -> None:
    """A shared expression of 2**60 tree nodes validates (linear) but cannot be saved."""
    e: ir.Expr = ir.Load(0, ir.Idx(0), "float32")
    for _ in range(60):
        e = ir.Op("add", (e, e), "float32")
    k = ir.Kernel("k_dag", (3,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, [1], e),))
    b = ProgramBuilder("Dag")
    x = b.input("x", "float32", [3])
    o = b.output("o", "float32", [3])
    b.kernel(k, [x, o])
    # Linear in the 60 distinct nodes: never near the 2**60 of the tree.
    with bounded_steps(FEW_STEPS):
        p = b.build()
        with pytest.raises(ProgramError,
                           match=r"kernels\[0\] k_dag: its IR expands to more than"):
            p.save(tmp_path / "dag.aotp")


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "int8", "uint8"])
@pytest.mark.parametrize("special", ["nan", "inf", "-inf"])
def test_nan_or_inf_integer_constants_are_refused(tmp_path: Path, dtype: str,
                                                  special: str) -> None:
    doc, arrays = doc_and_arrays()
    index = doc["kernels"][0]["stores"][0]["index"]
    doc["kernels"][0]["stores"][0]["index"] = {
        "t": "Op", "op": "add", "dtype": "int64", "args": [
            index, {"t": "Op", "op": "cast", "dtype": "int64", "args": [
                {"t": "Const", "value": {"t": "float", "v": special}, "dtype": dtype}]}]}
    with pytest.raises(ProgramError, match="not an integer"):
        load_doc(tmp_path, doc, arrays)


# -- internal errors are bugs, not refusals (issue 34 item 5) ----------------------------------


def test_a_malformed_node_in_a_hand_built_program_is_named() -> None:
    p = small_program()
    idx = p.kernels[0].stores[0].value.args[0].index
    while not isinstance(idx, ir.Idx):
        idx = idx.args[0]
    object.__setattr__(idx, "dim", "x")
    # Before: "invalid program: TypeError: '<=' not supported between ..."
    with pytest.raises(ProgramError, match=r"kernels\[0\].*Idx\.dim: expected an integer"):
        p.validate()


def test_an_exception_inside_the_validator_is_not_a_refusal(monkeypatch: Any) -> None:
    from aotrt.program import validate

    def broken(self: Any) -> None:
        raise AttributeError("a bug of the validator")

    monkeypatch.setattr(validate.Validator, "_outputs_tensors", broken)
    with pytest.raises(AttributeError, match="a bug of the validator"):
        small_program().validate()


def test_a_wrong_typed_ir_field_in_a_file_names_it(tmp_path: Path) -> None:
    doc, arrays = doc_and_arrays()
    doc["kernels"][0]["args"][0]["mode"] = ["r"]
    with pytest.raises(ProgramError, match=r"kernels\[0\]: invalid kernel IR: IR node "
                                           r"Arg\.mode: expected a string, got list"):
        load_doc(tmp_path, doc, arrays)
