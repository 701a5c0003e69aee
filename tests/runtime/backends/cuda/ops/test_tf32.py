"""TF32 only where it pays (aotrt/runtime/backends/cuda/ops/tf32.py): the rule, which graph
`faster_of` keeps when a build or the timing fails, and `time_graph` on the GPU (skips
cleanly without one)."""

from __future__ import annotations

import pytest

from aotrt.runtime.device import cuda_available, get_device
from aotrt.runtime.backends.cuda.ops import tf32

needs_gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU here")


@pytest.mark.parametrize("exact_ms, tf32_ms, pick", [
    (1.0, 0.5, True), (1.0, tf32.PAYS, True), (1.0, 0.85, False), (1.0, 1.2, False),
    (0.004, 0.0039, False)])
def test_prefers_tf32_only_for_a_clear_gain(exact_ms, tf32_ms, pick) -> None:
    assert tf32.prefers_tf32(exact_ms, tf32_ms) is pick


class _Dnn:
    """Stands in for backends/cuda/libraries.Dnn: faster_of only asks it for a stream."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails

    def tuning_stream(self) -> object:
        if self.fails:
            raise RuntimeError("no stream")
        return object()


def _raise() -> tuple:
    raise RuntimeError("not supported")


@pytest.mark.parametrize("times, expect", [((1.0, 0.3), "tf32"), ((1.0, 0.9), "exact"),
                                           ((0.01, 0.02), "exact")])
def test_faster_of_keeps_tf32_only_where_timed_faster(monkeypatch, times, expect) -> None:
    timed = iter(times)
    monkeypatch.setattr(tf32, "time_graph", lambda dnn, s, built, nbytes: next(timed))
    got = tf32.faster_of(_Dnn(), lambda: ("exact",), lambda: ("tf32",), [4] * 5)
    assert got == (expect,)


def test_faster_of_without_timing_keeps_cudnn_choice() -> None:
    assert tf32.faster_of(_Dnn(fails=True), lambda: ("exact",), lambda: ("tf32",),
                          [4] * 5) == ("tf32",)


def test_faster_of_takes_the_graph_that_builds() -> None:
    assert tf32.faster_of(_Dnn(), _raise, lambda: ("tf32",), [4] * 5) == ("tf32",)
    assert tf32.faster_of(_Dnn(), lambda: ("exact",), _raise, [4] * 5) == ("exact",)
    with pytest.raises(RuntimeError, match="not supported"):
        tf32.faster_of(_Dnn(), _raise, _raise, [4] * 5)


def _graph(dnn, n: int, c: int, hw: int, exact: bool) -> tuple:
    """A float32 NHWC 3x3 convolution graph of cuDNN's, as backends/cuda/ops/conv.py builds one."""
    cudnn = dnn.cudnn
    f = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=f, intermediate_data_type=f, compute_data_type=f,
                      handle=dnn.handle)
    x = g.tensor(name="x", dim=[n, c, hw, hw], stride=[c * hw * hw, 1, hw * c, c], data_type=f)
    w = g.tensor(name="w", dim=[c, c, 3, 3], stride=[c * 9, 1, 3 * c, c], data_type=f)
    y = g.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1],
                     compute_data_type=f, name="conv")
    y.set_output(True).set_data_type(f).set_dim([n, c, hw, hw]).set_stride(
        [c * hw * hw, 1, hw * c, c])
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if exact:
        g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
    g.check_support()
    g.build_plans()
    return g, x, w, None, None, y, int(g.get_workspace_size())


@pytest.mark.cuda
@needs_gpu
def test_time_graph_measures_the_work_and_tf32_pays_on_a_large_convolution() -> None:
    """A convolution with 64x the arithmetic takes longer; on one that large (8x256x56x56,
    3x3) the TF32 engines pass the PAYS rule, so Fp32Math(conv_tf32=True) still uses them."""
    from aotrt.runtime.backends.cuda.libraries import Dnn

    dev = get_device("cuda")
    dnn = dev.libraries.state(Dnn)
    if not dnn.available:
        pytest.skip("no cuDNN here")
    s = dnn.tuning_stream()
    small, large = (1, 256, 7), (8, 256, 56)
    ms = {}
    for shape in (small, large):
        n, c, hw = shape
        nbytes = [n * c * hw * hw * 4, c * c * 9 * 4, 0, 0, n * c * hw * hw * 4]
        for exact in (True, False):
            ms[shape, exact] = tf32.time_graph(dnn, s, _graph(dnn, n, c, hw, exact), nbytes)
    assert all(0 < v < 100 for v in ms.values()), ms
    assert ms[large, True] > 4 * ms[small, True], ms
    assert tf32.prefers_tf32(ms[large, True], ms[large, False]), ms
    assert dnn.tuning_stream() is s     # one stream per device, kept
