"""Language and speech models: export a Hugging Face causal LM as `prefill` and `decode`
methods that share a KV cache (or Whisper as `encode`, `prefill` and `decode`), and generate
tokens from the loaded program.

    from aotrt import llm
    prog = llm.export(hf_model, max_seq_len=512, max_batch=8)   # imports torch
    with aotrt.load(prog) as m:
        ids = llm.generate(m, input_ids, max_new_tokens=32)     # numpy only
    prog = llm.export_whisper(whisper_model)                    # imports torch
    with aotrt.load(prog) as m:
        ids = llm.transcribe(m, features, 64, prompt_ids, eos)  # numpy only

`generate` and `transcribe` never import torch; the exports do, on first call.
"""

from __future__ import annotations

from typing import Any

from aotrt.llm.generate import generate
from aotrt.llm.spec import LlmSpec
from aotrt.llm.transcribe import transcribe

__all__ = ["export", "export_whisper", "generate", "transcribe", "LlmSpec"]


def export(model: Any, **kwargs: Any) -> Any:
    """aotrt.llm.export_lm.export (see there): the model as prefill and decode methods."""
    from aotrt.llm.export_lm import export as _export

    return _export(model, **kwargs)


def export_whisper(model: Any, **kwargs: Any) -> Any:
    """aotrt.llm.whisper.export_whisper (see there): encode, prefill and decode methods."""
    from aotrt.llm.whisper import export_whisper as _export

    return _export(model, **kwargs)
