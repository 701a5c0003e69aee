"""Activation layouts chosen at export: channels-last for convolution networks.

cuDNN's convolution engines work in NHWC; fed NCHW activations it transposes around every
convolution (half of ResNet-50's GPU time on the H200, issue #9). The lowering lays every
compute result out as torch.export's meta strides, and torch keeps a channels-last layout
through convolutions and pointwise ops. So the module is traced as a channels-last copy
(KRSC weights) on channels-last copies of its 4-D example inputs: with NCHW inputs, torch
2.11's meta convolution on cuda gives NCHW outputs even for channels-last weights (seen on
the H200; torch 2.14 on cpu gives NHWC). The program's inputs keep row-major specs (the
lowering binds inputs row-major whatever the example's strides), so callers still pass NCHW.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from aotrt.errors import InvalidArgument

#: the layouts `aotrt.export(..., layout=...)` takes
LAYOUTS = ("auto", "channels_last", "contiguous")


def has_conv2d(model: torch.nn.Module) -> bool:
    """True when the module holds a 2-D convolution."""
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def auto_channels_last(model: torch.nn.Module) -> bool:
    """"auto": channels-last for a model with 2-D convolutions when the default device (the
    one `aotrt.load` picks here) prefers it. The cpu device's convolutions are faster on
    NCHW today (resnet18: 72 against 99 ms), so a program made on a cpu-only machine keeps
    it; either program runs correctly on either device."""
    from aotrt.runtime.device import default_device, get_device

    return has_conv2d(model) and get_device(default_device()).prefers_channels_last


def for_layout(model: Any, example_inputs: Any, layout: str) -> tuple[Any, Any]:
    """The module and example inputs to trace for `layout`: channels-last copies (for "auto",
    see `auto_channels_last`), or the caller's own. The caller's objects are never changed."""
    if layout not in LAYOUTS:
        raise InvalidArgument(f"layout: expected one of {list(LAYOUTS)}, got {layout!r}")
    if not isinstance(model, torch.nn.Module) or layout == "contiguous":
        return model, example_inputs
    if layout == "auto" and not auto_channels_last(model):
        return model, example_inputs
    traced = copy.deepcopy(model).to(memory_format=torch.channels_last)
    if isinstance(example_inputs, torch.Tensor):
        return traced, _channels_last(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return traced, type(example_inputs)(_channels_last(x) for x in example_inputs)
    return traced, example_inputs


def _channels_last(x: Any) -> Any:
    """A channels-last copy of a 4-D floating tensor; anything else as it is."""
    if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point():
        return x.contiguous(memory_format=torch.channels_last)
    return x


__all__ = ["LAYOUTS", "auto_channels_last", "for_layout", "has_conv2d"]
