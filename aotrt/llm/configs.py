"""Named model shapes for the CLI, the demo and the benchmark: transformers configs that are
built with random weights (nothing is downloaded). Imports transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from aotrt.errors import InvalidArgument


def _gpt2() -> Any:
    import transformers

    return transformers.GPT2Config()          # GPT-2 124M


def _llama_1b() -> Any:
    import transformers

    # Llama-3.2-1B's shape (the config.json of meta-llama/Llama-3.2-1B).
    return transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_id=128001,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def _llama_200m() -> Any:
    import transformers

    # A Llama of about 200M parameters (a SmolLM-style shape) for the cpu benchmark.
    return transformers.LlamaConfig(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, vocab_size=49152, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def _gpt2_tiny() -> Any:
    import transformers

    return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512,
                                   bos_token_id=1, eos_token_id=2)


NAMED: dict[str, Callable[[], Any]] = {"gpt2": _gpt2, "gpt2-tiny": _gpt2_tiny,
                                       "llama-1b": _llama_1b, "llama-200m": _llama_200m}


def config(spec: str) -> Any:
    """The transformers config of a name in NAMED, or of a directory holding config.json."""
    if spec in NAMED:
        return NAMED[spec]()
    path = Path(spec)
    if (path / "config.json").is_file():
        import transformers

        return transformers.AutoConfig.from_pretrained(path)
    raise InvalidArgument(f"model: {spec!r} is neither a name in {sorted(NAMED)} nor a "
                          f"directory with a config.json")


def build(spec: str, dtype: str = "float32", seed: int = 0) -> Any:
    """A causal LM of `spec`'s config with random weights, eval mode, sdpa attention."""
    import torch
    import transformers

    cfg = config(spec)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.eval().to(getattr(torch, dtype))
