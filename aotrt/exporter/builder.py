"""ProgramBuilder: make a Program step by step (the exporter's last stage, and the way tests
and tools write programs by hand). Arena buffers are planned at build() by
aotrt/exporter/plan.py. Never imports torch: runtime tests build programs with it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.exporter.plan import plan
from aotrt.kernels import ir
from aotrt.program import Program
from aotrt.program.strides import contiguous_strides, extent


class ProgramBuilder:
    """Build a Program step by step; arena buffers are planned (aotrt.exporter.plan) at build().

    Tensor ids are returned by every method that makes a view. Intermediates live in
    `buffer(nbytes)`s whose lifetimes come from the instructions that touch their views.
    """

    def __init__(self, module: str = "", provenance: Mapping[str, str] | None = None) -> None:
        self.provenance = {"module": module, "aotrt": _aotrt_version()}
        self.provenance.update(provenance or {})
        self.inputs: list[dict] = []
        self.outputs: list[dict] = []
        self.outputs_tensors: list[int] = []
        self.constants: dict[str, np.ndarray] = {}
        self.states: list[dict] = []
        self.tensors: list[dict] = []
        self.kernels: dict[str, ir.Kernel] = {}
        self.instructions: list[dict] = []
        self.buffers: list[int] = []
        self._ids: dict[tuple, int] = {}

    # -- roots --------------------------------------------------------------------------------

    def input(self, name: str, dtype: Any, shape: Sequence[int],
              strides: Sequence[int] | None = None) -> int:
        """Declare the next input; returns the id of the view covering all of it."""
        spec = _spec(name, dtype, shape, strides)
        self.inputs.append(spec)
        return self.tensor("input", len(self.inputs) - 1, 0, spec["dtype"], spec["shape"],
                           spec["strides"])

    def output(self, name: str, dtype: Any, shape: Sequence[int],
               strides: Sequence[int] | None = None) -> int:
        """Declare the next output; returns the id of the view covering all of it."""
        spec = _spec(name, dtype, shape, strides)
        self.outputs.append(spec)
        tid = self.tensor("output", len(self.outputs) - 1, 0, spec["dtype"], spec["shape"],
                          spec["strides"])
        self.outputs_tensors.append(tid)
        return tid

    def constant(self, name: str, array: np.ndarray) -> int:
        """Add a constant (stored row-major); returns the id of the view covering all of it."""
        if name in self.constants:
            raise InvalidArgument(f"name: duplicate constant {name!r}")
        arr = np.ascontiguousarray(array)
        dt = dtypes.as_dtype(arr.dtype)
        self.constants[name] = arr
        return self.tensor("constant", len(self.constants) - 1, 0, dt.name, list(arr.shape),
                           list(contiguous_strides(arr.shape)))

    def state(self, name: str, initial: np.ndarray) -> int:
        """Add a state buffer (kept between runs, written in place), initialised to
        `initial` (stored as constant `<name>.init` unless all zeros); returns the id of the
        view covering all of it."""
        if any(s["name"] == name for s in self.states):
            raise InvalidArgument(f"name: duplicate state {name!r}")
        arr = np.ascontiguousarray(initial)
        dt = dtypes.as_dtype(arr.dtype)
        init = None
        if np.any(arr.view(np.uint8) != 0) if arr.size else False:
            init = f"{name}.init"
            self.constant(init, arr)
        self.states.append({"name": name, "dtype": dt.name, "shape": list(arr.shape),
                            "init": init})
        return self.tensor("state", len(self.states) - 1, 0, dt.name, list(arr.shape),
                           list(contiguous_strides(arr.shape)))

    def buffer(self, nbytes: int) -> int:
        """A planned arena buffer of `nbytes`; use `in_buffer` to make views of it."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidArgument(f"nbytes: expected an int >= 0, got {nbytes!r}")
        self.buffers.append(nbytes)
        return len(self.buffers) - 1

    # -- views --------------------------------------------------------------------------------

    def tensor(self, root: str, index: int, byte_offset: int, dtype: Any, sizes: Sequence[int],
               strides: Sequence[int] | None = None) -> int:
        """The id of a view of a root (`arena`, `input`, `output`, `constant`, or `buffer`)."""
        dt = dtypes.as_dtype(dtype).name
        st = list(contiguous_strides(sizes)) if strides is None else [int(s) for s in strides]
        key = (root, int(index), int(byte_offset), dt, tuple(int(s) for s in sizes), tuple(st))
        if key not in self._ids:
            self._ids[key] = len(self.tensors)
            self.tensors.append({"root": root, "index": key[1], "byte_offset": key[2],
                                 "dtype": dt, "sizes": list(key[4]), "strides": st})
        return self._ids[key]

    def in_buffer(self, buf: int, byte_offset: int, dtype: Any, sizes: Sequence[int],
                  strides: Sequence[int] | None = None) -> int:
        """A view of planned buffer `buf` at `byte_offset` bytes from its start."""
        if not 0 <= buf < len(self.buffers):
            raise InvalidArgument(f"buf: no buffer {buf}")
        return self.tensor("buffer", buf, byte_offset, dtype, sizes, strides)

    def alias(self, base: int, sizes: Sequence[int], strides: Sequence[int],
              storage_offset: int, dtype: Any = None) -> int:
        """A view of `base`'s root; `storage_offset` counts elements from the root's start
        (PyTorch's meta['val'] convention, which flattens views of views)."""
        t = self.tensors[base]
        dt = dtypes.as_dtype(dtype if dtype is not None else t["dtype"])
        return self.tensor(t["root"], t["index"], storage_offset * dt.itemsize, dt.name, sizes,
                           strides)

    # -- instructions -------------------------------------------------------------------------

    def kernel(self, kernel: ir.Kernel, args: Sequence[int], src: str = "") -> None:
        """Run `kernel` with tensor ids `args` (in the kernel's argument order)."""
        known = self.kernels.get(kernel.name)
        if known is not None and known != kernel:
            raise InvalidArgument(f"kernel: two different kernels named {kernel.name!r}")
        self.kernels[kernel.name] = kernel
        self.instructions.append({"op": "kernel", "name": kernel.name, "args": list(args),
                                  "src": src})

    def library(self, fn: str, outs: Sequence[int], ins: Sequence[int | None],
                params: Mapping[str, Any] | None = None, src: str = "") -> None:
        """Run library op `fn` (aotrt.runtime.ops.OPS) writing `outs` from `ins`."""
        self.instructions.append({"op": "library", "fn": fn, "outs": list(outs),
                                  "ins": list(ins), "params": dict(params or {}), "src": src})

    def copy(self, dst: int, src: int, src_line: str = "") -> None:
        """Copy tensor `src` into tensor `dst` (same sizes and dtype)."""
        self.instructions.append({"op": "copy", "dst": dst, "src": src, "src_line": src_line})

    # -- build --------------------------------------------------------------------------------

    def lifetimes(self) -> list[tuple[int, int] | None]:
        """[first, last] instruction index touching each buffer (None when unused)."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, ins in enumerate(self.instructions):
            for tid in _tensor_ids(ins):
                t = self.tensors[tid]
                if t["root"] == "buffer":
                    first.setdefault(t["index"], i)
                    last[t["index"]] = i
        return [(first[b], last[b]) if b in first else None for b in range(len(self.buffers))]

    def build(self, arena_nbytes: int | None = None, align: int = 64) -> Program:
        """Plan the buffers into the arena and return the validated Program."""
        lives = self.lifetimes()
        sizes = [n if life is not None else 0 for n, life in zip(self.buffers, lives)]
        offsets, planned = plan(sizes, [life or (0, 0) for life in lives], align)
        tensors = []
        arena_end = planned
        for t in self.tensors:
            t = dict(t)
            if t["root"] == "buffer":
                t["byte_offset"] += offsets[t["index"]]
                t["root"], t["index"] = "arena", 0
            if t["root"] == "arena":
                dt = dtypes.as_dtype(t["dtype"])
                arena_end = max(arena_end, t["byte_offset"] + extent(
                    t["sizes"], t["strides"], dt.itemsize)[1])
            tensors.append(t)
        nbytes = arena_end if arena_nbytes is None else arena_nbytes
        prog = Program(inputs=self.inputs, outputs=self.outputs, constants=self.constants,
                       arena_nbytes=nbytes, tensors=tensors, kernels=list(self.kernels.values()),
                       instructions=self.instructions, outputs_tensors=self.outputs_tensors,
                       provenance=self.provenance, state=self.states)
        prog.validate()
        return prog


def _tensor_ids(ins: Mapping[str, Any]) -> list[int]:
    """Every tensor id an instruction uses."""
    op = ins["op"]
    if op == "kernel":
        return list(ins["args"])
    if op == "library":
        return [t for t in (*ins["outs"], *ins["ins"]) if t is not None]
    return [ins["dst"], ins["src"]]


def _spec(name: str, dtype: Any, shape: Sequence[int],
          strides: Sequence[int] | None) -> dict[str, Any]:
    shape = [int(s) for s in shape]
    st = list(contiguous_strides(shape)) if strides is None else [int(s) for s in strides]
    return {"name": name, "dtype": dtypes.as_dtype(dtype).name, "shape": shape, "strides": st}


def _aotrt_version() -> str:
    try:
        from importlib.metadata import version
        return version("aotrt")
    except Exception:  # noqa: BLE001 - not installed: provenance says so
        return "unknown"
