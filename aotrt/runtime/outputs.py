"""A method's outputs, bound one way by every run path of its Delegate.

A run's output roots (one uint8 base per output) are the caller's `out=` tensors where they
can be bound where they lie, else fresh memory that the results own (process-owned, so
results outlive later runs and the delegate). When the work is queued, an `out=` tensor that
could not be bound (a numpy array or tensor of another layout, or one overlapping an input)
gets the values copied back ("stage"), and the results are Tensors over each output's view
of its root, or the caller's `out=` tensors.

Every path goes through `Outputs`:
- the plain run (programs writing their outputs in place): `bases`, then `finish`;
- a replay over static buffers with `out=`, or with the hazard checker on: `copy_out`;
- the lean cuda graph replay: `copied` (fresh roots, one copy each, the Tensors);
- the lean host run (replays.StaticIO.run_lean): `packed_at`/`packed_sizes` and
  `tensors(.., packed_views)` over one fresh allocation;
- `Delegate.bind()`: `tensors` over the bound static roots, returned by every bound run.

What depends only on the method (the views, the fresh roots' sizes, the packed layout) is
resolved here once, at load: the lean paths only allocate, copy and make the Tensors.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.dtypes import DType
from aotrt.program.records import SpecRecord
from aotrt.runtime import shims
from aotrt.runtime.arguments import BOUND, Arg, Arguments
from aotrt.runtime.memory import PROCESS_OWNER, owner_scope
from aotrt.runtime.public import Tensor
from aotrt.runtime.tensor import Handle

#: One program output's view over an output root: (root k, sizes, strides, offset, dtype).
OutView = tuple[int, tuple, tuple, int, DType]

#: byte alignment of each output root in a packed allocation (a cache line)
PACK_ALIGN = 64


def output_views(per_run: Mapping[tuple[str, int], Sequence[tuple]], n_roots: int,
                 outputs_tensors: Sequence[int]) -> list[OutView]:
    """Each program output's view, as (output root, sizes, strides, offset, dtype)."""
    where = {tid: (k, *view) for k in range(n_roots)
             for tid, *view in per_run.get(("output", k), ())}
    return [where[t] for t in outputs_tensors]


class Outputs:
    """One method's outputs: how a run binds their roots and hands back its results."""

    def __init__(self, args: Arguments, specs: Sequence[SpecRecord],
                 per_run: Mapping[tuple[str, int], Sequence[tuple]],
                 outputs_tensors: Sequence[int]) -> None:
        """`args`: the delegate's caller tensors; `specs`: the outputs' specs; `per_run`:
        the views rooted at each input/output; `outputs_tensors`: each output's tensor id."""
        self._args = args
        self._device = args.device
        self._stream = args.stream
        self.specs = list(specs)
        #: each output's view over its root
        self.views: list[OutView] = output_views(per_run, len(self.specs), outputs_tensors)
        # Fresh roots have a byte at least, so that each has an address of its own.
        self._sizes = [[max(s.nbytes, 1)] for s in self.specs]
        #: each output root's bytes
        self.nbytes = [s.nbytes for s in self.specs]
        #: the packed layout (a lean host run's): each root's byte offset in one allocation,
        #: on cache lines of its own, and that allocation's sizes ([bytes])
        self.packed_at: list[int] = []
        at = 0
        for n in self.nbytes:
            self.packed_at.append(at)
            at += -(-n // PACK_ALIGN) * PACK_ALIGN
        self.packed_sizes = [max(at, 1)]
        #: each output's view over the packed allocation (root 0)
        self.packed_views: list[OutView] = [
            (0, sizes, strides, self.packed_at[k] // dt.itemsize + off, dt)
            for k, sizes, strides, off, dt in self.views]

    # -- the results --------------------------------------------------------------------------

    def tensors(self, bases: Sequence[Handle], views: Sequence[OutView] | None = None
                ) -> tuple[Tensor, ...]:
        """Tensors over each output's view of its root in `bases` (views: `self.views`, or
        `packed_views` over one base), owned by the current owner; none left on failure."""
        results: list[Tensor] = []
        try:
            for k, sizes, strides, off, dt in self.views if views is None else views:
                results.append(Tensor(shims.reinterpret_tensor(bases[k], sizes, strides, off,
                                                               dtype=dt)))
        except BaseException:
            release(results)
            raise
        return tuple(results)

    def copied(self, static: Sequence[Handle], temps: list[Handle]) -> tuple[Tensor, ...]:
        """The lean replay's results (no out=): fresh roots, each a copy of its static root
        queued on the stream, and process-owned Tensors over them; the roots go to `temps`
        (the Tensors keep their memory). Not committed."""
        dev, stream, u8 = self._device, self._stream, dtypes.uint8
        bases: list[Handle] = []
        with owner_scope(PROCESS_OWNER):
            for size, n, src in zip(self._sizes, self.nbytes, static):
                base = shims.empty_strided(size, [1], u8, dev)
                temps.append(base)
                bases.append(base)
                if n:
                    stream.copy(base, src)
            return self.tensors(bases)

    # -- the general path ---------------------------------------------------------------------

    def bases(self, outs: list[Arg] | None, temps: list[Handle]) -> list[Handle]:
        """Each output root of a run: the caller's out= tensor where it can be bound, else
        fresh memory the results will own (process-owned, not the delegate's). Every handle
        made goes to `temps`."""
        dev, u8 = self._device, dtypes.uint8
        bases: list[Handle] = []
        for k, size in enumerate(self._sizes):
            o = outs[k] if outs is not None else None
            if o is not None and o.kind in BOUND:
                bases.append(self._args.bind(o, temps, output=True))
                continue
            with owner_scope(PROCESS_OWNER):
                base = shims.empty_strided(size, [1], u8, dev)
            temps.append(base)
            bases.append(base)
        return bases

    def finish(self, bases: Sequence[Handle], outs: list[Arg] | None, out: Any,
               temps: list[Handle]) -> tuple[Any, ...]:
        """Once a run's work into `bases` is queued: copy each staged output into its caller
        tensor, commit, and return the results (fresh Tensors, or the `out` tensors)."""
        stream = self._stream
        if outs is None:
            stream.commit()
            with owner_scope(PROCESS_OWNER):
                return self.tensors(bases)
        copy_back: list[tuple[np.ndarray, Handle]] = []
        for (k, sizes, strides, off, dt), o in zip(self.views, outs):
            if o.kind == "stage":
                typed = shims.reinterpret_tensor(bases[k], sizes, strides, off, dtype=dt)
                temps.append(typed)
                self._args.unstage(o, typed, temps, copy_back)
        stream.commit()
        for arr, h in copy_back:
            np.copyto(arr, h.numpy())       # waits for the run
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def copy_out(self, static: Sequence[Handle], outs: list[Arg] | None, out: Any,
                 temps: list[Handle]) -> tuple[Any, ...]:
        """A replay's results: its static output roots copied out (queued after the replay)
        into fresh memory or the caller's out= tensors, then as `finish`."""
        if outs is None:
            results = self.copied(static, temps)
            try:
                self._stream.commit()
            except BaseException:
                release(results)
                raise
            return results
        bases = self.bases(outs, temps)
        stream = self._stream
        for base, n, src in zip(bases, self.nbytes, static):
            if n:
                stream.copy(base, src)
        return self.finish(bases, outs, out, temps)


def release(tensors: Sequence[Tensor]) -> None:
    """Release Tensors a failed run made (their memory goes with them)."""
    for t in tensors:
        t.release()


__all__ = ["OutView", "Outputs", "output_views", "release"]
