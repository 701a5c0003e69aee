"""On the GPU machine: GPU time per kernel of one aotrt run (CUPTI through torch.profiler),
next to torch.compile's, for one benchmark model.

    python3 scripts/cuda_profile.py gpt2_1x256 [auto|channels_last|contiguous] [--no-compile]
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
import bench  # noqa: E402

import aotrt  # noqa: E402


def kernel_table(prof, title: str) -> None:
    """Kernels by total GPU time (us), grouped by name prefix."""
    tot: dict = collections.Counter()
    cnt: dict = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            key = e.name[:60]
            tot[key] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time
            cnt[key] += 1
    total = sum(tot.values())
    print(f"== {title}: {total / 3:.1f} us GPU per run, {sum(cnt.values()) / 3:.0f} kernels")
    for k, v in tot.most_common(14):
        print(f"  {v / 3:8.1f} us  x{cnt[k] / 3:4.0f}  {k}")


name = sys.argv[1] if len(sys.argv) > 1 else "gpt2_1x256"
layout = sys.argv[2] if len(sys.argv) > 2 else "auto"
m, inputs = bench.build(name)
prog = aotrt.export(m, inputs, layout=layout)
convs = [ins for ins in prog.instructions if ins.get("fn") == "convolution"]
nhwc = sum(1 for ins in convs if prog.tensors[ins["outs"][0]]["strides"][1] == 1)
print(f"layout {layout}: {nhwc} of {len(convs)} convolutions write channels-last")
for ins in convs[:3]:
    print("  x/w/out strides", [prog.tensors[t]["strides"] for t in
                                (ins["ins"][0], ins["ins"][1], ins["outs"][0])])
# Layout breaks: instructions reading a 4-D NCHW activation while writing NHWC (or the
# reverse), each one a transposing access that the channels-last export should not leave.
breaks = []
for i, ins in enumerate(prog.instructions):
    four = [t for t in list(ins.get("ins", [])) + list(ins.get("outs", []))
            if isinstance(t, int) and len(prog.tensors[t]["sizes"]) == 4
            and prog.tensors[t]["sizes"][1] > 1 and prog.tensors[t].get("root") == "arena"]
    kinds = {prog.tensors[t]["strides"][1] == 1 for t in four}
    if len(kinds) > 1:
        breaks.append((i, ins.get("fn") or ins.get("kernel") or ins["op"],
                       [prog.tensors[t]["strides"] for t in four]))
print(f"layout breaks: {len(breaks)}")
for b in breaks[:8]:
    print("  ", b)
with aotrt.load(prog, device="cuda") as d:
    for _ in range(3):
        d.run(*inputs)
    d.stream.commit_and_wait()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            d.run(*inputs)
        d.stream.commit_and_wait()
    kernel_table(prof, f"aotrt {name}")
if "--no-compile" in sys.argv:
    sys.exit(0)
cm = torch.compile(m)
with torch.no_grad():
    for _ in range(3):
        cm(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            cm(*inputs)
        torch.cuda.synchronize()
kernel_table(prof, f"torch.compile {name}")
