"""On the GPU machine: rerun the module-suite cases that gave wrong bf16 answers on cuda
(2026-12-02), across dtypes, graph on/off and hazard checking, and print each error.

    python3 scripts/cuda_race_probe.py sdpa_add,linear_chunk_first_dim [cuda|cpu]
"""

from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, ".")
import aotrt  # noqa: E402
from tests.exporter import modules  # noqa: E402
from tests.exporter.harness import _numpy, rel_err  # noqa: E402

names = sys.argv[1].split(",")
DEV = sys.argv[2] if len(sys.argv) > 2 else "cuda"
cases = {c.name: c for c in modules.REGISTRY + modules.SEEDS}
for name in names:
    case = cases[name]
    for dt in (torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(0)
        model = case.build().eval().to(dt)
        ex = case.make_inputs(gen, dt)
        with torch.no_grad():
            prog = aotrt.export(model, ex)
        ref_model = model.double()
        for graph in (True, False):
            for hz in (True, False):
                errs = []
                with aotrt.load(prog, device=DEV, cuda_graph=graph if DEV == "cuda" else None, check_hazards=hz) as d:
                    for _ in range(6):
                        xs = case.make_inputs(gen, dt)
                        with torch.no_grad():
                            r = ref_model(*[x.double() for x in xs])
                        o = d.run(*[x.contiguous() for x in xs])[0]
                        errs.append(rel_err(np.asarray(o).astype(np.float64), _numpy(r)))
                print(f"{name:24s} {str(dt):15s} graph={graph!s:5s} hazards={hz!s:5s} "
                      + " ".join(f"{e:.2g}" for e in errs), flush=True)
        print("  program:", [(i.get("op"), i.get("fn") or i.get("kernel")) for i in
                             prog.instructions], flush=True)
