"""Tests for aotrt/runtime/replays.py: what a delegate replays instead of building its steps
at each run (the static-I/O plan of host devices; the CUDA graph is tested on cuda in
tests/runtime/backends/cuda/test_device.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import aotrt
from aotrt import dtypes
from aotrt.errors import HazardError, InvalidArgument
from aotrt.program.records import NO_PARAMS, InstructionRecord, TensorRecord
from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.replays import StaticIO, lean_ok
from tests.runtime.test_delegate import failing_mm, rand, seed_program, seed_reference


@pytest.fixture
def stream():
    s = get_device("cpu").create_stream(StreamOptions())
    yield s
    s.close()


#: what `_two_steps` records, once
ONCE = [("instruction #0", 0), ("instruction #0", 1), ("instruction #1", 0),
        ("instruction #1", 1)]


def _two_steps(stream) -> tuple[StaticIO, list[tuple[str, int]]]:
    """A plan of two steps of two commands each, and the list their work appends to."""
    ran: list[tuple[str, int]] = []
    p = StaticIO(stream)
    for label in ("instruction #0", "instruction #1"):
        with stream.planning() as cmds:
            for k in range(2):
                stream.record([], lambda label=label, k=k: ran.append((label, k)), "cmd")
        p.steps.append((label, tuple(cmds)))
    return p, ran


def test_queue_replays_every_command_under_its_label_in_order(stream) -> None:
    p, ran = _two_steps(stream)
    assert ran == []                    # planned, not run
    for _ in range(2):
        p.queue()
    stream.commit_and_wait()
    assert ran == ONCE * 2
    assert stream.label == ""


@pytest.fixture
def no_checker(monkeypatch):
    """The checker off, as by default (tests/conftest.py turns it on for every test)."""
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "0")


def test_without_the_checker_the_plan_is_queued_as_one_command(no_checker) -> None:
    """No checker to see each command: one command runs every step's work in order."""
    s = get_device("cpu").create_stream(StreamOptions(check_hazards=False))
    try:
        p, ran = _two_steps(s)
        for _ in range(2):
            before = s.recorded_seq
            p.queue()
            assert s.recorded_seq == before + 1
        s.commit_and_wait()
        assert ran == ONCE * 2
    finally:
        s.close()


def test_a_failing_step_of_the_one_command_is_named(no_checker) -> None:
    s = get_device("cpu").create_stream(StreamOptions(check_hazards=False))
    try:
        def fail() -> None:
            raise InvalidArgument("kernel k3: division by zero")
        p = StaticIO(s)
        for label, work in (("instruction #0", lambda: None), ("instruction #1", fail)):
            with s.planning() as cmds:
                s.record([], work, "cmd")
            p.steps.append((label, tuple(cmds)))
        p.queue()
        with pytest.raises(InvalidArgument, match="division by zero") as e:
            s.commit_and_wait()
        assert "in instruction #1" in getattr(e.value, "__notes__", [])
    finally:
        s.close()


@pytest.mark.parametrize("check_hazards", [False, True])
def test_back_to_back_runs_each_read_their_own_input(monkeypatch, check_hazards: bool
                                                     ) -> None:
    """run() copies a host input into the static buffer itself (checker off) only once the
    last run is done with it: runs queued back to back, never waited for, each match."""
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "1" if check_hazards else "0")
    prog = seed_program()
    with aotrt.load(prog, device="cpu", check_hazards=check_hazards) as m:
        xs = [rand([12, 7], seed=s) for s in range(100, 106)]
        outs = [m.run(x) for x in xs]
        for x, o in zip(xs, outs):
            for got, want in zip(o, seed_reference(prog, x)):
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_a_lean_run_puts_every_output_in_one_fresh_allocation(no_checker) -> None:
    """Without the checker a run of host arrays takes the lean path: its four outputs are
    views of one fresh allocation, each matches, one released leaves the others readable,
    and the memory goes with the last of them."""
    prog = seed_program()
    with aotrt.load(prog, device="cpu") as m:
        x = rand([12, 7], seed=31)
        m.run(x)                       # the plan is built on the first run
        m.stream.commit_and_wait()
        outs = m.run(x)
        allocs = {o.handle.alloc for o in outs}
        assert len(outs) == 4 and len(allocs) == 1
        alloc = allocs.pop()
        ref = seed_reference(prog, x)
        outs[0].release()
        for got, want in zip(outs[1:], ref[1:]):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
        assert not alloc.freed
        for o in outs[1:]:
            o.release()
        assert alloc.freed


