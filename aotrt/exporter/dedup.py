"""Identical kernels are one kernel: a model that repeats a layer N times generates the same
kernels N times (GPT-2 124M: 133 kernels, 12 identical layers), and each kernel a program
holds is rendered and compiled at every load. Two kernels are identical when their IR is,
name aside (`kernel_key`); the first one emitted survives and every instruction that would
have called a later copy calls it (`KernelSet`, used by the lowering and by
aotrt/exporter/methods.py's merge of several methods, so both agree on what is equal).

What the merge loses is only the later copies' names (`k<n>_<op>`: the order a kernel was
made in and the op it ends with). Where an instruction comes from stays its own: its `src`
names its op and the model's source line, and the runtime labels hazards and kernel errors
with the instruction (aotrt/runtime/delegate.py). A survivor's name is the first copy's, so
a name no longer points at one instruction (`aotrt inspect` and errors name the
instruction for that).
"""

from __future__ import annotations

import json

from aotrt.kernels import ir


def kernel_key(kernel: ir.Kernel) -> str:
    """The canonical form of a kernel: its IR's JSON without its name (equal: one kernel)."""
    doc = ir.to_json(kernel)
    del doc["name"]     # a label only: the renderers export kernel i as symbol(i)
    return json.dumps(doc, sort_keys=True)


class KernelSet:
    """Kernels by canonical form: the first of each form stands for every later copy."""

    def __init__(self) -> None:
        self.by_key: dict[str, ir.Kernel] = {}
        #: calls that went to an earlier identical kernel (logged by the lowering)
        self.merged = 0

    def add(self, kernel: ir.Kernel) -> ir.Kernel:
        """The kernel to call for `kernel`: the first identical one added, else itself."""
        survivor = self.by_key.setdefault(kernel_key(kernel), kernel)
        if survivor is not kernel:
            self.merged += 1
        return survivor


__all__ = ["KernelSet", "kernel_key"]
