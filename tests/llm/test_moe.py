"""Mixture-of-experts language models (Mixtral, Qwen2-MoE) with transformers' default experts
implementation: llm.export and llm.generate give Hugging Face `generate`'s greedy tokens
(static cache) for a left-padded batch of 2 prompts, 32 new tokens, float32 on cpu."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

import aotrt
from aotrt import llm

transformers = pytest.importorskip("transformers")

VOCAB = 500
NEW = 32
PROMPT = 11

#: 2 layers, hidden 64, 4 experts of which each token takes 2
CONFIGS: dict[str, Callable[[], Any]] = {
    "mixtral": lambda: transformers.MixtralConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
        vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=1, eos_token_id=2),
}


def _build(family: str) -> Any:
    """A random-weight model; initializer_range 0.3 so that greedy tokens vary."""
    config = CONFIGS[family]()
    config.initializer_range = 0.3
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval()


def _prompts() -> tuple[np.ndarray, np.ndarray]:
    """Two left-padded prompts: 7 real tokens, and 11."""
    rng = np.random.default_rng(0)
    ids = np.zeros((2, PROMPT), np.int64)
    mask = np.zeros((2, PROMPT), np.int64)
    ids[0, 4:], mask[0, 4:] = rng.integers(3, VOCAB, 7), 1
    ids[1], mask[1] = rng.integers(3, VOCAB, PROMPT), 1
    return ids, mask


@pytest.mark.models
@pytest.mark.parametrize("family", [
    # About 15 s each on 2 cores; Qwen2-MoE (routed and shared experts) is the CI slice's.
    pytest.param(f, marks=[pytest.mark.slow] if f == "mixtral" else [])
    for f in sorted(CONFIGS)])
def test_moe_tokens_equal_hugging_face(family: str) -> None:
    model = _build(family)
    # The default experts implementation: the grouped products the exporter must decompose.
    assert model.config._experts_implementation == "grouped_mm"
    prog = llm.export(model, max_seq_len=48, max_batch=2, prefill_len=8)
    ids, mask = _prompts()
    with aotrt.load(prog, device="cpu") as m:
        got = llm.generate(m, ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    with torch.no_grad():
        want = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                              max_new_tokens=NEW, do_sample=False,
                              cache_implementation="static", pad_token_id=0,
                              eos_token_id=None).numpy()
    assert len(np.unique(want[:, PROMPT:])) > 8     # varied tokens: equality is no accident
    np.testing.assert_array_equal(got, want)