def test_a_lean_run_is_two_commands_and_an_mlp_plan_is_wholly_native(no_checker) -> None:
    """From the second run an MLP's plan is native throughout (its oneDNN matmuls and
    kernels); a lean run records two commands (the plan, the outputs' copy), and each run
    still matches eager."""
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                              torch.nn.Linear(32, 8)).eval()
    prog = aotrt.export(mlp, (torch.randn(4, 16),))
    with aotrt.load(prog, device="cpu") as m:
        if m.device.libraries.dnnl is None or not m.device.libraries.dnnl.gemm_pool:
            pytest.skip("no oneDNN matmul here: the GEMMs run in numpy")
        m.run(rand([4, 16], seed=40))
        m.stream.commit_and_wait()
        p = m._static_io                                   # noqa: SLF001
        assert p.native is not None and p.native.whole
        for seed in (41, 42):
            x = rand([4, 16], seed=seed)
            before = m.stream.recorded_seq
            (out,) = m.run(x)
            assert m.stream.recorded_seq == before + 2
            with torch.no_grad():
                want = mlp.double()(torch.from_numpy(x).double()).numpy()
                mlp.float()
            np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-5)


def test_a_lean_run_is_taken_only_where_the_general_path_is_not_needed(no_checker) -> None:
    """out= tensors, the checker, and an input in memory the runtime knows (a view of an
    aotrt Tensor) each keep the general path; every run still matches."""
    prog = seed_program()
    with aotrt.load(prog, device="cpu") as m:
        x = rand([12, 7], seed=32)
        args = [m._args.classify(x, m.inputs[0], "input 0", False)]   # noqa: SLF001
        assert lean_ok(m.stream, args, None)
        assert not lean_ok(m.stream, args, [])
        t = aotrt.Tensor.from_numpy(x)
        view = np.from_dlpack(t)
        known = [m._args.classify(view, m.inputs[0], "input 0", False)]  # noqa: SLF001
        assert not lean_ok(m.stream, known, None)
        ref = seed_reference(prog, x)
        for got, want in zip(m.run(view), ref):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
        del view
        t.release()
    with aotrt.load(prog, device="cpu", check_hazards=True) as m:
        args = [m._args.classify(x, m.inputs[0], "input 0", False)]   # noqa: SLF001
        assert not lean_ok(m.stream, args, None)


def test_a_replayed_command_on_freed_memory_names_its_instruction() -> None:
    """The hazard checker sees each replayed command as a new one, under its label."""
    from aotrt.runtime.hazards import Access

    dev = get_device("cpu")
    s = dev.create_stream(StreamOptions(check_hazards=True))
    try:
        a = dev.memory.allocate(64, s)
        a.retain()
        p = StaticIO(s)
        with s.planning() as cmds:
            s.record([Access(a, 0, 64, True)], lambda: None, "mm")
        p.steps.append(("instruction #7 library mm", tuple(cmds)))
        p.queue()                       # memory still live: fine
        s.commit_and_wait()
        a.release()
        with pytest.raises(HazardError, match="instruction #7 library mm"):
            p.queue()
    finally:
        s.close()


def test_delete_frees_the_plan_handles_once(stream) -> None:
    dev = stream.device
    with dev.stream_guard(stream):
        base = shims.empty_strided([64], [1], dtypes.uint8, dev)
        view = shims.reinterpret_tensor(base, [4, 4], [4, 1], 0, dtype=dtypes.float32)
    p = StaticIO(stream)
    p.keep += [base, view]
    p.delete()
    assert base.state != "live" and view.state != "live"
    p.delete()                          # a second time does nothing
    assert p.keep == []


