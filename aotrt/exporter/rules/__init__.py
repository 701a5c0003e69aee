"""The lowering's rules: one table (`RULES`, in registry.py) maps each ATen op's name to the
one `Rule` that checks and lowers it. Each family lives in its own file:

- views.py        view ops, split/unbind, getitem, clones that alias: new TViews, no copies
- cat_scatter.py  cat, slice/select/diagonal_scatter, and where a value is written (placement)
- index.py        index_put: a generated scatter kernel (accumulate: a gather over constant indices)
- library.py      GEMMs, convolution, attention, topk/sort, max pooling, upsampling
- fold.py         no-op asserts; batch-norm and constant folding before lowering
- fused.py        the kernel table's ops (pointwise.py, reductions.py): fused kernels

The driver (aotrt/exporter/lower.py) consults only the table. Adding an op means adding one
rule in one family file, and its test.
"""

from __future__ import annotations

# Importing the families fills the table; fused comes last (it takes the kernel-table ops
# no other family claimed).
from aotrt.exporter.rules import cat_scatter, fold, index, library, views  # noqa: F401
from aotrt.exporter.rules import fused  # noqa: F401
from aotrt.exporter.rules.registry import RULES, Rule, register, rule, rule_of

__all__ = ["RULES", "Rule", "register", "rule", "rule_of"]
