"""Every environment variable aotrt reads is read here, and nowhere else.

`env()` reads them at the moment of the call (tests and users may set one between calls);
the code that uses one turns it into its own frozen options (PoolOptions, StreamOptions,
the cpu device's compile flags) and validates it there, naming the variable.

    AOTRT_CHECK_HAZARDS      hazard checker on by default (1/true/yes)
    AOTRT_POOL_MB            the per-stream pool's cap, in MiB
    AOTRT_FLUSH_INTERVAL     commands a stream records before it flushes on its own
    AOTRT_CACHE_DIR          where compiled kernels are cached
    AOTRT_CC_SANITIZE        sanitizers for the cpu kernels' compiler (tests)
    CC                       the C compiler of cpu kernels
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

_FALSE = ("", "0", "false", "no")


@dataclass(frozen=True)
class Env:
    """The environment variables aotrt reads, as found (raw strings, or None when unset)."""

    check_hazards: bool
    pool_mb: str | None
    flush_interval: str | None
    cache_dir: str | None
    cc_sanitize: str
    cc: str


def env() -> Env:
    """The variables as they are now."""
    get = os.environ.get
    return Env(check_hazards=get("AOTRT_CHECK_HAZARDS", "0").strip().lower() not in _FALSE,
               pool_mb=get("AOTRT_POOL_MB"),
               flush_interval=get("AOTRT_FLUSH_INTERVAL"),
               cache_dir=get("AOTRT_CACHE_DIR") or None,
               cc_sanitize=get("AOTRT_CC_SANITIZE", "").strip(),
               cc=get("CC", "cc"))


def default_library_env(values: dict[str, str]) -> None:
    """Set `values` for a library the process loads later (OpenMP), all of them, unless the
    process already set any one: a setting it chose stays, and is not mixed with ours."""
    if not any(name in os.environ for name in values):
        os.environ.update(values)


@contextlib.contextmanager
def library_switch(name: str, value: str) -> Iterator[None]:
    """Within the block, a library's environment switch `name` is `value` (one it reads at
    the call, e.g. transformers' while aotrt exports); its old value (or absence) after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


__all__ = ["Env", "default_library_env", "env", "library_switch"]
