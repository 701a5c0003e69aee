"""Activation layouts chosen at export: channels-last for convolution networks.

cuDNN's convolution engines work in NHWC; fed NCHW activations it transposes around every
convolution (half of ResNet-50's GPU time on the H200, issue #9). The lowering lays every
compute result out as torch.export's meta strides, and torch keeps a channels-last layout
through convolutions and pointwise ops, so exporting a channels-last copy of the module
gives NHWC activations and KRSC weights end to end, with the caller's inputs still NCHW
(the first convolution reads them as they are).
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


def for_layout(model: Any, layout: str) -> Any:
    """The module to trace for `layout`: a channels-last copy (for "auto", see
    `auto_channels_last`), or the module itself. The caller's module is never changed."""
    if layout not in LAYOUTS:
        raise InvalidArgument(f"layout: expected one of {list(LAYOUTS)}, got {layout!r}")
    if not isinstance(model, torch.nn.Module) or layout == "contiguous":
        return model
    if layout == "auto" and not auto_channels_last(model):
        return model
    return copy.deepcopy(model).to(memory_format=torch.channels_last)


__all__ = ["LAYOUTS", "auto_channels_last", "for_layout", "has_conv2d"]
