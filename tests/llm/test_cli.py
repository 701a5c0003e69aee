"""`aotrt generate` and `aotrt demo --model gpt2-tiny`: tokens streamed, a timing line, and
the demo's check against Hugging Face."""

from __future__ import annotations

from pathlib import Path

import pytest

from aotrt.cli import main


def test_generate_exports_saves_and_runs_a_saved_file(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "tiny.aotp"
    assert main(["generate", "gpt2-tiny", "--save", str(path), "--max-new-tokens", "6",
                 "--max-seq-len", "64", "--prefill-len", "8", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "export:" in out and "tokens/s (6 new tokens)" in out
    assert main(["generate", str(path), "--prompt", "5 6 7", "--max-new-tokens", "4",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    tokens = next(line for line in out.splitlines() if line.startswith("tokens:"))
    assert len(tokens.split()) == 1 + 4
    assert "prompt:   3 tokens" in out and "time to first token" in out
    assert main(["generate", str(path), "--prompt", "5 99999"]) == 2
    assert "--prompt: expected ids in [0, 512)" in capsys.readouterr().err


def test_generate_refuses_an_unknown_model(capsys: pytest.CaptureFixture) -> None:
    assert main(["generate", "no-such-model"]) == 2
    assert "neither a name in" in capsys.readouterr().err


def test_demo_gpt2_tiny_matches_hugging_face(capsys: pytest.CaptureFixture) -> None:
    assert main(["demo", "--model", "gpt2-tiny", "--device", "cpu",
                 "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "tokens equal Hugging Face generate (greedy): yes" in out
    assert "HF eager: time to first token" in out


@pytest.mark.slow   # 20 s on 2 cores; the sampling itself is test_sampling.py's (CI slice)
def test_generate_samples_with_a_seed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--sample exports the sample method; top-k 1 draws the greedy tokens, a seed repeats."""
    path = tmp_path / "tiny.aotp"
    args = ["--max-new-tokens", "6", "--prompt", "5 6 7", "--device", "cpu"]

    def tokens(argv: list[str]) -> str:
        assert main(["generate", *argv, *args]) == 0
        return next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("tokens:"))

    drawn = tokens(["gpt2-tiny", "--sample", "--save", str(path), "--max-seq-len", "64",
                    "--prefill-len", "8", "--top-p", "0.9", "--temperature", "0.8"])
    saved = str(path)
    assert tokens([saved, "--sample", "--top-p", "0.9", "--temperature", "0.8"]) == drawn
    assert tokens([saved, "--sample", "--top-k", "1", "--seed", "5"]) == tokens([saved])
    assert main(["generate", saved, "--sample", "--temperature", "0"]) == 2
    assert "temperature: expected > 0" in capsys.readouterr().err
    assert main(["generate", saved, "--top-k", "3"]) == 2
    assert "only apply with --sample" in capsys.readouterr().err
