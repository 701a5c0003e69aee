"""Programs with state and several methods: buffers written in place become state that
survives runs, `reset` restores it, loads are independent, methods share state only when
asked, weights are stored once, and a decoder block's prefill and decode match eager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aotrt
from aotrt.errors import InvalidArgument, Unsupported
from tests.conftest import DEVICES
from tests.exporter.harness import rel_err

MAX_LEN = 80


class Counter(torch.nn.Module):
    """A running sum kept in a buffer (slice assignment) and a step count (add_)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))
        self.register_buffer("steps", torch.full((1,), 10.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total[:] = self.total + x
        self.steps.add_(1)
        return self.total * self.steps


class Block(torch.nn.Module):
    """One attention block over a static KV cache written at `pos` by index_copy_."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.o = torch.nn.Linear(d, d)
        self.register_buffer("cache_k", torch.zeros(1, heads, MAX_LEN, d // heads))
        self.register_buffer("cache_v", torch.zeros(1, heads, MAX_LEN, d // heads))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.h, self.dh).transpose(1, 2) for t in (q, k, v))
        self.cache_k.index_copy_(2, pos, k)
        self.cache_v.index_copy_(2, pos, v)
        mask = torch.arange(MAX_LEN)[None, :] <= pos[:, None]
        a = F.scaled_dot_product_attention(q, self.cache_k, self.cache_v, attn_mask=mask)
        return self.o(a.transpose(1, 2).reshape(b, n, d))


def _fresh_copy(m: torch.nn.Module) -> torch.nn.Module:
    ref = type(m)().eval()
    ref.load_state_dict(m.state_dict())
    return ref


def test_state_survives_runs_and_reset_restores_it() -> None:
    m = Counter().eval()
    prog = aotrt.export(m, (torch.zeros(4),))
    assert [s.name for s in prog.tables.state] == ["total", "steps"]
    assert prog.outputs[0]["shape"] == [4] and len(prog.outputs) == 1   # no state outputs
    ref = _fresh_copy(m)
    with aotrt.load(prog, device="cpu", check_hazards=True) as mod:
        for _ in range(3):
            x = torch.randn(4)
            got, = mod.run(x.numpy())
            np.testing.assert_allclose(np.asarray(got), ref(x).numpy(), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(mod.state["total"]), ref.total.numpy(),
                                   rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(mod.state["steps"]), [13.0])
        mod.reset()
        np.testing.assert_array_equal(np.asarray(mod.state["total"]), np.zeros(4))
        np.testing.assert_array_equal(np.asarray(mod.state["steps"]), [10.0])
        got, = mod.run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(got), np.full(4, 11.0))
        with pytest.raises(InvalidArgument, match="state 'nope'"):
            mod.state["nope"]


def test_two_loads_keep_separate_state(tmp_path: Path) -> None:
    prog = aotrt.export(Counter().eval(), (torch.zeros(4),))
    path = tmp_path / "counter.aotp"
    prog.save(path)
    with aotrt.load(path, device="cpu") as a, aotrt.load(path, device="cpu") as b:
        a.run(np.ones(4, np.float32))
        a.run(np.ones(4, np.float32))
        got_b, = b.run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(got_b), np.full(4, 11.0))
        np.testing.assert_array_equal(np.asarray(a.state["total"]), np.full(4, 2.0))


def test_state_read_is_a_copy_that_frees_its_memory() -> None:
    import gc

    from aotrt.runtime.device import get_device

    prog = aotrt.export(Counter().eval(), (torch.zeros(4),))
    memory = get_device("cpu").memory
    gc.collect()
    live = len(memory.live())
    with aotrt.load(prog, device="cpu") as mod:
        before = mod.state["total"]
        mod.run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(before), np.zeros(4))
        np.asarray(mod.state["steps"])
    del before
    gc.collect()
    assert len(memory.live()) == live


def test_closed_module_refuses() -> None:
    mod = aotrt.load(aotrt.export(Counter().eval(), (torch.zeros(4),)), device="cpu")
    mod.close()
    mod.close()
    with pytest.raises(InvalidArgument, match="closed"):
        mod.run(np.ones(4, np.float32))
    with pytest.raises(InvalidArgument, match="closed"):
        mod.reset()


def _methods(share: bool | list[str]) -> aotrt.Program:
    m = Counter().eval()
    return aotrt.export({"a": (m, (torch.zeros(4),)), "b": (m, (torch.zeros(4),))},
                        share_state=share)


def test_methods_own_their_state_unless_sharing_is_asked() -> None:
    prog = _methods(False)
    assert sorted(s.name for s in prog.tables.state) == ["a.steps", "a.total", "b.steps",
                                                     "b.total"]
    with aotrt.load(prog, device="cpu", check_hazards=True) as mod:
        assert mod.methods == ("a", "b")
        mod.method("a").run(np.ones(4, np.float32))
        got, = mod.method("b").run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(got), np.full(4, 11.0))
        with pytest.raises(InvalidArgument, match="has methods"):
            mod.run(np.ones(4, np.float32))
        with pytest.raises(InvalidArgument, match="method 'c'"):
            mod.method("c")


@pytest.mark.parametrize("share", [True, ["total", "steps"]])
def test_shared_state_is_one_buffer(share: bool | list[str]) -> None:
    prog = _methods(share)
    assert sorted(s.name for s in prog.tables.state) == ["steps", "total"]
    with aotrt.load(prog, device="cpu", check_hazards=True) as mod:
        mod.method("a").run(np.ones(4, np.float32))
        got, = mod.method("b").run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(got), np.full(4, 24.0))


def test_share_state_names_must_exist() -> None:
    with pytest.raises(InvalidArgument, match="no method has state"):
        _methods(["cache"])


def test_weights_are_stored_once(tmp_path: Path) -> None:
    blk = Block().eval()
    one = aotrt.export(blk, (torch.randn(1, 8, 32), torch.arange(8)))
    two = aotrt.export({"prefill": (blk, (torch.randn(1, 8, 32), torch.arange(8))),
                        "decode": (blk, (torch.randn(1, 1, 32), torch.tensor([8])))},
                       share_state=True)
    weights = sum(int(a.nbytes) for a in one.constants.values())
    assert sum(int(a.nbytes) for a in two.constants.values()) == weights
    one.save(tmp_path / "one.aotp")
    two.save(tmp_path / "two.aotp")
    size1, size2 = (tmp_path / "one.aotp").stat().st_size, (tmp_path / "two.aotp").stat().st_size
    # The second method adds its instructions and kernels, never a second copy of the weights.
    assert size2 - size1 < weights // 2, (size1, size2, weights)
    back = aotrt.Program.load(tmp_path / "two.aotp")
    assert sorted(back.methods) == ["decode", "prefill"]
    assert back.version == 2


def test_version1_files_still_load(tmp_path: Path) -> None:
    prog = aotrt.export(torch.nn.Linear(3, 2).eval(), (torch.randn(1, 3),))
    assert prog.version == 1 and not prog.state
    prog.save(tmp_path / "v1.aotp")
    back = aotrt.Program.load(tmp_path / "v1.aotp")
    assert back.version == 1 and list(back.methods) == ["forward"]
    with aotrt.load(back, device="cpu") as d:
        assert isinstance(d, aotrt.Delegate) and d.methods == ("forward",)
        assert d.method("forward") is d


def test_training_batch_norm_is_still_refused() -> None:
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    with pytest.raises(Unsupported, match="batch-norm statistics"):
        aotrt.export(m.train(), (torch.randn(2, 3, 8, 8),))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pos_rank", [1, 0])
def test_decoder_block_prefill_then_64_decode_steps(device: str, pos_rank: int) -> None:
    """A prefill of 8 positions, then 64 single-token decode steps over the shared cache,
    each against eager on the same inputs (float32)."""
    torch.manual_seed(0)
    blk = Block().eval()
    prefill_len = 8
    pos0 = torch.tensor(prefill_len) if pos_rank == 0 else torch.tensor([prefill_len])

    class Decode(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blk = blk

        def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            return self.blk(x, pos.reshape(-1))

    dec = Decode().eval()
    prog = aotrt.export({"prefill": (dec, (torch.randn(1, prefill_len, 32),
                                           torch.arange(prefill_len))),
                         "decode": (dec, (torch.randn(1, 1, 32), pos0))},
                        share_state=True)
    ref = Block().eval()
    ref.load_state_dict(blk.state_dict())
    worst = 0.0
    with aotrt.load(prog, device=device, check_hazards=True) as mod:
        x = torch.randn(1, prefill_len, 32)
        got, = mod.method("prefill").run(x.numpy(), np.arange(prefill_len))
        worst = max(worst, rel_err(np.asarray(got), ref(x, torch.arange(prefill_len))
                                   .detach().numpy()))
        decode = mod.method("decode")
        for step in range(prefill_len, prefill_len + 64):
            x = torch.randn(1, 1, 32)
            pos = np.array(step) if pos_rank == 0 else np.array([step])
            got, = decode.run(x.numpy(), pos)
            want = ref(x, torch.tensor([step])).detach().numpy()
            worst = max(worst, rel_err(np.asarray(got), want))
        np.testing.assert_allclose(np.asarray(mod.state["blk.cache_k"]),
                                   ref.cache_k.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert worst < 1e-4, worst


def test_inspect_lists_methods_state_and_sharing(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    from aotrt.cli import main

    path = tmp_path / "two.aotp"
    _methods(["total"]).save(path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "state 0 total: float32[4], zeros, shared by a, b" in out
    assert "a.steps: float32[1], initial value from constant" in out
    assert "used by a" in out and "method b:" in out and "input 0 x: float32[4]" in out
    assert main(["run", str(path), "--method", "b"]) == 0
    assert "out: float32[4]" in capsys.readouterr().out
    assert main(["run", str(path)]) == 2
    assert "--method: the program has methods ['a', 'b']" in capsys.readouterr().err


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hazards", [True, False])
def test_bound_decode_step_allocates_nothing(device: str, hazards: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode method bound once: each step copies its inputs into the bound buffers,
    launches once and returns the same output Tensors, with no allocation. Without the
    hazard checker a cuda step stages its host inputs in the graph's pinned block."""
    torch.manual_seed(1)
    blk = Block().eval()
    prog = aotrt.export({"prefill": (blk, (torch.randn(1, 4, 32), torch.arange(4))),
                         "decode": (blk, (torch.randn(1, 1, 32), torch.tensor([4])))},
                        share_state=True)
    ref = Block().eval()
    ref.load_state_dict(blk.state_dict())
    with aotrt.load(prog, device=device, check_hazards=hazards) as mod:
        x = torch.randn(1, 4, 32)
        mod.method("prefill").run(x.numpy(), np.arange(4))
        ref(x, torch.arange(4))
        binding = mod.method("decode").bind()
        assert [t.shape for t in binding.outputs] == [(1, 1, 32)]
        memory = mod.device.memory
        made: list[int] = []
        real = type(memory).allocate

        def counting(self: Any, nbytes: int, *args: Any, **kwargs: Any) -> Any:
            made.append(nbytes)
            return real(self, nbytes, *args, **kwargs)

        xs = [torch.randn(1, 1, 32) for _ in range(16)]
        host = [(x.numpy(), np.array([4 + i])) for i, x in enumerate(xs)]
        monkeypatch.setattr(type(memory), "allocate", counting)
        outs = []
        for x, pos in host:
            got = binding.run(x, pos)
            assert got is binding.outputs
            outs.append(np.asarray(got[0]).copy())
        monkeypatch.undo()
        assert made == []
        for i, x in enumerate(xs):
            want = ref(x, torch.tensor([4 + i])).detach().numpy()
            assert rel_err(outs[i], want) < 1e-4
        with pytest.raises(InvalidArgument, match="or none to run on the bound ones"):
            binding.run(host[0][0])
    with pytest.raises(InvalidArgument, match="closed"):
        binding.run()


def test_a_delegate_takes_one_method() -> None:
    prog = _methods(True)
    with pytest.raises(InvalidArgument, match="it has methods"):
        aotrt.Delegate(prog, device="cpu")
    # One method alone loads as a Delegate over the program's whole state.
    with aotrt.Delegate(prog.method("b"), device="cpu") as d:
        got, = d.run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(got), np.full(4, 11.0))
        np.testing.assert_array_equal(np.asarray(d.state["total"]), np.ones(4))
        d.reset()
        np.testing.assert_array_equal(np.asarray(d.state["steps"]), [10.0])


class Memory(torch.nn.Module):
    """A buffer one method writes (`remember`) and another only reads (`recall`)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mem", torch.zeros(4))

    def forward(self, x: torch.Tensor, write: bool) -> torch.Tensor:
        if write:
            self.mem.copy_(x * 3)
            return x
        return self.mem + x


class _Method(torch.nn.Module):
    def __init__(self, m: Memory, write: bool) -> None:
        super().__init__()
        self.m, self.write = m, write

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x, self.write)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("share", [True, ["m.mem"]])
def test_a_shared_buffer_one_method_only_reads_is_state_there(device: str,
                                                              share: bool | list[str]) -> None:
    """The reader sees what the writer wrote, not the buffer's value at export (Whisper's
    cross-attention cache: `encode` writes it, `decode` only reads it)."""
    mem = Memory().eval()
    x = torch.zeros(4)
    prog = aotrt.export({"remember": (_Method(mem, True), (x,)),
                         "recall": (_Method(mem, False), (x,))}, share_state=share)
    assert [s.name for s in prog.tables.state] == ["m.mem"]
    with aotrt.load(prog, device=device, check_hazards=True) as m:
        m.method("remember").run(np.arange(4, dtype=np.float32))
        got, = m.method("recall").run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(got), np.arange(4) * 3 + 1)
    # Not shared: the reader keeps the buffer's own value (a constant: nothing writes it).
    alone = aotrt.export({"remember": (_Method(mem, True), (x,)),
                          "recall": (_Method(mem, False), (x,))})
    with aotrt.load(alone, device=device) as m:
        m.method("remember").run(np.arange(4, dtype=np.float32))
        got, = m.method("recall").run(np.ones(4, np.float32))
        np.testing.assert_array_equal(np.asarray(got), np.ones(4))


@pytest.fixture(scope="module")
def dynamic_prefill_block() -> tuple[torch.nn.Module, aotrt.Program]:
    """The decoder block with a prefill of 1 to 64 positions (a torch.export Dim) and a
    decode of one, sharing the cache."""
    from torch.export import Dim

    torch.manual_seed(3)
    blk = Block().eval()
    n = Dim("n", min=1, max=64)
    prog = aotrt.export({
        "prefill": {"model": blk, "args": (torch.randn(1, 8, 32), torch.arange(8)),
                    "dynamic_shapes": ({1: n}, {0: n})},
        "decode": (blk, (torch.randn(1, 1, 32), torch.tensor([8]))),
    }, share_state=True)
    return blk, prog


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [1, 23, 64])
def test_decoder_block_dynamic_prefill_then_decode(dynamic_prefill_block, device: str,
                                                   length: int) -> None:
    """A prefill of `length` positions (each size at the bounds and one between), then
    decode steps over the cache it wrote, each against eager (float32)."""
    blk, prog = dynamic_prefill_block
    ref = _fresh_copy(blk)
    gen = torch.Generator().manual_seed(length)
    with aotrt.load(prog, device=device, check_hazards=True) as mod:
        assert mod.program.method("prefill").symbols
        x = torch.randn(1, length, 32, generator=gen)
        got, = mod.method("prefill").run(x.numpy(), np.arange(length))
        with torch.no_grad():
            want = ref(x, torch.arange(length)).numpy()
        assert rel_err(np.asarray(got), want) < 1e-4
        decode = mod.method("decode")
        for step in range(length, min(length + 8, MAX_LEN)):
            x = torch.randn(1, 1, 32, generator=gen)
            got, = decode.run(x.numpy(), np.array([step]))
            with torch.no_grad():
                want = ref(x, torch.tensor([step])).numpy()
            assert rel_err(np.asarray(got), want) < 1e-4, step
        np.testing.assert_allclose(np.asarray(mod.state["cache_v"]),
                                   ref.cache_v.numpy(), rtol=1e-4, atol=1e-5)
