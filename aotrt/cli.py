"""The command line: `python -m aotrt demo | export | run | bench | inspect`.

`run`, `bench` and `inspect` need only the runtime (numpy); `demo` and `export` live in
aotrt/demo.py (models in aotrt/models.py), imported only when one of them runs, since they
import torch. A mistake gives one line on stderr (exit 2 for bad arguments or files, 1 for a
failed run; the traceback with --verbose); long steps show progress when stderr is a
terminal (aotrt/progress.py).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import statistics
import sys
import time
import traceback
from typing import Any, Sequence

import numpy as np

from aotrt import progress
from aotrt.errors import (AotrtError, CompileError, InvalidArgument, ProgramError,
                          Unsupported)
from aotrt.measure import ms, synced_run, time_calls

log = logging.getLogger(__name__)

#: demo models that generate text (aotrt/llm/cli.py), beside the detectors
LLM_DEMOS = ("gpt2", "gpt2-tiny", "llama-200m", "llama-1b")


# ---------------------------------------------------------------------------------------------
# helpers


def _random_inputs(prog: Any, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for s in prog.record.inputs:
        dt = s.dtype
        if dt.is_float:
            a = rng.standard_normal(s.shape).astype(dt.np)
        elif dt.name == "bool":
            a = rng.random(s.shape) < 0.5
        else:
            a = rng.integers(0, 10, size=s.shape).astype(dt.np)
        arrays.append(a)
    return arrays


# ---------------------------------------------------------------------------------------------
# commands


def _method(prog: Any, name: str | None) -> tuple[str, Any]:
    """The method `--method` names (or the program's only one) and its Program."""
    from aotrt.errors import InvalidArgument

    methods = prog.methods
    if name is None:
        if len(methods) != 1:
            raise InvalidArgument(f"--method: the program has methods {list(methods)}; "
                                  f"choose one")
        name = next(iter(methods))
    return name, prog.method(name)


def cmd_demo(args: argparse.Namespace) -> int:
    """Export a YOLO-style detector, run it, and compare it with torch eager."""
    if args.model in LLM_DEMOS:
        return importlib.import_module("aotrt.llm.cli").run_demo(args)
    return importlib.import_module("aotrt.demo").run_demo(args)


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate tokens from a language model: a .aotp file made by aotrt.llm.export, or a
    named shape or transformers config directory (exported first, with random weights)."""
    return importlib.import_module("aotrt.llm.cli").run_generate(args)


def cmd_export(args: argparse.Namespace) -> int:
    """Export a model (by name, module:factory, or a .pt2 file) to a .aotp file."""
    return importlib.import_module("aotrt.demo").run_export(args)


def cmd_run(args: argparse.Namespace) -> int:
    """Run a program on given (.npz/.npy) or random inputs and print or save the outputs."""
    import aotrt

    prog = aotrt.Program.load(args.program)
    name, meth = _method(prog, args.method)
    if args.inputs:
        data = np.load(args.inputs, allow_pickle=False)
        inputs = [data[s.name] for s in meth.record.inputs] if hasattr(data, "files") else [data]
    else:
        inputs = _random_inputs(meth, args.seed)
    with aotrt.load(prog, device=args.device) as m:
        outs = m.method(name).run(*inputs)
        arrays = {s.name: o.numpy() for s, o in zip(meth.record.outputs, outs)}
    for name, a in arrays.items():
        stats = "" if a.size == 0 else (f" min {a.min().astype(np.float64):.4g} max "
                                        f"{a.max().astype(np.float64):.4g} mean "
                                        f"{a.astype(np.float64).mean():.4g}")
        print(f"{name}: {a.dtype}{list(a.shape)}{stats}")
    if args.save:
        np.savez(args.save, **arrays)
        print(f"saved outputs to {args.save}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Time load and run of a program."""
    import aotrt

    prog = aotrt.Program.load(args.program)
    name, meth = _method(prog, args.method)
    inputs = _random_inputs(meth, args.seed)
    t0 = time.perf_counter()
    with aotrt.load(prog, device=args.device) as m:
        load_s = time.perf_counter() - t0
        times = time_calls(lambda: synced_run(m.method(name), inputs), args.runs, args.warmup)
        dev = m.device
    times.sort()
    print(f"device:  {dev.name}")
    print(f"load:    {load_s:.3f} s")
    print(f"latency: median {ms(statistics.median(times))}, min {ms(times[0])}, "
          f"p90 {ms(times[int(0.9 * (len(times) - 1))])} over {len(times)} runs")
    print(f"memory:  peak {dev.memory.peak_raw_bytes / 2**20:.1f} MiB of device memory")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a program's summary: its methods (a dynamic one's symbols, their bounds and the
    inputs they size), state and quantized layers (validates it; runs nothing)."""
    from aotrt.program import Program
    from aotrt.program.quantized import summary_lines

    prog = Program.load(args.program)
    print(prog.summary())
    for line in summary_lines(prog):
        print(line)
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser of `aotrt`."""
    p = argparse.ArgumentParser(prog="aotrt", description="aotrt: export and run PyTorch "
                                "programs from a small Python runtime.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging; on an error, the traceback and any compiler log too")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def device(q: argparse.ArgumentParser) -> None:
        q.add_argument("--device", default=None,
                       help="cpu or cuda (default: cuda if present, else cpu)")

    def method(q: argparse.ArgumentParser) -> None:
        q.add_argument("--method", default=None,
                       help="the method to run (default: the program's only one)")

    def seed(q: argparse.ArgumentParser, what: str) -> None:
        q.add_argument("--seed", type=int, default=0,
                       help=f"seed of the random {what} (default: 0)")

    def timing(q: argparse.ArgumentParser, runs: int, warmup: int) -> None:
        q.add_argument("--runs", type=int, default=runs,
                       help=f"timed runs (default: {runs})")
        q.add_argument("--warmup", type=int, default=warmup,
                       help=f"untimed runs before them (default: {warmup})")

    d = sub.add_parser("demo", help="export a YOLO-style detector (or a language model) and "
                       "run it vs torch eager", description=cmd_demo.__doc__)
    d.add_argument("--model", choices=("auto", "yolov8n", "tiny-yolo") + LLM_DEMOS,
                   default="auto", help="auto: ultralytics YOLOv8n when installed, else the "
                   "built-in model; gpt2, llama-200m, llama-1b: text generation (random "
                   "weights) against Hugging Face generate")
    d.add_argument("--max-new-tokens", type=int, default=32,
                   help="new tokens of a language-model demo (default: 32)")
    d.add_argument("--size", type=int, default=320,
                   help="input height and width in pixels (default: 320)")
    timing(d, 10, 3)
    device(d)
    seed(d, "input image and weights")
    d.set_defaults(fn=cmd_demo)

    g = sub.add_parser("generate", help="generate tokens from a language model",
                       description=cmd_generate.__doc__)
    g.add_argument("model", help="a .aotp file made by aotrt.llm.export, a shape name "
                   f"({', '.join(LLM_DEMOS)}), or a transformers config directory")
    g.add_argument("--prompt", help="prompt token ids, like '1 2 3' (default: random ids)")
    g.add_argument("--prompt-len", type=int, default=16,
                   help="length of the random prompt (default: 16)")
    g.add_argument("--max-new-tokens", type=int, default=32, help="(default: 32)")
    g.add_argument("--max-seq-len", type=int, default=256,
                   help="KV cache slots of an export (default: 256)")
    g.add_argument("--prefill-len", type=int, default=128,
                   help="tokens a prefill call takes, in an export (default: 128)")
    g.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="dtype of an export (default: float32)")
    g.add_argument("--save", help="write the exported program to this .aotp file")
    g.add_argument("--sample", action="store_true",
                   help="draw tokens instead of greedy decoding (an export gets the sample "
                   "method; a .aotp file needs one)")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature (default: 1.0)")
    g.add_argument("--top-k", type=int, default=0,
                   help="sample from the k likeliest tokens (default: 0, all)")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="sample from the smallest set of this probability (default: 1.0)")
    device(g)
    seed(g, "weights, prompt and sampling")
    g.set_defaults(fn=cmd_generate)

    e = sub.add_parser("export", help="export a model to a .aotp program file",
                       description=cmd_export.__doc__)
    e.add_argument("model", help="yolov8n, tiny-yolo, package.module:factory (a module, its "
                   "class, or a function returning one), or a .pt2 file written by "
                   "torch.export.save")
    e.add_argument("-o", "--output", required=True, help="the .aotp file to write")
    e.add_argument("--shape", action="append", help="an input shape like 1,3,320,320 "
                   "(repeat for several inputs; default: 1,3,SIZE,SIZE; not for .pt2)")
    e.add_argument("--size", type=int, default=320,
                   help="height and width of the default input shape (default: 320)")
    e.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="dtype of the weights and inputs (default: float32; not for .pt2)")
    seed(e, "example inputs")
    e.add_argument("--layout", choices=("auto", "channels_last", "contiguous"), default="auto",
                   help="activation layout: channels_last (NHWC convolutions), contiguous, or "
                        "auto (channels-last for conv nets when the default device prefers "
                        "it; a .pt2 keeps its own)")
    e.set_defaults(fn=cmd_export)

    r = sub.add_parser("run", help="run a program on .npz/.npy or random inputs",
                       description=cmd_run.__doc__)
    r.add_argument("program", help="the .aotp program file")
    r.add_argument("--inputs", help=".npz keyed by input name, or one .npy "
                   "(default: random inputs)")
    r.add_argument("--save", help="write the outputs to this .npz, keyed by output name")
    method(r)
    device(r)
    seed(r, "inputs")
    r.set_defaults(fn=cmd_run)

    b = sub.add_parser("bench", help="time loading and running a program",
                       description=cmd_bench.__doc__)
    b.add_argument("program", help="the .aotp program file")
    timing(b, 50, 5)
    method(b)
    device(b)
    seed(b, "inputs")
    b.set_defaults(fn=cmd_bench)

    i = sub.add_parser("inspect", help="print a program's summary",
                       description=cmd_inspect.__doc__)
    i.add_argument("program", help="the .aotp program file")
    i.set_defaults(fn=cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `aotrt` / `python -m aotrt`; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    for key in ("runs", "size"):
        if getattr(args, key, 1) < 1:
            print(f"aotrt: error: --{key} must be at least 1", file=sys.stderr)
            return 2
    try:
        with progress.shown_on(sys.stderr):
            return args.fn(args)
    except KeyboardInterrupt:
        print(f"aotrt {args.command}: interrupted", file=sys.stderr)
        return 130
    except ImportError as e:
        # Only torch missing is the install's fault; another module is named as it is.
        hint = " (install the 'export' extra for torch)" if e.name == "torch" else ""
        _report(args, f"{type(e).__name__}: {e}{hint}", 1)
        return 1
    except Exception as e:  # noqa: BLE001 - the CLI's contract: one line, never a traceback
        code = _exit_code(e)
        _report(args, _one_line(e), code)
        return code


# A bad program file or bad arguments (inputs, paths): exit 2. A run that failed: exit 1.
_BAD_INPUT = (ProgramError, InvalidArgument, Unsupported, OSError, KeyError, ValueError)


def _exit_code(e: BaseException) -> int:
    return 2 if isinstance(e, _BAD_INPUT) else 1


def _one_line(e: BaseException) -> str:
    """The exception's name and the first line of its message; a compiler log stays out."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a message that cannot be printed is still an error
        text = ""
    lines = text.strip().splitlines()
    first = lines[0] if lines else "(no message)"
    if len(first) > 500:
        first = first[:497] + "..."
    kind = type(e).__name__
    if not isinstance(e, AotrtError) and not isinstance(e, (OSError, KeyError, ValueError)):
        kind = f"internal error: {kind}"
    more = ""
    if isinstance(e, CompileError) and e.log:
        more = " (the compiler's log: run with --verbose)"
    elif len(lines) > 1:
        more = " (more: run with --verbose)"
    return f"{kind}: {first}{more}"


def _report(args: argparse.Namespace, line: str, code: int) -> None:
    """Print the one error line; under --verbose the full message and traceback first."""
    if args.verbose:
        traceback.print_exc(file=sys.stderr)
    print(f"aotrt {args.command}: error: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
