"""Options of a stream: what its commands may do (threads, float32 math) and how it runs
(deferred, hazard checks, flush interval). Frozen dataclasses, validated when made."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from aotrt import settings
from aotrt.errors import InvalidArgument


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        # No affinity API (not Linux): every core the OS reports.
        return max(1, os.cpu_count() or 1)


def check_threads(threads: Any) -> None:
    """Raise InvalidArgument unless `threads` is None or a positive int."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise InvalidArgument(f"threads: expected a positive int or None, got {threads!r}")


@dataclass(frozen=True)
class Fp32Math:
    """How float32 library ops may trade exactness for speed: TF32 tensor cores (cuda, a
    10-bit mantissa) and Winograd convolutions (cpu, float32 throughout).

    torch's `backends.cudnn.allow_tf32` (True by default) and `backends.cuda.matmul.
    allow_tf32` (False) are the same two choices. aotrt keeps float32 unless told: a
    TF32 convolution's error is about 1e-3, a thousand times float32's. Devices without
    TF32 (cpu) compute float32 in float32 either way. Winograd is on by default: it
    computes in float32, and its error (about 1e-6 relative, a few times the direct
    convolution's) stays within float32's tolerances, where TF32's does not.
    """

    conv_tf32: bool = False
    matmul_tf32: bool = False
    #: the largest output tile m of the cpu's Winograd F(m x m, 3 x 3) for 3x3 stride-1
    #: convolutions (backends/cpu/ops/winograd.py): 4 (ResNet-18 25% faster a run; one layer's error
    #: 12 to 16 times the direct convolution's, about 1e-6 relative), 2 (within 2.5 times),
    #: or 0 for none
    conv_winograd: int = 4

    def __post_init__(self) -> None:
        for name in ("conv_tf32", "matmul_tf32"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(f"Fp32Math.{name}: expected a bool, got "
                                      f"{getattr(self, name)!r}")
        if isinstance(self.conv_winograd, bool) or self.conv_winograd not in (0, 2, 4):
            raise InvalidArgument(f"Fp32Math.conv_winograd: expected 0, 2 or 4, got "
                                  f"{self.conv_winograd!r}")


@dataclass(frozen=True)
class StreamOptions:
    """Options of a stream: `deferred` runs nothing until a wait (cpu), hazard checking."""

    deferred: bool = False
    check_hazards: bool = False
    # Commit-and-continue every N commands so the device starts before the host is done
    # recording (0 disables). AOTRT_FLUSH_INTERVAL overrides the default.
    flush_interval: int = 16
    # Threads one kernel call of this stream may use (cpu; other devices ignore it).
    # None: every core this process may run on (default_threads()).
    threads: int | None = None
    # The float32 math the stream's library ops may use (convolutions, matmuls).
    fp32_math: Fp32Math = Fp32Math()

    def __post_init__(self) -> None:
        if not isinstance(self.flush_interval, int) or self.flush_interval < 0:
            raise InvalidArgument(f"flush_interval: must be an int >= 0, got "
                                  f"{self.flush_interval!r}")
        check_threads(self.threads)
        if not isinstance(self.fp32_math, Fp32Math):
            raise InvalidArgument(f"fp32_math: expected an aotrt.Fp32Math, got "
                                  f"{self.fp32_math!r}")

    @property
    def kernel_threads(self) -> int:
        """`threads`, with None resolved to default_threads()."""
        return default_threads() if self.threads is None else self.threads

    @staticmethod
    def from_env(**kwargs: Any) -> "StreamOptions":
        """Options with AOTRT_FLUSH_INTERVAL (an int >= 0) applied, if set."""
        raw = settings.env().flush_interval
        if raw is not None and "flush_interval" not in kwargs:
            if not raw.isdigit():
                raise InvalidArgument(f"AOTRT_FLUSH_INTERVAL: expected an int >= 0, got {raw!r}")
            kwargs["flush_interval"] = int(raw)
        return StreamOptions(**kwargs)