def test_a_cpu_delegate_builds_its_per_run_steps_once_over_static_buffers() -> None:
    """Three runs on inputs of different values each match, and the callers' outputs are
    fresh memory: a later run does not overwrite an earlier result."""
    prog = seed_program()
    with aotrt.load(prog, device="cpu") as m:
        xs = [rand([12, 7], seed=s) for s in (90, 91, 92)]
        outs = [m.run(x) for x in xs]
        for x, o in zip(xs, outs):
            ref = seed_reference(prog, x)
            for got, want in zip(o, ref):
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_a_plan_that_fails_to_build_leaves_nothing_and_the_next_run_builds_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An op that refuses its views while the first run plans: run() raises its error, the
    plan's buffers and views go (the delegate holds what it held before), and the next run
    plans again and matches."""
    state = failing_mm(monkeypatch, armed=True)
    prog = seed_program()
    with aotrt.load(prog, device="cpu") as m:
        static = len(m.owner.handles)
        with pytest.raises(InvalidArgument, match="refused for the test"):
            m.run(rand([12, 7], seed=93))
        assert len(m.owner.handles) == static
        state["on"] = False
        x = rand([12, 7], seed=94)
        for got, want in zip(m.run(x), seed_reference(prog, x)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def _t(root: str, offset: int, sizes: list[int], index: int = 0) -> TensorRecord:
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    return TensorRecord(root, index, offset, dtypes.float32, tuple(sizes), tuple(strides))


def _k(*args: int) -> InstructionRecord:
    return InstructionRecord("kernel", "k", args, (), (), NO_PARAMS, "")


def _lib(outs: list[int], ins: list[int]) -> InstructionRecord:
    return InstructionRecord("library", "op", (), tuple(outs), tuple(ins), NO_PARAMS, "")


def test_an_input_takes_arena_bytes_untouched_until_its_last_reader() -> None:
    from aotrt.runtime.replays import arena_homes

    # 0: input 0 (1 KiB); 1: arena [0, 1 KiB); 2: arena [1 KiB, 2 KiB)
    tensors = [_t("input", 0, [256]), _t("arena", 0, [256]), _t("arena", 1024, [256])]
    # instruction 0 reads the input into tensor 1; tensor 2 is written after, then read
    prog = [_lib([1], [0]), _lib([2], [1]), _k(2)]
    assert arena_homes(tensors, prog, 2048, [1024]) == [1024]
    # read again by the last instruction: tensor 2's bytes are busy before then
    prog = [_lib([1], [0]), _lib([2], [0, 1])]
    assert arena_homes(tensors, prog, 2048, [1024]) == [None]
    assert arena_homes(tensors, prog, 3072, [1024]) == [2048]


def test_bytes_read_before_they_are_written_are_no_home() -> None:
    """A program may read arena bytes it never wrote (it sees zeros): an input's values
    must not show through there. Kernel arguments count as reads, and so does a strided
    write's extent, whose gaps it does not write."""
    from aotrt.runtime.replays import arena_homes

    tensors = [_t("input", 0, [256]), _t("arena", 0, [256]), _t("arena", 1024, [256]),
               dataclasses.replace(_t("arena", 1024, [128]), strides=(2,))]
    assert arena_homes(tensors, [_lib([1], [0]), _k(2)], 2048, [1024]) == [None]
    assert arena_homes(tensors, [_lib([1], [0]), _lib([3], [1]), _lib([1], [2])], 2048,
                       [1024]) == [None]
    assert arena_homes(tensors, [_lib([1], [0]), _lib([2], [1]), _lib([1], [2])], 2048,
                       [1024]) == [1024]
    # an output that is also an input of its op is read first
    assert arena_homes(tensors, [_lib([1], [0]), _lib([2], [1, 2])], 2048, [1024]) == [None]


def test_inputs_get_homes_apart_and_a_never_read_input_any_room() -> None:
    from aotrt.runtime.replays import arena_homes

    tensors = [_t("input", 0, [64], 0), _t("input", 0, [64], 1), _t("arena", 0, [64]),
               _t("arena", 4096, [0])]          # empty: no bytes
    prog = [_lib([2], [0]), _lib([3], [1])]
    homes = arena_homes(tensors, prog, 4096, [256, 256])
    assert homes == [256, 512]                  # past tensor 2, aligned, not overlapping
    # input 0 is never read; tensor 2 is written before anything reads it
    assert arena_homes(tensors, [_lib([2], [1])], 1024, [256, 256]) == [0, 256]


def test_homes_are_aligned_and_inside_the_arena() -> None:
    from aotrt.runtime.replays import HOME_ALIGN, arena_homes

    tensors = [_t("input", 0, [10]), _t("arena", 0, [3]), _t("arena", 300, [5])]
    prog = [_k(0, 1, 2)]
    assert HOME_ALIGN == 256
    assert arena_homes(tensors, prog, 1000, [40]) == [256]      # between the two
    assert arena_homes(tensors, prog, 1000, [60]) == [512]      # too big for that gap
    assert arena_homes(tensors, prog, 560, [60]) == [None]      # past the arena's end


def test_a_replays_static_input_costs_no_memory_of_its_own() -> None:
    """An input read by the first instruction only, into a buffer whose bytes the next
    write overwrites: the static-I/O plan puts the input there, so the first run adds the
    output's buffer and nothing else, and runs on different inputs still match."""
    from aotrt import ProgramBuilder
    from aotrt.runtime.replays import arena_homes

    b = ProgramBuilder("Home")
    x = b.input("x", "float32", [64])
    o = b.output("o", "float32", [64])
    t = b.in_buffer(b.buffer(256), 0, "float32", [64])
    u = b.in_buffer(b.buffer(256), 0, "float32", [64])
    b.copy(t, x)
    b.copy(u, t)
    b.copy(o, u)
    prog = b.build()
    rec = prog.record
    u_at = next(tt.byte_offset for tt in rec.tensors
                if tt.root == "arena" and tt.byte_offset != rec.tensors[
                    rec.instructions[0].outs[0]].byte_offset)
    assert arena_homes(rec.tensors, rec.instructions, prog.arena_nbytes, [256]) == [u_at]
    dev = get_device("cpu")
    with aotrt.load(prog, device="cpu") as m:
        def mine() -> int:
            return sum(1 for a in dev.memory.live() if a.owner is m.owner)
        before = mine()
        for s in (95, 96):
            xv = rand([64], seed=s)
            np.testing.assert_array_equal(np.asarray(m.run(xv)[0]), xv)
        assert mine() - before == len(m.outputs)
