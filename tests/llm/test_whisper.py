"""Whisper as encode/prefill/decode methods: greedy transcription equals Hugging Face's own
Whisper `generate` (do_sample=False, static cache), token for token, with its suppressed
tokens, an eos that ends one row early, two prompt lengths and a batch smaller than the
exported one; the run side imports no torch; bad arguments are refused."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.llm.transcribe import transcribe
from aotrt.llm.whisper import export_whisper
from tests.conftest import DEVICES
from tests.exporter.harness import rel_err

VOCAB = 200
# Tokens past no-timestamps are timestamps to HF's Whisper generate, whose segment logic
# then decides where the audio continues (a random model emitting them made it loop for
# ever): no-timestamps is the last token. UNUSED is a placeholder eos, always suppressed.
SOT, LANG, TASK, UNUSED, NO_TS = 194, 195, 196, 198, 199
NEW = 24
# 2 x 100 frames: Whisper wants exactly 2 x max_source_positions, so a small
# max_source_positions keeps the encoder (and the test) small.
FRAMES = 200


def _model() -> Any:
    """A random 2+2-layer Whisper; init_std 1.0 so that greedy tokens vary step to step."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    cfg = WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_source_positions=FRAMES // 2, max_target_positions=64,
        decoder_start_token_id=SOT, pad_token_id=UNUSED, bos_token_id=UNUSED,
        eos_token_id=UNUSED,
        suppress_tokens=[], begin_suppress_tokens=[], init_std=1.0)
    return WhisperForConditionalGeneration(cfg).eval()


def _config(eos: int, suppress: list[int], begin: list[int], forced: list[list[int]]) -> Any:
    """A generation config of Whisper's short-form greedy path: the prompt from
    forced_decoder_ids (+ no-timestamps), no language detection (no lang_to_id)."""
    from transformers import GenerationConfig

    return GenerationConfig(decoder_start_token_id=SOT, eos_token_id=eos, pad_token_id=eos,
                            forced_decoder_ids=forced, no_timestamps_token_id=NO_TS,
                            suppress_tokens=suppress, begin_suppress_tokens=begin,
                            do_sample=False)


def _hf(model: Any, x: np.ndarray) -> np.ndarray:
    # One thread: with two on two shared cores, torch's parallel regions wait on a busy
    # core and these tiny steps ran 10-40x slower (0.1 s -> 4 s a generate).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            out = model.generate(torch.tensor(x), max_new_tokens=NEW, do_sample=False,
                                 cache_implementation="static")
    finally:
        torch.set_num_threads(threads)
    return out.numpy()



_CASE: dict[str, Any] = {}


def _case() -> dict[str, Any]:
    """The model, its generation config, two audios, HF's tokens and the program (once).

    Suppressed tokens and eos are picked from HF's own unconstrained output, so that the
    suppression changes tokens and the eos ends row 0 early whatever the random weights."""
    if _CASE:
        return _CASE
    model = _model()
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((2, 80, FRAMES)).astype(np.float32)
    x2 = rng.standard_normal((1, 80, FRAMES)).astype(np.float32)
    forced = [[1, LANG], [2, TASK]]
    model.generation_config = _config(UNUSED, [UNUSED], [], forced)
    free = _hf(model, x1)
    common = int(np.bincount(free.ravel(), minlength=VOCAB).argmax())
    suppress = [UNUSED, common]
    begin = sorted({int(free[0, 0]), int(free[1, 0])} - {common})
    model.generation_config = _config(UNUSED, suppress, begin, forced)
    shaped = _hf(model, x1)
    # eos: a token of row 0 at step 8 or later that it did not emit before
    eos = next(int(t) for i, t in enumerate(shaped[0]) if i >= 8 and t not in shaped[0, :i])
    model.generation_config = _config(eos, suppress, begin, forced)
    ref1 = _hf(model, x1)
    model.generation_config = _config(eos, suppress, begin, [[1, LANG]])
    ref2 = _hf(model, x2)
    model.generation_config = _config(eos, suppress, begin, forced)
    prog = export_whisper(model, max_batch=3, max_new_tokens=NEW + 2)
    _CASE.update(model=model, x1=x1, x2=x2, eos=eos, suppress=suppress, begin=begin,
                 free=free, ref1=ref1, ref2=ref2, prog=prog)
    return _CASE


