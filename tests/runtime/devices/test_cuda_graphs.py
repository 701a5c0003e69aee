"""aotrt/runtime/devices/cuda_graphs.py: a captured graph's programmatic edges become full
dependencies. The driver's graph-edge calls are faked (no GPU needed); the effect on a real
graph is measured by scripts/cuda_first_replay_probe.py on the H200."""

from __future__ import annotations

import pytest

from aotrt.runtime.devices import cuda_graphs


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
