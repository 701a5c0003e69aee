"""The rule table (aotrt/exporter/rules/registry.py): one rule per op, and the driver asks
only the table for support, lowering and views."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
import torch.nn as nn

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.exporter.capture import KEPT_OPS
from aotrt.exporter.fuse import fusible
from aotrt.exporter.lower import runs_whole
from aotrt.exporter.nodes import ops
from aotrt.exporter.optable import OPS
from aotrt.exporter.rules import RULES, Rule, register, rule_of

FAMILIES = {"views", "cat_scatter", "index", "library", "fold", "fused"}


def test_every_rule_names_an_op_of_this_torch() -> None:
    """Rule names are real overloads ('aten.packet.overload'): a typo would never match."""
    import aotrt.exporter.quantize  # noqa: F401 - defines the aotrt:: custom ops

    own = {"getitem", "conv_epilogue"}      # fx's getitem, and aotrt/exporter/epilogue.py's
    bad = [n for n in RULES if n not in own and not (
        n.startswith("aten.") and ops(n[len("aten."):])
        or n.startswith("prims.") and hasattr(torch.ops.prims, n.split(".")[1])
        or n.startswith("aotrt.") and hasattr(torch.ops.aotrt, n.split(".")[1]))]
    assert not bad, bad
    assert {r.family for r in RULES.values()} == FAMILIES


def test_every_kernel_table_op_and_kept_op_has_one_rule() -> None:
    """The ops capture keeps whole and every op of the kernel table reach exactly one rule;
    kernel-table ops that another family owns are the views and aliasing copies."""
    for op in KEPT_OPS:
        assert str(op) in RULES, op
    others = {}
    for op in OPS:
        r = RULES[str(op)]
        if r.family != "fused":
            others[str(op)] = r.family
    assert others == {"aten.alias.default": "views", "aten.lift_fresh_copy.default": "views",
                      "aten.clone.default": "views", "aten.copy.default": "views"}


def test_a_second_rule_for_an_op_is_refused() -> None:
    before = RULES["aten.mm.default"]
    with pytest.raises(InvalidArgument, match=r"aten\.mm\.default.*library\.py.*views\.py"):
        register(["aten.mm.default"], Rule("views", lambda lw, node: None))
    assert RULES["aten.mm.default"] is before


def test_families_hooks_are_where_the_driver_looks() -> None:
    """Views give views, library ops take their temporaries, no-ops are erased."""
    assert RULES["aten.permute.default"].view is not None
    assert RULES["aten.split.Tensor"].views is not None
    assert RULES["aten.cat.default"].slot is not None
    assert RULES["aten.convolution.default"].writes_over is not None
    assert RULES["aten._assert_scalar.default"].noop
    assert all(r.fusible is not None for r in RULES.values() if r.family == "fused")


class _Mul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x + 1


def test_an_op_without_a_rule_is_refused_naming_op_and_line(monkeypatch) -> None:
    """Take aten.mul.Tensor's rule away: export refuses the multiply (capture decomposes it
    to prims.mul first, which has no rule either), naming the op and the model's line."""
    monkeypatch.delitem(RULES, "aten.mul.Tensor")
    src, first = inspect.getsourcelines(_Mul.forward)
    line = first + next(i for i, s in enumerate(src) if "x * x" in s)
    with pytest.raises(aotrt.Unsupported) as info:
        aotrt.export(_Mul(), (torch.randn(2, 3),))
    msg = str(info.value)
    assert re.match(r"(aten|prims)\.mul\.\w+ at ", msg), msg
    assert f"test_registry.py:{line}" in msg and "not supported by aotrt" in msg


def test_runs_whole_follows_the_table(monkeypatch) -> None:
    ep = torch.export.export(_Mul(), (torch.randn(2, 3),))
    mul = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.mul.Tensor)
    assert rule_of(mul) is RULES["aten.mul.Tensor"] and fusible(mul) and runs_whole(mul)
    monkeypatch.delitem(RULES, "aten.mul.Tensor")
    assert rule_of(mul) is None and not runs_whole(mul)
