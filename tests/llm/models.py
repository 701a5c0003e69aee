"""Small Hugging Face language models with random weights (nothing downloaded), scaled so
that greedy tokens vary from step to step."""

from __future__ import annotations

from typing import Any, Callable

import torch
import transformers

VOCAB = 384


def _llama_rope() -> dict[str, Any]:
    return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


CONFIGS: dict[str, Callable[[], Any]] = {
    "gpt2": lambda: transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=256, bos_token_id=1,
        eos_token_id=2),
    "llama": lambda: transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, rope_scaling=_llama_rope(),
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2),
    "qwen2": lambda: transformers.Qwen2Config(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2),
    "qwen3": lambda: transformers.Qwen3Config(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2),
}


def build(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    """A random-weight causal LM of `family`, eval mode, sdpa attention."""
    config = CONFIGS[family]()
    # Large initial weights: with the default 0.02 a random model repeats one token.
    config.initializer_range = 0.3
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval().to(dtype)
