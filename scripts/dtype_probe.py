"""On the GPU machine: why a zoo model's half-precision export has a float32 GEMM operand.

    python3 scripts/dtype_probe.py levit_128s [float16]

Captures the model the way aotrt.export does, and prints every bmm/mm/matmul node whose
inputs' dtypes differ from its result's, with the chain of ops (three levels) behind each
input; then runs aotrt.export and prints its error, if any.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def chain(node, depth: int = 3, pad: str = "    ") -> None:
    """Print `node` and what it reads, `depth` levels up."""
    val = node.meta.get("val")
    dt = getattr(val, "dtype", None)
    print(f"{pad}{node.name}: {node.target} -> {dt} {tuple(getattr(val, 'shape', ()))}")
    if depth:
        for a in node.all_input_nodes:
            chain(a, depth - 1, pad + "  ")


def main() -> None:
    """Export, print the mismatched GEMM nodes."""
    import torch
    import zoo

    import aotrt
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import runs_whole

    name = sys.argv[1]
    dt = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float16")
    m, inputs = zoo.build(name)
    m = m.to(dt)
    x = tuple(a.to(dt) for a in inputs)
    print("torch", torch.__version__)
    with torch.no_grad():
        ep = capture(m, x, runs_whole=runs_whole)
    n = 0
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or "mm" not in str(node.target) and \
                "matmul" not in str(node.target):
            continue
        out = node.meta.get("val")
        ins = [a.meta.get("val") for a in node.all_input_nodes]
        if any(getattr(v, "dtype", None) != getattr(out, "dtype", None) for v in ins):
            n += 1
            if n <= 3:
                print(f"== {node.name} {node.target}")
                chain(node)
    print(f"{n} GEMM nodes with mixed dtypes")
    try:
        with torch.no_grad():
            aotrt.export(m, x)
        print("aotrt.export: ok")
    except Exception as e:  # noqa: BLE001 - the point is to see it
        print(f"aotrt.export: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
