"""What the cuda library ops share (aotrt/runtime/backends/cuda/ops/common.py): the per-stream
workspace and `replayed`, which captures a planned library command into a CUDA graph on its
second call. Skips cleanly without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, cuda_available, get_device

needs_gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU here")


@pytest.fixture
def dev():
    return get_device("cuda")


@pytest.fixture
def stream(dev):
    s = dev.create_stream(StreamOptions())
    yield s
    s.close()


def _memset_work(ptr: int, n: int, byte: list[int]):
    """A work item that fills n bytes at ptr with byte[0], read when it is called."""
    from cuda.bindings import driver

    def work(s) -> None:
        driver.cuMemsetD8Async(ptr, byte[0], n, s.cs.handle)
    return work


@needs_gpu
def test_replayed_runs_plainly_once_then_launches_its_capture(dev, stream) -> None:
    """Call 1 runs the work; call 2 captures it (so what it enqueued is frozen) and launches
    the graph; later calls launch that graph without running the host code again."""
    from aotrt.runtime.backends.cuda.ops.common import replayed

    h = shims.empty_strided([4096], [1], "uint8", dev)
    byte = [7]
    calls = []
    inner = _memset_work(h.address, 4096, byte)
    work = replayed(lambda s: (calls.append(1), inner(s)))
    for i, expect in enumerate([7, 9, 9, 9]):
        byte[0] = 7 if i == 0 else 9 if i == 1 else 11    # host value at each call
        work(stream)
        stream.commit_and_wait()
        np.testing.assert_array_equal(h.numpy(), np.full(4096, expect, np.uint8))
    assert len(calls) == 2          # the host code ran for the plain call and the capture
    shims.delete_tensor_object(h)


@needs_gpu
def test_replayed_runs_plainly_inside_a_whole_run_capture_and_on_another_stream(
        dev, stream) -> None:
    from aotrt.runtime.backends.cuda.ops.common import replayed

    h = shims.empty_strided([256], [1], "uint8", dev)
    byte = [3]
    calls = []
    inner = _memset_work(h.address, 256, byte)
    work = replayed(lambda s: (calls.append(1), inner(s)))
    work(stream)
    stream.begin_capture()
    try:
        work(stream)                # a second call, but inside a capture: plain
    finally:
        graph = stream.end_capture()
    assert len(calls) == 2
    byte[0] = 5
    work(stream)                    # the third call captures
    stream.commit_and_wait()
    np.testing.assert_array_equal(h.numpy(), np.full(256, 5, np.uint8))
    assert len(calls) == 3
    other = dev.create_stream(StreamOptions())
    byte[0] = 6
    work(other)                     # another stream: plain, not the graph baked for `stream`
    other.commit_and_wait()
    np.testing.assert_array_equal(h.numpy(), np.full(256, 6, np.uint8))
    assert len(calls) == 4
    graph.close()
    other.close()
    shims.delete_tensor_object(h)


@needs_gpu
def test_an_outgrown_workspace_a_graph_baked_in_is_kept(dev, stream) -> None:
    """A captured graph keeps writing the workspace it was captured with: when a larger one
    replaces it, the old buffer is retired (kept), not freed under the graph."""
    from aotrt.runtime.backends.cuda.ops.common import replayed, stream_workspace

    from cuda.bindings import driver

    def work(s) -> None:
        driver.cuMemsetD8Async(stream_workspace(s, 1 << 20), 0, 1 << 20, s.cs.handle)

    w = replayed(work)
    w(stream)
    w(stream)                       # captured with the 1 MiB workspace
    assert stream.workspace_baked
    old = stream.workspace[2]
    stream_workspace(stream, 8 << 20)
    assert stream.retired == [old]
    assert stream.workspace[1] == 8 << 20 and not stream.workspace_baked
    stream_workspace(stream, 16 << 20)     # not baked: the 8 MiB one is simply freed
    assert stream.retired == [old]
    stream.commit_and_wait()


@needs_gpu
def test_a_workspace_a_whole_run_capture_baked_in_is_kept(dev, stream) -> None:
    """begin_capture/end_capture (a delegate's whole-run graph) bakes the workspace in as
    `replayed` does: outgrowing it afterwards retires the old buffer instead of freeing it."""
    from aotrt.runtime.backends.cuda.ops.common import stream_workspace

    from cuda.bindings import driver

    stream_workspace(stream, 1 << 20)
    stream.begin_capture()
    try:
        driver.cuMemsetD8Async(stream_workspace(stream, 1 << 20), 0, 1 << 20,
                               stream.cs.handle)
    finally:
        graph = stream.end_capture()
    assert stream.workspace_baked
    old = stream.workspace[2]
    stream_workspace(stream, 8 << 20)
    assert stream.retired == [old]
    graph.launch(stream)            # still writes the retired buffer, which is alive
    stream.commit_and_wait()
    graph.close()


@needs_gpu
def test_replayed_convolutions_and_attention_keep_matching_torch_across_runs() -> None:
    """Without a whole-run graph, the cuDNN convolution and attention commands are captured
    on the second run and launched after; every run still matches torch on fresh inputs."""
    torch = pytest.importorskip("torch")
    import aotrt

    if not torch.cuda.is_available():
        pytest.skip("torch has no cuda here")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            y = torch.relu(self.conv(x) + x)
            t = y.flatten(2).transpose(1, 2)                    # (b, hw, c)
            q, k, v = self.qkv(t).view(2, 64, 3, 2, 8).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return a.transpose(1, 2).reshape(2, 64, 16)

    torch.manual_seed(0)
    m = Block().eval().half().cuda()
    x0 = torch.randn(2, 16, 8, 8, device="cuda", dtype=torch.float16)
    prog = aotrt.export(m, (x0,))
    with aotrt.load(prog, device="cuda", cuda_graph=False) as d, torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 16, 8, 8, device="cuda", dtype=torch.float16)
            ref = m.float()(x.float()).double()
            m.half()
            (out,) = d.run(x)
            got = torch.from_dlpack(out).double()
            err = ((got - ref).norm() / ref.norm()).item()
            eager = ((m(x).double() - ref).norm() / ref.norm()).item()
            assert err < max(2e-2, 1.5 * eager), (err, eager)
