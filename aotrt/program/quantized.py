"""A validated program's weight-only quantized layers, read from its records (what
`aotrt inspect` prints): their packing, and the file's size against the same weights in
bfloat16.

- A `linear_wq` library instruction is a quantized linear: its params give the bits and
  group size, its packed weight, scales and zeros are its inputs 1-3 (runtime/ops/
  linear_wq.py has the packing).
- A packed table read by a kernel is a quantized embedding (exporter/quantize.py's
  QuantizedEmbedding, lowered to a gather): an int8 or uint8 constant named `...qweight`
  with `...scales` (and, for int4, `...zeros`) beside it. The names are only used to
  describe the file here; nothing runs by them.

Bytes are the constants' own, each counted once however many layers read it (a head tied
to its embedding); "in bfloat16" is 2 bytes per weight element instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from aotrt.program.format import _human

#: a constant's name ending that marks a packed weight, and its companions'
QWEIGHT, SCALES, ZEROS = "qweight", "scales", "zeros"


@dataclass(frozen=True)
class QuantizedLayer:
    """One quantized layer: op, bits, group size (None: per output channel), the scales'
    dtype, the dequantized weights' [N, K] (None if no view says), and the indices of the
    constants that hold it (packed weight, scales, zeros)."""

    op: str
    bits: int
    group_size: int | None
    scale_dtype: str
    shape: tuple[int, int] | None
    constants: tuple[int, ...]

    @property
    def scheme(self) -> str:
        """'int8 per channel' or 'int4 g128'."""
        return f"int{self.bits} per channel" if self.group_size is None else \
            f"int{self.bits} g{self.group_size}"


def quantized_layers(prog: Any) -> list[QuantizedLayer]:
    """Every quantized layer of validated Program `prog`, in method and instruction order,
    then the packed tables that kernels read."""
    consts = prog.tables.constants
    layers: list[QuantizedLayer] = []
    read_by_kernels: set[int] = set()
    for m in prog.methods.values():
        rec = m.record
        for ins in rec.instructions:
            if ins.op == "kernel":
                read_by_kernels.update(rec.tensors[t].index for t in ins.args
                                       if rec.tensors[t].root == "constant")
            if ins.op != "library" or ins.name != "linear_wq":
                continue
            q, s, z = (None if t is None else rec.tensors[t] for t in ins.ins[1:4])
            bits = int(ins.params.get("bits", 8))
            k = q.sizes[1] * (2 if bits == 4 else 1)
            layers.append(QuantizedLayer(
                "linear_wq", bits, int(ins.params["group_size"]) if bits == 4 else None,
                s.dtype.name, (q.sizes[0], k),
                tuple(v.index for v in (q, s, z) if v is not None and v.root == "constant")))
    by_name = {c.name: c for c in consts}
    for c in consts:
        if c.index not in read_by_kernels or c.dtype.name not in ("int8", "uint8") or \
                not c.name.endswith(QWEIGHT):
            continue
        prefix = c.name[:-len(QWEIGHT)]
        s, z = by_name.get(prefix + SCALES), by_name.get(prefix + ZEROS)
        bits = 4 if c.dtype.name == "uint8" else 8
        if s is None or (bits == 4) != (z is not None):
            continue
        elements = c.nbytes * (2 if bits == 4 else 1)
        scales = max(_numel(s.shape), 1)
        layers.append(QuantizedLayer(
            "embedding", bits, elements // scales if bits == 4 else None, s.dtype.name,
            _table_shape(prog, c.index, bits),
            tuple(x.index for x in (c, s, z) if x is not None)))
    return layers


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _table_shape(prog: Any, index: int, bits: int) -> tuple[int, int] | None:
    """[rows, K] of packed table `index`: from a 2-D view that covers it (the file stores it
    flat), else None."""
    numel = _numel(prog.tables.constants[index].shape)
    for m in prog.methods.values():
        for t in m.record.tensors:
            if t.root == "constant" and t.index == index and len(t.sizes) == 2 and \
                    t.sizes[0] * t.sizes[1] == numel:
                return t.sizes[0], t.sizes[1] * (2 if bits == 4 else 1)
    return None


def _elements(layer: QuantizedLayer, consts: Any) -> int:
    """The weights' element count: [N, K], else the packed weight's bytes unpacked."""
    if layer.shape is not None:
        return layer.shape[0] * layer.shape[1]
    return consts[layer.constants[0]].nbytes * (2 if layer.bits == 4 else 1)


def summary_lines(prog: Any) -> list[str]:
    """The quantized layers as a table, repeated layers counted once ("24  linear_wq  int4
    g128 ..."), then their bytes and the file's constants against bfloat16; [] if none."""
    layers = quantized_layers(prog)
    if not layers:
        return []
    consts = prog.tables.constants
    rows = Counter((ly.op, ly.scheme, ly.scale_dtype,
                    "?" if ly.shape is None else f"[{ly.shape[0]}, {ly.shape[1]}]")
                   for ly in layers)
    table = [("layers", "op", "scheme", "scales", "weights [N, K]")]
    table += [(str(n), *key) for key, n in sorted(rows.items())]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    # Each packed weight once, however many layers read it (a tied head).
    packed: dict[int, int] = {}
    elements: dict[int, int] = {}
    for ly in layers:
        elements[ly.constants[0]] = _elements(ly, consts)
        for i in ly.constants:
            packed[i] = consts[i].nbytes
    p, bf16 = sum(packed.values()), 2 * sum(elements.values())
    total = sum(c.nbytes for c in consts)
    as_bf16 = total - p + bf16
    lines = [f"quantized layers: {len(layers)}"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.append(f"  packed: {_human(p)} with scales and zeros, {_human(bf16)} as bfloat16 "
                 f"weights ({p / max(bf16, 1):.2f}x)")
    lines.append(f"  constants: {_human(total)}, {_human(as_bf16)} with these weights in "
                 f"bfloat16 ({total / max(as_bf16, 1):.2f}x)")
    return lines


__all__ = ["QuantizedLayer", "quantized_layers", "summary_lines"]
