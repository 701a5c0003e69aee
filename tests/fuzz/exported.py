"""The fuzzer's exported seeds: small torch modules exported by aotrt.export, kept as files.

    .venv/bin/python -m tests.fuzz.exported        # export again, rewrite tests/fuzz/seeds/

- `exp_dynamic`: linears and a GELU over x [S, 8], a softmax over the [S, T] scores
  against y [T, 8] and a residual add: two symbols (S in [2, 12], T in [1, 6]), sizes in
  S, T and S*T.
- `exp_state`: two methods sharing a cache and a counter (index_copy_ at a position,
  add_), one writing and one reading them.
- `exp_quantized`: an int4 token embedding (group 32), an int8 position embedding, an int4
  linear (group 32) and an int8 linear with bfloat16 scales (issue 38's packing).

The seeds are stored (tests/fuzz/seeds/<name>.json: the document and the constants) rather
than exported at every run: a campaign's mutant ids replay only from the very same seed
bytes, and the fuzzer's tests then need no torch. tests/fuzz/seeds.py reads them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.export import Dim

import aotrt
from aotrt import dtypes
from aotrt.exporter.quantize import quantize_embeddings, quantize_linears

SEED_DIR = Path(__file__).resolve().parent / "seeds"


class Dynamic(torch.nn.Module):
    """x [S, 8], y [T, 8] -> [S, 8]: an MLP over x, then x's rows attend to y's."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The block (y's non-finite values made finite first: every score reads all of y,
        and the fuzz reference leaves a score it cannot bound unchecked)."""
        h = self.l2(F.gelu(self.l1(x)))
        y = torch.nan_to_num(y, 0.0, 4.0, -4.0).clamp(-4.0, 4.0)
        s = torch.softmax(h @ y.transpose(-1, -2) * 0.25, -1)
        return s @ y + x


class _Cache(torch.nn.Module):
    """The state both methods of exp_state share: a cache of 8 rows and a counter."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 4))
        self.register_buffer("count", torch.full((1,), 2.0))


class CacheWrite(_Cache):
    """Write x into row pos % 8, count the write, return the column sums times the count."""

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The write method."""
        self.cache.index_copy_(0, pos % 8, x[None])
        self.count.add_(1)
        return self.cache.sum(0) * self.count


class CacheRead(_Cache):
    """Each cached row's product with x, plus the count (reads the state only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The read method."""
        return (self.cache * x).sum(-1) + self.count


class Quantized(torch.nn.Module):
    """Token and position embeddings, then two linears: [1, 3] ids -> [1, 3, 8]."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Sequential(torch.nn.Embedding(16, 64))
        self.pos = torch.nn.Sequential(torch.nn.Embedding(8, 64))
        self.up = torch.nn.Linear(64, 32)
        self.down = torch.nn.Linear(32, 8)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The model (ids and positions taken modulo the tables' sizes: always in range)."""
        h = self.tok(ids % 16) + self.pos(pos % 8)
        return self.down(F.relu(self.up(h)))


def export_seeds() -> dict[str, aotrt.Program]:
    """The three seeds, exported now (deterministic weights)."""
    torch.manual_seed(0)
    dyn = aotrt.export(Dynamic().eval(), (torch.randn(5, 8), torch.randn(3, 8)),
                       dynamic_shapes=({0: Dim("S", min=2, max=12)},
                                       {0: Dim("T", min=1, max=6)}))
    write, read = CacheWrite().eval(), CacheRead().eval()
    with torch.no_grad():
        write.cache.copy_(torch.randn(8, 4))
    read.load_state_dict(write.state_dict())
    state = aotrt.export({"write": (write, (torch.randn(4), torch.tensor([3]))),
                          "read": (read, (torch.randn(4),))}, share_state=True)
    q = Quantized().eval()
    quantize_embeddings(q.tok, "int4", 32)
    quantize_embeddings(q.pos, "int8")
    quantize_linears(q, "int4", 32, include="^up$")
    quantize_linears(q, "int8", include="^down$", scale_dtype=torch.bfloat16)
    quant = aotrt.export(q, (torch.randint(0, 16, (1, 3)), torch.arange(3)[None]))
    return {"exp_dynamic": dyn, "exp_state": state, "exp_quantized": quant}


def to_record(prog: aotrt.Program) -> dict:
    """A program as the seed file's JSON: its document and its constants (base64)."""
    consts = {name: {"dtype": dtypes.as_dtype(a.dtype).name, "shape": list(a.shape),
                     "data": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()}
              for name, a in prog.constants.items()}
    return {"document": prog.to_json(), "constants": consts}


def main() -> None:
    """Export the seeds again and rewrite their files."""
    SEED_DIR.mkdir(exist_ok=True)
    for name, prog in export_seeds().items():
        path = SEED_DIR / f"{name}.json"
        path.write_text(json.dumps(to_record(prog), separators=(",", ":")) + "\n")
        print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
