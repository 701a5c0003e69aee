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
