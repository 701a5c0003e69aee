"""Load-time limits: the work and size budget a program must fit before anything runs.

A program file of a kilobyte can ask for 2**62 loop iterations, a convolution whose scratch
does not fit any machine, or thousands of kernels for the C compiler; `Program.load` computes
what a program would cost (docs/limits.md says how) and refuses with ProgramError what
exceeds these limits. A caller who trusts a bigger program raises them explicitly:

    aotrt.load("big.aotp", limits=aotrt.Limits(max_work=1 << 52))

The defaults are set so that every real model passes with room to spare; the yardsticks are
ResNet-50 at batch 32 (about 2**38.5 multiply-adds, 2 GiB of activations) and a 7B-parameter
LLM prefill of 4096 tokens (about 2**44.7 multiply-adds, 14 GiB of fp16 weights).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from aotrt.errors import InvalidArgument, ProgramError

GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """What Program.load accepts (see docs/limits.md); every field is an inclusive maximum."""

    #: elementary steps of one run: kernel loop iterations, elements touched by copies,
    #: and library op work (multiply-adds, element visits, window taps). 2**48 is 8x a 7B LLM's
    #: 4k-token prefill (2**44.7 multiply-adds plus attention) and 1000x ResNet-50 at batch 32.
    max_work: int = 1 << 48
    #: loop iterations of one kernel (outer elements times reduce loops). 2**40: the biggest
    #: generated kernel of the LLM above (a 32x4096x4096 softmax) takes 2**29.
    max_kernel_iterations: int = 1 << 40
    #: distinct IR nodes of all kernels together (what the C compiler must chew); exported
    #: models have a few hundred per kernel and at most a few thousand kernels.
    max_ir_nodes: int = 1 << 21
    #: kernels, i.e. compile units of the generated library; at ~20 ms of cc each, 4096 is a
    #: minute and a half of compile; a 32-layer LLM needs a few hundred.
    max_kernels: int = 4096
    #: instructions of one run (a 7B LLM has about a thousand).
    max_instructions: int = 1 << 18
    #: scratch one library op allocates on the cpu (im2col, padding copies, attention scores);
    #: a 4k-token attention over 32 heads takes 2 GiB of fp32 scores.
    max_scratch_bytes: int = 8 * GiB
    #: arena + constants + inputs + outputs: more than any one H200 (141 GB) holds.
    max_memory_bytes: int = 256 * GiB
    #: the largest output whose written bytes are proved with a byte map (one byte of host
    #: memory per output byte, for the duration of load) when the dense writes into it do
    #: not already cover it; outputs covered by whole-view writes have no size limit.
    max_coverage_bytes: int = 1 * GiB

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidArgument(f"Limits.{f.name}: expected an int >= 0, got {v!r}")


#: the limits used when a caller passes none
DEFAULT = Limits()

__all__ = ["Limits", "DEFAULT"]


def within(value: int, limits: Limits, field: str, what: str) -> None:
    """Refuse `value` over `limits.<field>`, saying how a caller who trusts it raises it."""
    cap = getattr(limits, field)
    if value > cap:
        shown = f"{value}" if value < 1 << 80 else f"more than 2**80"
        raise ProgramError(f"{what}: {shown} exceeds the load limit {field}={cap} "
                           f"(docs/limits.md); to load it anyway, raise the limit: "
                           f"aotrt.load(..., limits=aotrt.Limits({field}=...))")
