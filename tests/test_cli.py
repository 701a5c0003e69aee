"""aotrt/cli.py and aotrt/__main__.py: every command, on hand-built and exported programs."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aotrt.cli import main
from tests.runtime.test_delegate import seed_program, seed_reference
from tests.support import rand, rel_err


@pytest.fixture
def seed_file(tmp_path: Path) -> Path:
    path = tmp_path / "seed.aotp"
    seed_program().save(path)
    return path


def test_inspect_prints_the_summary(seed_file: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(seed_file)]) == 0
    out = capsys.readouterr().out
    assert "input 0 x: float32[12, 7]" in out
    assert "output 3 nested: float32[8, 6]" in out
    assert "library addmm: 1" in out and "library mm: 1" in out


def _dynamic_state_program() -> Any:
    """push: o[S, 4] = x[S, 4] * 2 (S in [1, 8]) and count += 1; peek: the count. The two
    methods share the count."""
    from aotrt.exporter.builder import ProgramBuilder
    from aotrt.exporter.methods import merge
    from aotrt.kernels import ir
    from aotrt.kernels.ir import Arg, Const, Idx, Load, Op, Store

    b = ProgramBuilder("push")
    x = b.input("x", "float32", [8, 4])
    count = b.state("count", np.zeros(1, np.int64))
    o = b.output("o", "float32", [8, 4])
    at = Op("add", (Op("mul", (Idx(0), Const(4, "int64")), "int64"), Idx(1)), "int64")
    b.kernel(ir.Kernel("double", (8, 4), (), (Arg("float32", "r"), Arg("float32", "w")),
                       (Store(1, at, Op("mul", (Load(0, at, "float32"),
                                                Const(2.0, "float32")), "float32")),)), [x, o])
    b.kernel(ir.Kernel("tick", (1,), (), (Arg("int64", "rw"),),
                       (Store(0, Idx(0), Op("add", (Load(0, Idx(0), "int64"),
                                                    Const(1, "int64")), "int64")),)), [count])
    push = b.build()
    push.version = 2
    push.symbols = [{"name": "S", "min": 1, "max": 8}]
    push.symbolic = [{"at": ["inputs", 0, "shape", 0], "expr": [[1, "S"]]},
                     {"at": ["outputs", 0, "shape", 0], "expr": [[1, "S"]]},
                     {"at": ["tensors", x, "sizes", 0], "expr": [[1, "S"]]},
                     {"at": ["tensors", o, "sizes", 0], "expr": [[1, "S"]]},
                     {"at": ["kernels", "double", "shape", 0], "expr": [[1, "S"]]}]
    b = ProgramBuilder("peek")
    count = b.state("count", np.zeros(1, np.int64))
    b.copy(b.output("n", "int64", [1]), count)
    return merge({"push": push, "peek": b.build()}, share_state=True)


def test_inspect_shows_symbols_and_shared_state(tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "dyn.aotp"
    _dynamic_state_program().save(path)
    assert main(["inspect", str(path)]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    for want in ("state 0 count: int64[1], zeros, shared by push, peek",
                 "symbol S: [1, 8], sizes input 0 x dim 0",
                 "input 0 x: float32[S, 4] strides [4, 1]",
                 "output 0 o: float32[S, 4] strides [4, 1]",
                 "output 0 n: int64[1] strides [1]"):
        assert want in lines, (want, lines)
    assert not any(ln.startswith("quantized") for ln in lines)


def test_inspect_tabulates_quantized_layers(tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    from tests.fuzz.seeds import stored_seed

    path = tmp_path / "q.aotp"
    stored_seed("exp_quantized").save(path)     # int4/int8 embeddings and linears
    assert main(["inspect", str(path)]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    rows = lines[lines.index("quantized layers: 4") + 1:]
    assert [r.split() for r in rows[:5]] == [
        ["layers", "op", "scheme", "scales", "weights", "[N,", "K]"],
        ["1", "embedding", "int4", "g32", "float32", "[16,", "64]"],
        ["1", "embedding", "int8", "per", "channel", "float32", "[8,", "64]"],
        ["1", "linear_wq", "int4", "g32", "float32", "[32,", "64]"],
        ["1", "linear_wq", "int8", "per", "channel", "bfloat16", "[8,", "32]"]]
    # packed bytes: 512 + 2 * 128 (token table, scales, zeros), 512 + 32 (position table,
    # scales), 1024 + 2 * 256, 256 + 16 (bfloat16 scales): 3120; in bfloat16 2 * (16 * 64
    # + 8 * 64 + 32 * 64 + 8 * 32) = 7680
    assert rows[5] == "packed: 3.0 KiB with scales and zeros, 7.5 KiB as bfloat16 weights " \
                      "(0.41x)"
    assert rows[6].startswith("constants: 3.2 KiB, 7.7 KiB with these weights in bfloat16")


def test_inspect_counts_repeated_layers_once_a_row(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    from aotrt.exporter.builder import ProgramBuilder

    b = ProgramBuilder("stack")
    h = b.input("x", "float32", [2, 64])
    rng = np.random.default_rng(0)
    for i in range(3):
        q = rng.integers(0, 256, (64, 32), dtype=np.uint8)
        s, z = np.ones((64, 2), np.float32), np.full((64, 2), 8.0, np.float32)
        out = b.output(f"o{i}", "float32", [2, 64])
        b.library("linear_wq", [out], [h, b.constant(f"l{i}.qweight", q),
                                       b.constant(f"l{i}.scales", s),
                                       b.constant(f"l{i}.zeros", z), None],
                  {"bits": 4, "group_size": 32})
    path = tmp_path / "stack.aotp"
    b.build().save(path)
    assert main(["inspect", str(path)]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    i = lines.index("quantized layers: 3")
    assert lines[i + 2].split() == ["3", "linear_wq", "int4", "g32", "float32", "[64,", "64]"]
    # 3 x (2048 + 512 + 512) packed against 3 x 64 x 64 x 2
    assert lines[i + 3] == "packed: 9.0 KiB with scales and zeros, 24.0 KiB as bfloat16 " \
                           "weights (0.38x)"


def test_run_with_inputs_saves_outputs(seed_file: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    x = rand([12, 7], seed=3)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["run", str(seed_file), "--inputs", str(tmp_path / "in.npz"),
                 "--save", str(tmp_path / "out.npz")]) == 0
    out = capsys.readouterr().out
    assert "y: float32[12, 5]" in out and "saved outputs" in out
    saved = np.load(tmp_path / "out.npz")
    ref = seed_reference(seed_program(), x)
    for name, r in zip(("y", "z", "cat", "nested"), ref):
        assert rel_err(saved[name], r) < 1e-4


def test_run_on_random_inputs(seed_file: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["run", str(seed_file), "--device", "cpu"]) == 0
    assert "cat: float32[12, 16] min" in capsys.readouterr().out


def test_bench_reports_load_and_latency(seed_file: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", str(seed_file), "--runs", "3", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "load:" in out and "latency: median" in out and "over 3 runs" in out


def test_bad_file_is_an_error_not_a_traceback(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.aotp"
    bad.write_bytes(b"\x01\x02")
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "aotrt inspect: error: ProgramError:" in err and "truncated" in err
    assert main(["run", str(tmp_path / "missing.aotp")]) == 2


def test_bad_arguments(seed_file: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert main(["bench", str(seed_file), "--runs", "0"]) == 2
    assert "--runs must be at least 1" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli(seed_file: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "aotrt", "inspect", str(seed_file)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "instructions:" in proc.stdout


@pytest.mark.slow
def test_demo_exports_runs_and_matches_eager(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    code = main(["demo", "--model", "tiny-yolo", "--size", "64", "--runs", "2",
                 "--warmup", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "model:    TinyYolo" in out and "load:" in out and "latency:  median" in out
    rel = float(out.split("max relative ")[1].split()[0])
    assert rel < 1e-4


@pytest.mark.slow
def test_demo_fails_on_an_all_nan_output(capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's verdict can fail: aotrt's outputs replaced by NaNs give a NaN error
    (once reported as 0.0, Python's max dropping the NaN) and exit code 1."""
    torch = pytest.importorskip("torch")
    from aotrt import demo

    def nan_run(m: Any, inputs: Any) -> list[Any]:
        return [torch.full_like(torch.from_numpy(np.asarray(o.numpy())), float("nan"))
                for o in real_run(m, inputs)]

    real_run = demo.synced_run
    monkeypatch.setattr(demo, "synced_run", nan_run)
    code = main(["demo", "--model", "tiny-yolo", "--size", "64", "--runs", "1",
                 "--warmup", "0", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "max relative nan" in out and "FAIL: relative error nan" in out


@pytest.mark.slow
def test_export_then_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "tiny.aotp"
    assert main(["export", "tiny-yolo", "--size", "64", "-o", str(path)]) == 0
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "exported TinyYolo" in out and "input 0" in out


@pytest.mark.slow
def test_export_layout_option(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    import aotrt

    nhwc = {}
    for layout in ("channels_last", "contiguous"):
        path = tmp_path / f"tiny-{layout}.aotp"
        assert main(["export", "tiny-yolo", "--size", "64", "--layout", layout,
                     "-o", str(path)]) == 0
        prog = aotrt.Program.load(path)
        convs = [i for i in prog.instructions if i.get("fn") == "convolution"]
        nhwc[layout] = sum(prog.tensors[i["outs"][0]]["strides"][1] == 1 for i in convs)
        assert convs
    assert nhwc["channels_last"] > 0 and nhwc["contiguous"] == 0
    with pytest.raises(SystemExit) as info:         # argparse refuses an unknown layout
        main(["export", "tiny-yolo", "--layout", "nhwc", "-o", str(tmp_path / "x")])
    assert info.value.code == 2


# -- the error contract: one line naming the problem, exit 2 (bad file or arguments) or 1
# (a failed run); the traceback and a compiler's log only under --verbose (issue 7, item 11)


def _one_error_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"aotrt {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write(path: Path, header: Any, body: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
    return path


def _hostile_files(seed_file: Path, tmp: Path) -> dict[str, Path]:
    """Hand-made broken files: each byte layer and each JSON layer of a program."""
    data = seed_file.read_bytes()
    header, body = _header(seed_file)
    prog = json.loads(header["__metadata__"]["aotrt.program"])
    files: dict[str, Path] = {}

    def add(name: str, content: bytes) -> None:
        files[name] = tmp / f"{name}.aotp"
        files[name].write_bytes(content)

    add("empty", b"")
    for frac in (0.001, 0.3, 0.5, 0.9, 0.999):
        add(f"truncated at {frac}", data[:int(len(data) * frac)])
    add("huge header length", struct.pack("<Q", 1 << 62) + data[8:])
    add("header length past the end", struct.pack("<Q", len(data)) + data[8:])
    add("not json", struct.pack("<Q", 8) + b"{not js}")
    add("not utf-8", struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc")
    add("a zip file", b"PK\x03\x04" + bytes(200))
    add("a numpy file", b"\x93NUMPY\x01\x00" + bytes(200))
    files["header a list"] = _write(tmp / "list.aotp", [1, 2])
    files["no program"] = _write(tmp / "noprog.aotp", {"__metadata__": {}})
    files["program not json"] = _write(tmp / "pnj.aotp",
                                       {"__metadata__": {"aotrt.program": "{"}}, body)
    h2 = dict(header)
    h2["w1"] = dict(h2["w1"], dtype=["F32"])
    files["dtype a list"] = _write(tmp / "dtlist.aotp", h2, body)
    h3 = dict(header)
    h3["w1"] = dict(h3["w1"], data_offsets=[0, 1 << 62])
    files["offsets past the end"] = _write(tmp / "offs.aotp", h3, body)
    for key in list(prog)[:12]:
        for bad in ([], {}, "x", -1, 1e308, None, [[[]]]):
            mutant = dict(prog, **{key: bad})
            h = dict(header, __metadata__={"aotrt.program": json.dumps(mutant)})
            name = f"{key} = {json.dumps(bad)}"
            files[name] = _write(tmp / f"m{len(files)}.aotp", h, body)
    return files


def test_hostile_files_give_one_line_and_exit_2(seed_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "a directory.aotp").mkdir()
    files = _hostile_files(seed_file, tmp_path)
    files["a directory"] = tmp_path / "a directory.aotp"
    files["missing"] = tmp_path / "missing.aotp"
    refused = 0
    for name, path in files.items():
        for command in ("inspect", "run"):
            code = main([command, str(path), "--device", "cpu"] if command == "run"
                        else [command, str(path)])
            captured = capsys.readouterr()
            if code == 0:
                continue            # a mutation the program format tolerates
            refused += 1
            line = _one_error_line(captured.err, command)
            assert code in (1, 2), (name, command, line)
            if code == 1:
                # Only a run that failed is 1: its file loaded.
                assert command == "run" and "internal error" not in line, (name, line)
    assert refused >= 2 * 16


def test_bad_inputs_and_outputs_are_exit_2(seed_file: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "junk.npy").write_bytes(b"x")
    np.savez(tmp_path / "f64.npz", x=np.zeros((12, 7)))
    np.savez(tmp_path / "other.npz", y=np.zeros((12, 7), np.float32))
    np.save(tmp_path / "obj.npy", np.array([object()]), allow_pickle=True)
    for extra in (["--inputs", str(tmp_path / "junk.npy")],
                  ["--inputs", str(tmp_path / "f64.npz")],
                  ["--inputs", str(tmp_path / "other.npz")],
                  ["--inputs", str(tmp_path / "obj.npy")],
                  ["--inputs", str(tmp_path / "missing.npz")],
                  ["--save", str(tmp_path / "no" / "such" / "dir.npz")],
                  ["--device", "tpu"]):
        assert main(["run", str(seed_file), *extra]) == 2, extra
        _one_error_line(capsys.readouterr().err, "run")


def test_compile_error_is_one_line_and_its_log_is_verbose(seed_file: Path, tmp_path: Path) -> None:
    """A kernel that does not compile (CC prints a log and fails): exit 1, one line naming it;
    the log and the traceback only with --verbose."""
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'kernel.c:1: error: the first line of a long log' >&2\n"
                  "echo 'kernel.c:2: note: the second line' >&2\nexit 1\n")
    cc.chmod(0o755)
    env = dict(os.environ, CC=str(cc), AOTRT_CACHE_DIR=str(tmp_path / "cache"))
    for verbose in (False, True):
        cmd = [sys.executable, "-m", "aotrt", *(["-v"] if verbose else []), "run",
               str(seed_file), "--device", "cpu"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("aotrt run: error: CompileError: ") and "failed" in last
        assert "the first line of a long log" not in last
        if verbose:
            assert "Traceback" in proc.stderr and "the second line" in proc.stderr
        else:
            assert _one_error_line(proc.stderr, "run") == last
            assert "run with --verbose" in last


@pytest.mark.parametrize("exc,code,text", [
    (TypeError("an unforeseen bug"), 1, "internal error: TypeError: an unforeseen bug"),
    (RecursionError("deep"), 1, "internal error: RecursionError: deep"),
    (MemoryError(), 1, "internal error: MemoryError: (no message)"),
    (IndexError("list index out of range"), 1, "internal error: IndexError"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), 2, "UnicodeDecodeError"),
])
def test_unforeseen_exceptions_are_one_line(seed_file: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch, exc, code,
                                            text) -> None:
    from aotrt.program import Program

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(Program, "load", boom)
    for command in ("inspect", "run", "bench"):
        assert main([command, str(seed_file)]) == code
        assert text in _one_error_line(capsys.readouterr().err, command)
    assert main(["-v", "inspect", str(seed_file)]) == code
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("aotrt inspect: error")


def test_keyboard_interrupt_is_one_line(seed_file: Path, capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from aotrt.program import Program

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(Program, "load", interrupted)
    assert main(["run", str(seed_file)]) == 130
    assert capsys.readouterr().err.strip() == "aotrt run: interrupted"


# -- every option says what it does (issue 10, item 4)


def test_every_option_has_help() -> None:
    import argparse

    from aotrt.cli import parser

    p = parser()
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)][0]
    assert set(subs.choices) == {"demo", "export", "generate", "run", "bench", "inspect"}
    helped = {c.dest: c.help for c in subs._choices_actions}
    for name, sub in [("aotrt", p), *subs.choices.items()]:
        if name != "aotrt":
            assert helped.get(name), name
            assert sub.description, name
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and len(action.help) > 8, (name, action.dest)


# A process each (2 s on 2 cores): the CI slice asks one exporter and one runtime command;
# test_every_option_has_help reads every command's help in process.
@pytest.mark.parametrize("command", [pytest.param("demo", marks=pytest.mark.slow), "export",
                                     "run", pytest.param("bench", marks=pytest.mark.slow),
                                     pytest.param("inspect", marks=pytest.mark.slow)])
def test_help_of_each_command(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "aotrt", command, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--help" in proc.stdout and proc.stderr == ""
    # The runtime's commands never import torch, not even for --help.
    assert "Traceback" not in proc.stdout


# -- mistakes in `aotrt export` are one line and exit 2 (issue 10, item 4)


def _aotrt(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotrt", *argv], capture_output=True,
                          text=True, timeout=300, env=env)


# Two processes importing torchvision, 17 s on 2 cores: the CI slice has the one-line export
# mistakes through test_missing_pt2_is_one_line and test_export_mistakes_are_exit_2.
@pytest.mark.slow
def test_unknown_factory_is_one_line(tmp_path: Path) -> None:
    """The issue's example: `aotrt export torchvision.models:nonexist`."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    proc = _aotrt("export", "torchvision.models:nonexist", "-o", str(tmp_path / "x.aotp"))
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc.stderr, "export")
    assert "module 'torchvision.models' has no 'nonexist'" in line
    assert not (tmp_path / "x.aotp").exists()
    proc = _aotrt("-v", "export", "torchvision.models:nonexist", "-o", str(tmp_path / "x.aotp"))
    assert proc.returncode == 2 and "Traceback" in proc.stderr      # --verbose shows it


def test_missing_pt2_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = _aotrt("export", str(tmp_path / "missing.pt2"), "-o", str(tmp_path / "x.aotp"))
    assert proc.returncode == 2, proc.stderr
    assert "no such file" in _one_error_line(proc.stderr, "export")


def small_factory() -> Any:
    """A factory for the tests below: conv, relu, pooled linear head."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(4, 3))


@pytest.mark.parametrize("argv,text", [
    (["no.such.module:f"], "no module named 'no.such.module'"),
    (["tests.test_cli:small_factori"], "has no 'small_factori' (did you mean 'small_factory'"),
    (["tests.test_cli:json"], "is a module, not a torch.nn.Module"),
    (["tests.test_cli:small_factory", "--shape", "1,x"], "--shape: expected sizes"),
    (["tests.test_cli:small_factory", "--shape", "1,5"], "--shape: small_factory does not run"),
    (["nonsense"], "expected 'yolov8n', 'tiny-yolo', 'module:factory' or a .pt2 file"),
])
def test_export_mistakes_are_exit_2(argv: list[str], text: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    assert main(["export", *argv, "-o", str(tmp_path / "x.aotp")]) == 2
    assert text in _one_error_line(capsys.readouterr().err, "export")


def test_export_of_a_pt2_file_then_run_matches_eager(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    model = small_factory().eval()
    ep = torch.export.export(model, (torch.randn(2, 3, 9, 9),))
    torch.export.save(ep, tmp_path / "small.pt2")
    out = tmp_path / "small.aotp"
    assert main(["export", str(tmp_path / "small.pt2"), "-o", str(out)]) == 0
    assert f"exported small to {out}" in capsys.readouterr().out
    x = rand([2, 3, 9, 9], seed=11)
    np.savez(tmp_path / "in.npz", **{"input": x})
    assert main(["run", str(out), "--device", "cpu", "--inputs", str(tmp_path / "in.npz"),
                 "--save", str(tmp_path / "out.npz")]) == 0
    got = np.load(tmp_path / "out.npz")
    with torch.no_grad():
        ref = model.double()(torch.from_numpy(x).double()).numpy()
    assert rel_err(got[got.files[0]], ref) < 1e-4
    # What a .pt2 fixes cannot be asked for.
    for extra in (["--shape", "1,3,9,9"], ["--dtype", "float16"], ["--layout", "channels_last"]):
        assert main(["export", str(tmp_path / "small.pt2"), "-o", str(out), *extra]) == 2
        _one_error_line(capsys.readouterr().err, "export")


def test_export_of_a_factory_matches_eager(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import aotrt
    import torch

    out = tmp_path / "f.aotp"
    proc = _aotrt("export", "tests.test_cli:small_factory", "--shape", "1,3,7,7", "-o",
                  str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""                # not a terminal: no progress
    x = rand([1, 3, 7, 7], seed=12)
    with aotrt.load(out, device="cpu") as m, torch.no_grad():
        ref = small_factory().double()(torch.from_numpy(x).double()).numpy()
        assert rel_err(m.run(x)[0].numpy(), ref) < 1e-4


# -- progress: on a terminal only (issue 10, item 4)


def _on_a_terminal(argv: list[str], env: dict) -> tuple[int, str, str]:
    """Run `python -m aotrt argv` with stderr a pseudo-terminal: (rc, stdout, stderr)."""
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "aotrt", *argv], stdout=subprocess.PIPE,
                                stderr=slave, env=env)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:                     # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out.decode(), b"".join(chunks).decode()


def test_first_load_compile_shows_progress_on_a_terminal_only(seed_file: Path,
                                                              tmp_path: Path) -> None:
    env = dict(os.environ, AOTRT_CACHE_DIR=str(tmp_path / "cache"))
    rc, out, err = _on_a_terminal(["run", str(seed_file), "--device", "cpu"], env)
    assert rc == 0 and "y: float32[12, 5]" in out
    assert "aotrt: compiling " in err and " kernel(s) with " in err
    assert "\r\x1b[K" in err and err.rstrip().endswith(" s")
    # A second load finds the kernels cached: nothing to show.
    rc, _, err = _on_a_terminal(["run", str(seed_file), "--device", "cpu"], env)
    assert rc == 0 and "compiling" not in err
    # Not a terminal: quiet, even when it compiles.
    env["AOTRT_CACHE_DIR"] = str(tmp_path / "cache2")
    proc = _aotrt("run", str(seed_file), "--device", "cpu", env=env)
    assert proc.returncode == 0 and proc.stderr == ""
    assert list((tmp_path / "cache2").rglob("*.so"))       # it did compile


@pytest.mark.slow   # 11 s on 2 cores; the next test shows export's progress in the CI slice
def test_export_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = dict(os.environ, AOTRT_CACHE_DIR=str(tmp_path / "cache"))
    rc, out, err = _on_a_terminal(["export", "tests.test_cli:small_factory", "--shape",
                                   "1,3,7,7", "-o", str(tmp_path / "f.aotp")], env)
    assert rc == 0 and "exported small_factory" in out
    assert "aotrt: capturing Sequential ..." in err and "aotrt: lowering Sequential: " in err


def test_an_error_after_progress_is_still_on_its_own_line(tmp_path: Path) -> None:
    """A step that fails ends its status line before the one error line."""
    pytest.importorskip("torch")
    env = dict(os.environ, AOTRT_CACHE_DIR=str(tmp_path / "cache"))
    (tmp_path / "bad_model.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x[x > 0].sum() if x.sum() > 0 else x\n")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", ""),
                                         str(Path(__file__).parents[1])])
    rc, _, err = _on_a_terminal(["export", "bad_model:M", "--shape", "2,3",
                                 "-o", str(tmp_path / "m.aotp")], env)
    assert rc == 2, err
    # The terminal writes "\r\n" for a newline; a status line is "\r\x1b[K" + text.
    lines = [ln.split("\r\x1b[K")[-1] for ln in err.replace("\r\n", "\n").strip().split("\n")]
    assert lines[-2] == "aotrt: capturing M: failed"
    assert lines[-1].startswith("aotrt export: error: Unsupported: torch.export could not")
