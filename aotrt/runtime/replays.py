"""What a delegate replays instead of building its steps at each run: a captured CUDA graph
over static input/output buffers (`GraphReplay`), or, on a host device, every step's
commands planned once over such buffers (`StaticIO`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aotrt.dtypes import DType
from aotrt.errors import AotrtError
from aotrt.runtime import shims
from aotrt.runtime.arguments import Arg
from aotrt.runtime.device import Command, Stream
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)


@dataclass
class GraphReplay:
    """A captured run: the graph, its static input/output buffers (uint8 bases), the views
    the capture used, and the accesses a replay makes (every allocation it can touch)."""

    graph: Any
    ins: list[Handle]
    outs: list[Handle]
    keep: list[Handle]
    accesses: list[Any]
    in_ptrs: list[int]
    out_views: list[tuple[int, tuple, tuple, int, DType]]

    def direct_ok(self, stream: Stream, args: list[Arg], outs: list[Arg] | None) -> bool:
        """Whether a run can take the lean replay: no out= tensors, the hazard checker off
        (it keeps its full checks), work enqueued at once, and every input a device tensor
        bound where it lies whose memory the runtime does not know (the general path
        handles aotrt memory, staging and overlaps)."""
        if outs is not None or stream.hazards.enabled or stream.options.deferred:
            return False
        mem = stream.device.memory
        for a in args:
            if a.kind == "empty":
                continue
            if a.kind != "blob" or a.span is None:
                return False
            if mem.knows(*a.span):
                return False
        return True


class StaticIO:
    """Every step's commands, planned over static input/output buffers (uint8 bases)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.ins: list[Handle] = []
        self.outs: list[Handle] = []
        self.keep: list[Handle] = []        # every handle made for the plan, bases first
        self.steps: list[tuple[str, tuple[Command, ...]]] = []

    def delete(self) -> None:
        """Delete the plan's handles, views before their bases, once its work is done."""
        try:
            self.stream.commit_and_wait()
        except AotrtError as e:
            # After a failed run: its error is the one the caller gets, not this report of it.
            log.debug("static-I/O plan: queued work before its deletion: %s", e)
        for h in reversed(self.keep):
            if h.state == "live":
                shims.delete_tensor_object(h)
        self.keep.clear()

    def queue(self) -> None:
        """Queue every planned command again, each under its instruction's label."""
        stream = self.stream
        try:
            for label, cmds in self.steps:
                stream.label = label
                for cmd in cmds:
                    stream.replay(cmd)
        finally:
            stream.label = ""


__all__ = ["GraphReplay", "StaticIO"]
