"""Export-and-compare harness: export a module, run it on the cpu device with the hazard
checker on, and compare every output with a float64 eager reference on fresh random inputs.

Error metric: norm-wise relative error ||out - ref|| / ||ref||, where `ref` is the module
run in float64 with the same (dtype-rounded) weights and inputs. Limits: float32 1e-4,
bfloat16/float16 2e-2. Integer and bool outputs must equal eager's in the module's dtype.
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.utils._pytree as pytree

import aotrt

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}

MakeInputs = Callable[[torch.Generator, torch.dtype], tuple[Any, ...]]


def randn(gen: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Standard normal values in `dtype` (never zeros)."""
    return torch.randn(*shape, generator=gen).to(dtype)


def strided_randn(gen: torch.Generator, dtype: torch.dtype, shape: Sequence[int],
                  strides: Sequence[int]) -> torch.Tensor:
    """A tensor of `shape` viewing fresh random storage through `strides`."""
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    base = torch.randn(extent, generator=gen).to(dtype)
    return base.as_strided(tuple(shape), tuple(strides))


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64 over the finite reference (absolute when it is
    all zeros); inf where the NaNs are not in the same places, or an infinity of the
    reference is not the same infinity."""
    a = np.asarray(out, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return math.inf         # a NaN either side alone: a lost NaN is a wrong answer
    mask = np.isfinite(b)
    if not np.array_equal(a[np.isinf(b)], b[np.isinf(b)]):
        return math.inf         # the reference's infinities, signs included
    diff = np.linalg.norm((a - b)[mask])
    denom = np.linalg.norm(b[mask])
    return float(diff / denom) if denom > 0 else float(diff)


def _cast_floats(tree: Any, dtype: torch.dtype) -> Any:
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, tree)


def _flat(tree: Any) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


@dataclass
class Report:
    """What one check saw: per-run, per-output relative errors, and the program."""

    program: aotrt.Program
    errors: list[list[float]] = field(default_factory=list)

    @property
    def worst(self) -> float:
        """The largest error of any output of any run."""
        return max((e for run in self.errors for e in run), default=0.0)


def check_module(model: torch.nn.Module, make_inputs: MakeInputs, dtype: torch.dtype,
                 tol: float | None = None, runs: int = 2, seed: int = 0,
                 roundtrip: bool = True, prepare: Callable[[torch.nn.Module], None] | None = None,
                 device: str = "cpu", layout: str = "auto", check_hazards: bool = True,
                 program: aotrt.Program | None = None) -> Report:
    """Export `model` in `dtype` (with `layout`), run it `runs` times on `device` on fresh
    inputs, compare with eager. Without `check_hazards` (and its variable unset) the runs
    take the paths users get by default: the lean run, the native plan from the second.
    `program`: this check's export of this model made before (Report.program), run instead
    of exporting again.

    Raises AssertionError (pytest's failure) naming the output and the error.
    """
    tol = TOL[dtype] if tol is None else tol
    gen = torch.Generator().manual_seed(seed)
    model = model.eval().to(dtype)
    example = make_inputs(gen, dtype)
    with torch.no_grad():
        if prepare is not None:
            prepare(model)
        prog = program if program is not None else aotrt.export(model, example, layout=layout)
    if roundtrip and program is None:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.aotp"
            prog.save(path)
            prog = aotrt.Program.load(path)
    ref_model = copy.deepcopy(model).double()
    report = Report(prog)
    with aotrt.load(prog, device=device, check_hazards=check_hazards) as dlg:
        for _ in range(runs):
            inputs = make_inputs(gen, dtype)
            with torch.no_grad():
                ref = _flat(ref_model(*_cast_floats(inputs, torch.float64)))
                eager = _flat(model(*inputs))
            outs = dlg.run(*[x.contiguous() if isinstance(x, torch.Tensor) else x
                             for x in inputs])
            assert len(outs) == len(ref), f"{len(outs)} outputs, eager has {len(ref)}"
            errs = []
            for i, (o, r, e) in enumerate(zip(outs, ref, eager)):
                got = np.asarray(o)
                assert tuple(got.shape) == tuple(e.shape), \
                    f"output {i}: shape {got.shape}, eager {tuple(e.shape)}"
                if not e.is_floating_point():
                    assert np.array_equal(got, _numpy(e)), f"output {i}: differs from eager"
                    errs.append(0.0)
                    continue
                err = rel_err(got.astype(np.float64), _numpy(r))
                errs.append(err)
                assert err <= tol, (f"output {i} ({prog.outputs[i]['name']}): relative error "
                                    f"{err:.3g} > {tol:g} (eager in {dtype}: "
                                    f"{rel_err(_numpy(e), _numpy(r)):.3g})")
            report.errors.append(errs)
    return report


def count_ops(prog: aotrt.Program) -> dict[str, int]:
    """Instruction counts: 'copy', 'kernel', and 'library:<fn>'."""
    counts: dict[str, int] = {}
    for ins in prog.instructions:
        key = ins["op"] if ins["op"] != "library" else f"library:{ins['fn']}"
        counts[key] = counts.get(key, 0) + 1
    return counts
