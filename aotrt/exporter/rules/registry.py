"""The one rule table: an ATen op's name -> the `Rule` that checks and lowers it.

Rule families register here from their own files (see aotrt/exporter/rules/__init__.py);
the driver (aotrt/exporter/lower.py) consults only this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch.fx

from aotrt.errors import InvalidArgument
from aotrt.exporter.nodes import target_name

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering
    from aotrt.exporter.tview import TView

Node = torch.fx.Node
LowerFn = Callable[["Lowering", Node], None]


@dataclass(frozen=True)
class Rule:
    """How one ATen op is checked and lowered; every hook but `lower` is optional."""

    #: the family file that registered it ('views', 'library', ...)
    family: str
    #: emit the node's instructions and bind its value (lw.bind)
    lower: LowerFn
    #: raise Unsupported (naming the node) for forms the rule cannot lower
    check: Callable[[Node], None] | None = None
    #: True when the node becomes (part of) a generated kernel, grouped by fusion
    fusible: Callable[["Lowering", Node], bool] | None = None
    #: single-result view ops: the view the node makes of its base (None: not expressible)
    view: Callable[[Node, "TView"], "TView | None"] | None = None
    #: multi-result view ops (split, unbind): the views, picked by getitem
    views: Callable[[Node, "TView"], "list[TView]"] | None = None
    #: a consumer whose memory a producer can write into: (lw, consumer, producer,
    #: via_view) -> the producer's slot there, or None
    slot: Callable[["Lowering", Node, Node, bool], "TView | None"] | None = None
    #: a single-node unit writing `region` whose inputs may share its Buf: whether that is
    #: safe (by default: only when no input overlaps the region)
    writes_over: Callable[["Lowering", Node, "TView"], bool] | None = None
    #: an op that only checks or annotates: erased before anything is lowered
    noop: bool = False


RULES: dict[str, Rule] = {}


def register(names: Iterable[str], rule: Rule) -> None:
    """Add `rule` for every op name ('aten.add.Tensor'); a second rule for a name is an error."""
    for name in names:
        known = RULES.get(name)
        if known is not None:
            raise InvalidArgument(f"{name}: already has a rule from rules/{known.family}.py, "
                                  f"rules/{rule.family}.py adds another")
        RULES[name] = rule


def rule(*names: str, **hooks: Any) -> Callable[[LowerFn], LowerFn]:
    """Decorator: register the decorated lowering function as the rule of `names`."""
    def deco(fn: LowerFn) -> LowerFn:
        register(names, Rule(fn.__module__.rsplit(".", 1)[-1], fn, **hooks))
        return fn
    return deco


def rule_of(node: Node) -> Rule | None:
    """The rule of a call_function node (None for other nodes and unknown ops)."""
    if node.op != "call_function":
        return None
    return RULES.get(target_name(node.target))
