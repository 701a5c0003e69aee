"""Nearest upsampling on cuda: a gather through source-index arrays kept on the device."""

from __future__ import annotations

import numpy as np

from aotrt.runtime.backends.cuda.ops.common import Work, i32, launch
from aotrt.runtime.tensor import Handle
from aotrt.sources import source


def make_upsample(out: Handle, x: Handle, rows: np.ndarray, cols: np.ndarray) -> Work:
    """Nearest upsampling as a gather through the op's own source-index arrays (uploaded
    once per distinct array and kept by the device's library state)."""
    dev = out.device
    n, c, h, w = x.sizes
    ho, wo = out.sizes[2:]
    libs = dev.libraries
    cl = out.strides[1] == 1 and c > 1      # NHWC output: threads walk the channels fastest
    args = [x.address, out.address, libs.int64_buffer(rows), libs.int64_buffer(cols), n, c,
            h, w, ho, wo, *x.strides, *out.strides, i32(cl)]
    return launch(dev, KERNELS, f"aot_upsample{x.dtype.itemsize}", n * c * ho * wo, args)


# ---------------------------------------------------------------------------------------------
# CUDA C in upsample.cu (compiled after common.PRELUDE, prelude.cuh)

KERNELS = source(__package__, "upsample.cu")
