"""Tests for aotrt/runtime/teardown.py: a delegate's resources go in order, and a failure
in one step does not stop the others."""

from __future__ import annotations

import pytest

from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.memory import Owner
from aotrt.runtime.teardown import Resources, teardown


class _Closes:
    def __init__(self, name: str, order: list[str], fail: bool = False) -> None:
        self.name, self.order, self.fail = name, order, fail

    def close(self) -> None:
        self.order.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} failed")


def test_the_graph_goes_before_the_library_and_the_stream_closes() -> None:
    order: list[str] = []
    res = Resources(Owner("teardown test"))
    res.stream = get_device("cpu").create_stream(StreamOptions())
    res.graph, res.library = _Closes("graph", order), _Closes("library", order)
    teardown(res)
    assert order == ["graph", "library"]
    assert res.stream.closed and res.graph is None and res.library is None


def test_a_failing_step_is_raised_after_the_rest_ran() -> None:
    order: list[str] = []
    res = Resources(Owner("teardown test"))
    res.stream = get_device("cpu").create_stream(StreamOptions())
    res.graph, res.library = _Closes("graph", order, fail=True), _Closes("library", order)
    with pytest.raises(RuntimeError, match="graph failed"):
        teardown(res)
    assert order == ["graph", "library"] and res.stream.closed
