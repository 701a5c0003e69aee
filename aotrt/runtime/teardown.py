"""What a delegate tears down, and in which order: its resources (owner, stream, kernel
library, CUDA graph) live apart from the delegate so that its finalizer can hold them."""

from __future__ import annotations

import logging
from typing import Any

from aotrt.errors import AotrtError
from aotrt.runtime.device import KernelLibrary, Stream
from aotrt.runtime.memory import Owner

log = logging.getLogger(__name__)


class Resources:
    """A delegate's owner, stream, kernel library and CUDA graph, apart from the delegate so
    a finalizer can hold them."""

    __slots__ = ("owner", "stream", "library", "graph", "borrowed", "loaded")

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.stream: Stream | None = None
        self.library: KernelLibrary | None = None
        self.graph: Any = None
        #: a stream the owner's work ran on but does not own (a program's, shared by its
        #: methods): waited for, not closed
        self.borrowed: Stream | None = None
        #: what goes last: the loaded program a lone delegate owns (constants, state,
        #: kernels, stream); a Module closes its own after its methods
        self.loaded: Any = None


def teardown(res: Resources) -> None:
    """Wait, free everything the owner holds, close the stream, then release the graph and
    the kernel library, whose code no queued work can run any more (runs once)."""
    owner, stream = res.owner, res.stream
    err: BaseException | None = None
    for s in (stream, res.borrowed):
        if isinstance(s, Stream) and not s.closed:
            try:
                s.commit_and_wait()
            except AotrtError as e:
                log.debug("delegate teardown: queued work failed: %s", e)
    try:
        owner.close()
    except BaseException as e:  # noqa: BLE001 - the stream must still close
        err = e
    if isinstance(stream, Stream):
        try:
            stream.close()
        except BaseException as e:  # noqa: BLE001
            err = err or e
    # A graph's kernel nodes point into the library's module: the graph goes first.
    graph, res.graph = res.graph, None
    library, res.library = res.library, None
    for release in (getattr(graph, "close", None), getattr(library, "close", None)):
        if release is None:
            continue
        try:
            release()
        except BaseException as e:  # noqa: BLE001
            err = err or e
    loaded, res.loaded, res.borrowed = res.loaded, None, None
    if loaded is not None:
        try:
            loaded.close()
        except BaseException as e:  # noqa: BLE001
            err = err or e
    if err is not None:
        raise err


__all__ = ["Resources", "teardown"]
