"""aotrt/limits.py and the load-time budget of aotrt/program/: tiny hostile files that ask
for huge work, scratch, memory or compile time are refused fast, before anything runs; real
programs pass; a caller raises a limit explicitly."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest

import aotrt
from aotrt.errors import InvalidArgument, ProgramError
from aotrt.kernels import ir
from aotrt.limits import DEFAULT, Limits
from aotrt.analysis import kernel_cost
from aotrt.exporter.builder import ProgramBuilder
from aotrt.program import Program
from aotrt.runtime.ops import TensorMeta, check
from tests.support import bounded_steps

BIG = (1 << 31) - 1
#: lines of aotrt code a hostile example may run before it is refused: its size is in its
#: numbers, never in its bytes, so a check that loops over a size or expands shared IR runs
#: far more (a deterministic stand-in for "refused fast"; speed lives in the benchmarks)
FEW_STEPS = 200_000
#: lines per instruction or distinct IR node that a linear pass over a program may run
STEPS_PER_ITEM = 500


def view(root: str, index: int, sizes: Sequence[int], strides: Sequence[int] | None = None,
         dtype: str = "float32", byte_offset: int = 0) -> dict[str, Any]:
    if strides is None:
        strides, acc = [], 1
        for n in reversed(sizes):
            strides.insert(0, acc)
            acc *= n
    return {"root": root, "index": index, "byte_offset": byte_offset, "dtype": dtype,
            "sizes": list(sizes), "strides": list(strides)}


def _spec(name: str, shape: Sequence[int], dtype: str = "float32") -> dict[str, Any]:
    v = view("input", 0, shape, dtype=dtype)
    return {"name": name, "dtype": dtype, "shape": list(shape), "strides": v["strides"]}


def program(tensors: list[dict], instructions: list[dict], kernels: Sequence[ir.Kernel] = (),
            arena: int = 64, inputs: Sequence[dict] = (), out_shape: Sequence[int] = (4,),
            ) -> Program:
    """A program with output 0 (float32 `out_shape`) as tensor 0; `tensors` follow it."""
    out = view("output", 0, out_shape)
    return Program(inputs=list(inputs), outputs=[_spec("out", out_shape)], arena_nbytes=arena,
                   tensors=[out, *tensors], kernels=list(kernels), instructions=instructions,
                   outputs_tensors=[0])


def refused(p: Program, match: str, limits: Limits | None = None,
            steps: int = FEW_STEPS) -> ProgramError:
    """The ProgramError validating `p` raises, after at most `steps` lines of aotrt."""
    with pytest.raises(ProgramError, match=match) as e, bounded_steps(steps):
        p.validate(limits)
    return e.value


def one_store_kernel(name: str, shape: Sequence[int], rshape: Sequence[int] = (),
                     value: ir.Expr | None = None) -> ir.Kernel:
    """Stores `value` (default 1.0) into element 0 of its only argument, at every step."""
    v = value if value is not None else ir.Const(1.0, "float32")
    return ir.Kernel(name, tuple(shape), tuple(rshape), (ir.Arg("float32", "w"),),
                     (ir.Store(0, ir.Const(0, "int64"), v),))


def write_out() -> dict:
    """An instruction that writes all of output 0 (tensor 0): a copy onto itself."""
    return {"op": "copy", "dst": 0, "src": 0}


# -- the Limits object -------------------------------------------------------------------------


def test_defaults_are_documented_ints() -> None:
    assert aotrt.Limits is Limits
    assert DEFAULT == Limits()
    assert DEFAULT.max_work == 1 << 48 and DEFAULT.max_kernels == 4096
    assert DEFAULT.max_scratch_bytes == 8 << 30 and DEFAULT.max_memory_bytes == 256 << 30
    text = open("docs/limits.md").read()
    for name in Limits.__dataclass_fields__:
        assert name in text, name


@pytest.mark.parametrize("bad", [-1, 1.5, True, "9", None])
def test_limits_refuse_non_ints(bad: Any) -> None:
    with pytest.raises(InvalidArgument, match="Limits.max_work"):
        Limits(max_work=bad)


def test_validate_refuses_a_non_limits_object() -> None:
    p = program([], [write_out()])
    with pytest.raises(InvalidArgument, match="limits: expected an aotrt.Limits"):
        p.validate({"max_work": 1})


# -- the hostile examples, each refused fast ---------------------------------------------


def test_stride0_view_of_2_62_elements_is_refused() -> None:
    huge = view("arena", 0, [BIG, BIG, 2], [0, 0, 0])       # 2**63 elements, 4 bytes
    ins = {"op": "copy", "dst": 1, "src": 2}
    p = program([huge, huge], [ins, write_out()])
    err = refused(p, "work of one run")
    assert "max_work" in str(err) and "aotrt.Limits(max_work=" in str(err)


@pytest.mark.parametrize("shape,rshape", [((1 << 30, BIG), ()),
                                          ((2,), (1 << 30, 1 << 30)),
                                          ((1 << 20,), (1 << 21,))])
def test_kernel_of_2_61_iterations_is_refused(shape: tuple, rshape: tuple) -> None:
    if rshape:
        body = ir.Reduce("sum", ir.Const(1.0, "float32"), "float32")
        k = one_store_kernel("k", shape, rshape, body)
    else:
        k = one_store_kernel("k", shape)
    p = program([view("arena", 0, [1])], [{"op": "kernel", "name": "k", "args": [1]},
                                           write_out()], [k])
    refused(p, r"kernels\[0\] k: loop iterations.*max_kernel_iterations")


def test_every_reduce_loop_counts() -> None:
    """Two reductions run two loops; a reduction nested in another is computed once per outer
    element before the loop that uses it (as the renderers emit it), so it adds one loop."""
    r = ir.Reduce("sum", ir.Const(1.0, "float32"), "float32")
    two = ir.Op("add", (r, ir.Reduce("max", ir.Const(2.0, "float32"), "float32")), "float32")
    assert kernel_cost(one_store_kernel("a", (3,), (5,), r), 1 << 40)[1] == 3 * (1 + 5)
    assert kernel_cost(one_store_kernel("b", (3,), (5,), two), 1 << 40)[1] == 3 * (1 + 10)
    nested = ir.Reduce("sum", r, "float32")
    assert kernel_cost(one_store_kernel("c", (3,), (5,), nested), 1 << 40)[1] == \
        3 * (1 + 5 + 5)
    # A chain of 5,000 nested reductions costs 5,001 loops, in linear time.
    deep: ir.Expr = r
    for _ in range(5000):
        deep = ir.Reduce("sum", deep, "float32")
    with bounded_steps(STEPS_PER_ITEM * 5001):
        assert kernel_cost(one_store_kernel("d", (3,), (5,), deep), 1 << 40)[1] == \
            3 * (1 + 5 * 5001)
    # ... and saturates just above the cap when the loops are long.
    assert kernel_cost(one_store_kernel("e", (3,), (1 << 40,), deep), 1 << 40)[1] == \
        (1 << 40) + 1


@pytest.mark.parametrize("rshape", [(1,), (5,)])
def test_reductions_nested_past_the_format_limit_are_refused(rshape: tuple) -> None:
    """The renderers recurse once per nested reduction: a file nesting 5,001 is refused
    (even over one reduce element, where the loops cost nothing), 64 are accepted."""
    def nested(n: int) -> ir.Expr:
        e: ir.Expr = ir.Const(1.0, "float32")
        for _ in range(n):
            e = ir.Reduce("sum", e, "float32")
        return e

    def prog(n: int) -> Program:
        k = one_store_kernel("k", (3,), rshape, nested(n))
        return program([view("arena", 0, [1])], [{"op": "kernel", "name": "k", "args": [1]},
                                                 write_out()], [k])
    refused(prog(5001), r"kernels\[0\] k: reductions nest 5001 deep, more than 64",
            steps=STEPS_PER_ITEM * 5001)
    prog(64).validate()


def test_layer_norm_of_a_layer_norm_fits() -> None:
    """Swin-v2's post-norm block fused with the final norm: four reductions nested four deep
    over 768 channels of 7x7 tokens (once refused as 768**4 iterations per token)."""
    x = ir.Load(0, ir.Idx(2), "float32")
    c = ir.Const(1.0 / 768, "float32")

    def norm(v: ir.Expr) -> ir.Expr:
        mean = ir.Op("mul", (ir.Reduce("sum", v, "float32"), c), "float32")
        d = ir.Op("sub", (v, mean), "float32")
        var = ir.Op("mul", (ir.Reduce("sum", ir.Op("mul", (d, d), "float32"), "float32"), c),
                    "float32")
        return ir.Op("mul", (d, ir.Op("rsqrt", (var,), "float32")), "float32")

    out = norm(ir.Op("add", (x, norm(x)), "float32"))
    k = ir.Kernel("ln2", (7, 7), (768,), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, ir.Idx(2), out),))
    assert kernel_cost(k, 1 << 40)[1] == 49 * (1 + 768 * 5)


def test_max_pool2d_with_a_2_28_kernel_is_refused() -> None:
    # A one-element input seen through stride-0 dims: a kilobyte file, 2**50 window taps.
    k = 1 << 14
    x = view("input", 0, [1, 1, 2047 + k, 2047 + k], [0, 0, 0, 0])
    out = view("arena", 0, [1, 1, 2048, 2048])
    lib = {"op": "library", "fn": "max_pool2d", "outs": [2], "ins": [1],
           "params": {"kernel_size": [k, k], "stride": [1, 1]}}
    p = program([x, out], [lib, write_out()], arena=4 << 22, inputs=[_spec("x", [1])])
    refused(p, r"instructions\[0\] \(library\) max_pool2d: work of this op.*max_work")


def test_convolution_padding_asking_for_16_gib_is_refused() -> None:
    x = view("input", 0, [1, 1, 1, 1], [0, 0, 0, 0])
    w = view("input", 0, [1, 1, 1, 1], [0, 0, 0, 0])
    out = view("arena", 0, [1, 1, 2, 2])
    lib = {"op": "library", "fn": "convolution", "outs": [3], "ins": [1, 2, None],
           "params": {"stride": [1 << 16, 1 << 16], "padding": [1 << 15, 1 << 15]}}
    p = program([x, w, out], [lib, write_out()], inputs=[_spec("x", [1])])
    refused(p, r"instructions\[0\] \(library\) convolution: scratch bytes.*max_scratch_bytes")
    # Raising the limit explicitly accepts it (validate only: nothing is allocated).
    p.validate(Limits(max_scratch_bytes=1 << 40))


def test_6000_kernels_are_refused_before_compiling() -> None:
    ks = [one_store_kernel(f"k{i}", (1,)) for i in range(6000)]
    ins = [{"op": "kernel", "name": f"k{i}", "args": [1]} for i in range(6000)]
    p = program([view("arena", 0, [1])], [*ins, write_out()], ks)
    refused(p, r"kernels: 6000 exceeds the load limit max_kernels=4096")
    doc = p.to_json()
    # Refused in a linear pass over the file, before anything compiles.
    with pytest.raises(ProgramError, match="max_kernels"), \
            bounded_steps(STEPS_PER_ITEM * 6000):
        Program.from_json(doc, {})
    p.validate(Limits(max_kernels=6000))


def big_expression(n: int) -> ir.Expr:
    """An n-node float expression over Load(0, Idx(0)), every node shared by the next."""
    e: ir.Expr = ir.Load(0, ir.Idx(0), "float32")
    for i in range(n):
        e = ir.Op("add" if i % 2 else "mul", (e, e), "float32")
    return e


def test_one_big_expression_shared_by_20000_instructions_is_linear() -> None:
    e = big_expression(8000)
    k = ir.Kernel("k", (4,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, ir.Idx(0), e),))
    ins = [{"op": "kernel", "name": "k", "args": [1, 0]} for _ in range(20000)]
    p = program([view("arena", 0, [4])], ins, [k])
    # Its tree has 2**8000 nodes, and a walk per use would visit 8000 * 20000: a linear
    # pass runs a bounded number of lines per instruction and per distinct node.
    with bounded_steps(STEPS_PER_ITEM * (20000 + 8000)):
        p.validate()
        p.summary()


def test_ir_nodes_are_counted_once_per_kernel_and_limited() -> None:
    e = big_expression(300)
    k = ir.Kernel("k", (4,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, ir.Idx(0), e),))
    assert kernel_cost(k, 1 << 40)[0] == 300 + 4     # the ops, a Load, two Idx, the Store
    p = program([view("arena", 0, [4])], [{"op": "kernel", "name": "k", "args": [1, 0]}], [k])
    p.validate(Limits(max_ir_nodes=304))
    refused(p, r"IR nodes so far: 304 exceeds the load limit max_ir_nodes=303",
            Limits(max_ir_nodes=303))


def test_instructions_are_limited() -> None:
    p = program([], [write_out()] * 11)
    p.validate(Limits(max_instructions=11))
    refused(p, "instructions: 11 exceeds the load limit max_instructions=10",
            Limits(max_instructions=10))


def test_work_adds_up_over_instructions() -> None:
    # 4 copies of 4 elements and a kernel of 3 x (1 + 5) iterations: 16 + 18 = 34 steps.
    r = ir.Reduce("sum", ir.Const(1.0, "float32"), "float32")
    k = one_store_kernel("k", (3,), (5,), r)
    ins = [write_out()] * 4 + [{"op": "kernel", "name": "k", "args": [1]}]
    p = program([view("arena", 0, [1])], ins, [k])
    p.validate(Limits(max_work=34))
    refused(p, "work of one run .elementary steps.: 34 exceeds the load limit max_work=33",
            Limits(max_work=33))


def test_library_work_and_scratch_come_from_the_op_check() -> None:
    a = view("arena", 0, [8, 16])
    bmat = view("arena", 0, [16, 4])
    out = view("output", 0, [8, 4])
    lib = {"op": "library", "fn": "mm", "outs": [0], "ins": [1, 2]}
    p = Program(inputs=[], outputs=[_spec("out", [8, 4])], arena_nbytes=512,
                tensors=[out, a, bmat], instructions=[lib], outputs_tensors=[0])
    cost = check("mm", [TensorMeta("float32", (8, 4), (4, 1))],
                 [TensorMeta("float32", (8, 16), (16, 1)), TensorMeta("float32", (16, 4), (4, 1))],
                 {})
    assert cost.work >= 8 * 16 * 4
    p.validate(Limits(max_work=cost.work, max_scratch_bytes=cost.scratch_bytes))
    refused(p, f"max_work={cost.work - 1}", Limits(max_work=cost.work - 1))
    if cost.scratch_bytes:
        refused(p, "max_scratch_bytes", Limits(max_scratch_bytes=cost.scratch_bytes - 1))


# -- memory and int64 sizes (issue item 10) ------------------------------------------------------


def test_a_3_gib_arena_is_accepted_and_a_huge_one_refused_for_its_size() -> None:
    p = program([], [write_out()], arena=3 << 30)
    p.validate()
    p = program([], [write_out()], arena=1 << 61)
    err = refused(p, r"memory bytes \(arena \+ constants \+ inputs \+ outputs\)")
    assert "max_memory_bytes" in str(err)
    p.validate(Limits(max_memory_bytes=1 << 62))


def test_inputs_and_outputs_over_int32_bytes_validate() -> None:
    """Sizes are int64 end to end: a 2**40-byte input and a 2**33-byte output (validate
    only; nothing is allocated), and their sum counts against max_memory_bytes."""
    x = _spec("x", [1 << 20, 1 << 18])       # 2**40 bytes of float32
    out = view("output", 0, [1 << 30, 4])
    p = Program(inputs=[x], outputs=[_spec("out", [1 << 30, 4])], arena_nbytes=0,
                tensors=[out], instructions=[write_out()], outputs_tensors=[0])
    refused(p, "max_memory_bytes=")
    p.validate(Limits(max_memory_bytes=1 << 41))


# -- through aotrt.load and the Delegate ---------------------------------------------------------


def tiny() -> Program:
    b = ProgramBuilder("Tiny")
    x = b.input("x", "float32", [4])
    o = b.output("o", "float32", [4])
    b.copy(o, x)
    return b.build()


def test_load_and_delegate_pass_limits_on(tmp_path: Any) -> None:
    path = tmp_path / "t.aotp"
    tiny().save(path)
    tight = Limits(max_work=3)
    for target in (path, tiny()):
        with pytest.raises(ProgramError, match="max_work=3"):
            aotrt.load(target, device="cpu", limits=tight)
    with pytest.raises(ProgramError, match="max_work=3"):
        aotrt.Delegate(tiny(), device="cpu", limits=tight)
    with pytest.raises(ProgramError, match="max_work=3"):
        Program.load(path, limits=tight)
    with aotrt.load(path, device="cpu", limits=Limits(max_work=4)) as m:
        x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
        np.testing.assert_array_equal(m.run(x)[0].numpy(), x)


def test_delegate_validates_a_program_edited_after_build() -> None:
    p = tiny()
    p.instructions.clear()              # now the output is never written
    with pytest.raises(ProgramError, match="never written"):
        aotrt.Delegate(p, device="cpu")


def test_arena_is_zeroed_for_every_new_delegate() -> None:
    """A program that reads arena bytes before writing them sees zeros, never the data of
    a previous delegate whose freed arena the pool hands out again."""
    def build(leave: bool) -> Program:
        b = ProgramBuilder("Arena")
        x = b.input("x", "float32", [256])
        o = b.output("o", "float32", [256])
        t = b.in_buffer(b.buffer(1024), 0, "float32", [256])
        if leave:
            b.copy(t, x)        # leaves x in the arena
        b.copy(o, t)
        return b.build(arena_nbytes=1024)

    x = (np.random.default_rng(1).standard_normal(256) + 10).astype(np.float32)
    for _ in range(3):
        with aotrt.load(build(True), device="cpu") as m:
            np.testing.assert_array_equal(m.run(x)[0].numpy(), x)
        with aotrt.load(build(False), device="cpu") as m:
            np.testing.assert_array_equal(m.run(x)[0].numpy(), np.zeros(256, np.float32))
