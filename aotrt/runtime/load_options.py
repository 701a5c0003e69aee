"""load's arguments checked, and the device and stream options they ask for (shared by a
lone Delegate and a Module, which builds its methods' Delegates over one stream)."""

from __future__ import annotations

from typing import Any

from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Device, default_device, get_device
from aotrt.runtime.options import Fp32Math, StreamOptions, check_threads


def resolve_options(device: Any, check_hazards: Any, cuda_graph: Any, threads: Any,
                    fp32_math: Any) -> tuple[Device, StreamOptions]:
    """Check load's arguments; the device and the stream options they ask for."""
    if not isinstance(check_hazards, bool):
        raise InvalidArgument(f"check_hazards: expected a bool, got {check_hazards!r}")
    if cuda_graph is not None and not isinstance(cuda_graph, bool):
        raise InvalidArgument(f"cuda_graph: expected a bool or None, got {cuda_graph!r}")
    check_threads(threads)
    fp32_math = Fp32Math() if fp32_math is None else fp32_math
    if not isinstance(fp32_math, Fp32Math):
        raise InvalidArgument(f"fp32_math: expected an aotrt.Fp32Math or None, got "
                              f"{fp32_math!r}")
    dev = get_device(default_device() if device is None else device)
    if cuda_graph and not dev.supports_graphs:
        raise InvalidArgument(f"cuda_graph: the {dev.name} device cannot replay graphs; "
                              f"leave cuda_graph unset or False there")
    return dev, StreamOptions.from_env(check_hazards=check_hazards, threads=threads,
                                       fp32_math=fp32_math)


__all__ = ["resolve_options"]
