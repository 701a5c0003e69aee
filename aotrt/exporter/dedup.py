"""Identical kernels are one kernel: a model that repeats a layer N times generates the same
kernels N times (GPT-2 124M's llm.export: 133 kernels, 20 of them distinct), and each kernel
a program holds is rendered and compiled at every load. Two kernels are identical when their
IR is, name aside (`kernel_key`); the first one emitted survives and every instruction that
would have called a later copy calls it (`KernelSet`, used by the lowering and by
aotrt/exporter/methods.py's merge of several methods, so both agree on what is equal).
GPT-2's program then holds 20 kernels: on cpu their library compiles in 1.6 s of CPU time
against 3.8 s, and a cold load takes 2.7 s against 4.4 (medians of 5, 2 shared cores).

What the merge loses is the later copies' names (`k<n>_<op>`: the order a kernel was made
in and the op it ends with): a kernel's name no longer points at one instruction. Where an
instruction comes from stays its own: its `src` names its op and the model's source line,
hazard errors name the instruction, and so do a kernel's own errors (integer division by
zero) on the default path, a note `in instruction #i kernel <name> [src]`. With the hazard
checker on, a kernel's own error names only the kernel, now the first copy (a follow-up:
a note there too). Profiles name the compiled symbols, aotrt_k<i>, as before; a shared
kernel's launches all show under its one symbol.
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
