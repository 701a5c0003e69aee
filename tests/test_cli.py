"""aotrt/cli.py and aotrt/__main__.py: every command, on hand-built and exported programs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "aotrt inspect: error: ProgramError:" in err and "truncated" in err
    assert main(["run", str(tmp_path / "missing.aotp")]) == 1


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
