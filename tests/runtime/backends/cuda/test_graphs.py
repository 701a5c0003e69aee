"""aotrt/runtime/backends/cuda/graphs.py: a captured graph's programmatic edges become full
dependencies. The driver's graph-edge calls are faked (no GPU needed); the effect on a real
graph was measured on the H200 by a probe of session 23 (2026-12-03), recorded in
bench/results/cuda/h200-2026-12-03-session23.md."""

from __future__ import annotations

import pytest

from aotrt.runtime.backends.cuda import graphs as cuda_graphs


class _Edge:
    """A CUgraphEdgeData stand-in: type 1 and from_port 1 mark a programmatic edge."""

    def __init__(self, kind: int = 0, port: int = 0) -> None:
        self.type, self.from_port = kind, port


class _FakeGraphDriver:
    """The graph-edge calls of cuda.bindings' driver over a list of (from, to, data) edges,
    shaped like CUDA 13's bindings (results are (err, *values), err 0 on success)."""

    def __init__(self, edges: list[tuple[str, str, _Edge]]) -> None:
        self.edges = list(edges)

    def cuGraphGetEdges(self, graph: object, n: int = 0) -> tuple:
        if n == 0:
            return 0, None, None, None, len(self.edges)
        f, t, d = zip(*self.edges)
        return 0, list(f), list(t), list(d), len(self.edges)

    def cuGraphRemoveDependencies(self, graph: object, f: list, t: list, d: list,
                                  n: int) -> tuple:
        for e in zip(f, t, d):
            self.edges.remove(e)
        return (0,)

    def cuGraphAddDependencies(self, graph: object, f: list, t: list, d: object,
                               n: int) -> tuple:
        assert d is None    # default edge data
        self.edges += [(a, b, _Edge()) for a, b in zip(f, t)]
        return (0,)


def test_serialize_graph_makes_early_launch_edges_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Programmatic edges (a library kernel allowed to start before the one it follows
    ends) become default ones; default edges stay as they are."""
    fake = _FakeGraphDriver([("a", "b", _Edge()), ("b", "c", _Edge(1, 1)),
                             ("c", "d", _Edge(0, 2)), ("d", "e", _Edge())])
    monkeypatch.setattr(cuda_graphs, "_drv", fake)
    assert cuda_graphs.serialize_graph(object()) == 2
    assert sorted((f, t) for f, t, _ in fake.edges) == [("a", "b"), ("b", "c"), ("c", "d"),
                                                        ("d", "e")]
    assert all(d.type == 0 and d.from_port == 0 for _, _, d in fake.edges)
    assert cuda_graphs.serialize_graph(object()) == 0


def test_a_graph_whose_edges_cannot_change_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA refuses to remove edges of a graph with memory nodes (NOT_SUPPORTED, 801): the
    graph is refused as Unsupported (the delegate then runs without one), never
    instantiated with its early launches left in."""
    from aotrt.errors import Unsupported

    fake = _FakeGraphDriver([("a", "b", _Edge(1, 1))])
    fake.cuGraphRemoveDependencies = lambda *a: (801,)
    monkeypatch.setattr(cuda_graphs, "_drv", fake)
    with pytest.raises(Unsupported, match="early-launch edges cannot be made full"):
        cuda_graphs.serialize_graph(object())
    assert [(f, t, d.type) for f, t, d in fake.edges] == [("a", "b", 1)]


class _FakeNodes(_FakeGraphDriver):
    """Graph nodes 1..n (ints, as the driver's handles convert) and default edges."""

    def __init__(self, n: int, edges: list[tuple[int, int]]) -> None:
        super().__init__([(a, b, _Edge()) for a, b in edges])
        self.n = n

    def cuGraphGetNodes(self, graph: object, n: int = 0) -> tuple:
        return 0, list(range(1, self.n + 1)) if n else None, self.n


@pytest.mark.parametrize("n, edges, chain", [
    (1, [], True),
    (4, [(1, 2), (2, 3), (3, 4)], True),
    (4, [(1, 2), (1, 3), (2, 4), (3, 4)], False),       # a fork and a join
    (4, [(1, 2), (3, 4)], False),                       # two independent chains
    (3, [(1, 2), (1, 3)], False),
])
def test_is_chain(monkeypatch: pytest.MonkeyPatch, n: int, edges: list, chain: bool) -> None:
    """A graph is a chain when its nodes run one after another, and only then."""
    monkeypatch.setattr(cuda_graphs, "_drv", _FakeNodes(n, edges))
    assert cuda_graphs.is_chain(object()) is chain


class _FakeMemory:
    """cuMemAlloc / cuMemFree over a counter of live blocks."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.next = 1 << 20

    def cuMemAlloc(self, n: int) -> tuple:
        ptr, self.next = self.next, self.next + n
        self.live[ptr] = n
        return 0, ptr

    def cuMemFree(self, ptr: int) -> tuple:
        assert self.pushed == ["ctx"], "blocks are freed with the capture's context current"
        del self.live[ptr]
        return (0,)

    pushed: list = []

    def cuCtxGetCurrent(self) -> tuple:
        return 0, "ctx"

    def cuCtxPushCurrent(self, ctx: object) -> tuple:
        self.pushed = [*self.pushed, ctx]
        return (0,)

    def cuCtxPopCurrent(self) -> tuple:
        self.pushed = self.pushed[:-1]
        return 0, "ctx"


def test_capture_scratch_reuses_the_smallest_free_block_and_frees_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Library scratch under capture: plain allocations (no graph memory nodes), a freed
    block taken again by a later op (best fit, `reused` set), all freed with the graph."""
    mem = _FakeMemory()
    monkeypatch.setattr(cuda_graphs, "_drv", mem)
    s = cuda_graphs.CaptureScratch()
    a, b = s.take(1000), s.take(5000)
    assert len(mem.live) == 2 and not s.reused and a != b
    assert mem.live[a] >= 1000 and mem.live[b] >= 5000
    s.give(b)
    s.give(a)
    assert s.take(900) == a and s.reused        # the smallest block that fits
    c = s.take(6000)                            # none fits: a new one
    assert c not in (a, b) and len(mem.live) == 3
    assert s.take(4000) == b
    s.close()
    assert mem.live == {} and mem.pushed == []
    s.close()                                   # twice is fine