@pytest.mark.parametrize("device", DEVICES)
def test_transcription_equals_hugging_face(device: str) -> None:
    c = _case()
    prog = c["prog"]
    assert sorted(prog.methods) == ["decode", "encode", "prefill"]
    assert sorted(s.name for s in prog.tables.state) == sorted(
        f"kv.{k}{i}" for k in ("k", "v", "ck", "cv") for i in range(2))
    ref1, ref2, eos = c["ref1"], c["ref2"], c["eos"]
    # The case is what it claims: suppression changed HF's tokens, eos ended row 0 early
    # and padded it, row 1 went on.
    assert not np.array_equal(c["free"][:, :8], ref1[:, :8])
    stop = int(np.argmax(ref1[0] == eos))
    assert 8 <= stop < ref1.shape[1] - 1 and (ref1[0, stop:] == eos).all()
    assert (ref1[1, :-1] != eos).all() and len(set(ref1[1].tolist())) > 8
    seen: list[np.ndarray] = []
    with aotrt.load(prog, device=device, check_hazards=True) as m:
        got1 = transcribe(m, c["x1"], NEW, [SOT, LANG, TASK, NO_TS], eos,
                          on_token=seen.append)
        # A second audio over the same state, with a shorter prompt (padded in prefill).
        got2 = transcribe(m, c["x2"], NEW, [SOT, LANG, NO_TS], eos)
        # encode leaves each decoder layer's cross-attention keys in state
        with torch.no_grad():
            h = c["model"].model.encoder(torch.tensor(c["x2"])).last_hidden_state
            ck = c["model"].model.decoder.layers[1].encoder_attn.k_proj(h)
        want = ck.view(1, -1, 4, 16).transpose(1, 2).numpy()
        got_ck = np.asarray(m.state["kv.ck1"])[:1]
    assert got1.dtype == np.int64
    np.testing.assert_array_equal(got1, ref1)
    np.testing.assert_array_equal(got2, ref2)
    np.testing.assert_array_equal(np.stack(seen, 1), ref1)
    assert rel_err(got_ck, want) < 1e-5, rel_err(got_ck, want)


def test_run_side_imports_no_torch() -> None:
    code = ("import sys, aotrt.llm.transcribe; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_arguments_are_refused() -> None:
    c = _case()
    x = c["x1"]
    with aotrt.load(c["prog"], device="cpu") as m:
        prompt = [SOT, LANG, TASK, NO_TS]
        with pytest.raises(InvalidArgument, match="features"):
            transcribe(m, x[:, :, :100], NEW, prompt, c["eos"])
        with pytest.raises(InvalidArgument, match="batch 4"):
            transcribe(m, np.concatenate([x, x]), NEW, prompt, c["eos"])
        with pytest.raises(InvalidArgument, match="decoder_prompt_ids"):
            transcribe(m, x, NEW, prompt + [1], c["eos"])
        with pytest.raises(InvalidArgument, match="max_new_tokens"):
            transcribe(m, x, NEW + 3, prompt, c["eos"])
        vocab = c["model"].config.vocab_size
        assert m.program.provenance["whisper.vocab_size"] == str(vocab)
        for bad in (vocab, -1):         # checked before anything runs, as generate does
            with pytest.raises(InvalidArgument, match=r"token ids must lie in \[0, "):
                transcribe(m, x, NEW, [SOT, LANG, bad, NO_TS], c["eos"])
    with pytest.raises(InvalidArgument, match="max_target_positions"):
        export_whisper(c["model"], max_new_tokens=61)
    with pytest.raises(InvalidArgument, match="WhisperForConditionalGeneration"):
        export_whisper(torch.nn.Linear(2, 2))
