"""Language models: export a Hugging Face causal LM as `prefill` and `decode` methods that
share a KV cache, and generate tokens from the loaded program.

    from aotrt import llm
    prog = llm.export(hf_model, max_seq_len=512, max_batch=8)   # imports torch
    with aotrt.load(prog) as m:
        ids = llm.generate(m, input_ids, max_new_tokens=32)     # numpy only

`generate` never imports torch; `export` does, on first call.
"""

from __future__ import annotations

from typing import Any

from aotrt.llm.generate import generate
from aotrt.llm.spec import LlmSpec

__all__ = ["export", "generate", "LlmSpec"]


def export(model: Any, **kwargs: Any) -> Any:
    """aotrt.llm.export_lm.export (see there): the model as prefill and decode methods."""
    from aotrt.llm.export_lm import export as _export

    return _export(model, **kwargs)
