"""llm.export: a Hugging Face causal language model as one program of a `prefill` and a
`decode` method that share the KV cache as state (the export side: imports torch).

    prog = llm.export(hf_model, max_seq_len=512, max_batch=8)
    prog.save("gpt2.aotp")

`prefill` takes `prefill_len` tokens a call, `decode` one; both return arg-max token ids
(aotrt/llm/causal.py). With `sampling=True` a third method, `sample`, takes one token a row
and the sampling inputs (a uniform draw a row, temperature, top-k, top-p) and returns the
drawn token ids. The file's provenance records the sizes `generate` needs, and
`generate` checks them against the methods' own inputs (aotrt/llm/generate.py).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch

from aotrt import progress
from aotrt.settings import library_switch
from aotrt.errors import InvalidArgument
from aotrt.llm.causal import CausalStep
from aotrt.llm.spec import LlmSpec
from aotrt.program import Program


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name}: expected a positive int, got {value!r}")
    return value


def export(model: torch.nn.Module, *, max_seq_len: int = 512, max_batch: int = 1,
           prefill_len: int | None = None, dtype: torch.dtype | None = None,
           weights: str | None = None, group_size: int = 128, sampling: bool = False,
           embeddings: str | None = None) -> Program:
    """Export `model` (a transformers causal LM) as methods `prefill` and `decode` over a
    KV cache of `max_batch` rows and `max_seq_len` slots, in `dtype` (default: the model's).

    `prefill_len` (default min(128, max_seq_len)) is how many tokens one prefill call takes;
    `generate` left-pads a prompt to a multiple of it. `weights` "int8" or "int4" quantizes
    every linear layer's weight (the output head too) on a copy of the model
    (aotrt/exporter/quantize.py: int8 per output channel, int4 per group of `group_size`
    along K), with scales in `dtype`. Embeddings stay as they are unless `embeddings`
    ("int8" or "int4") quantizes them too, a row per channel; a head tied to the embedding
    then shares its packed table, stored once. `sampling` adds the method `sample`
    (one token a row, drawn in the graph: aotrt/llm/causal.py), which `generate(...,
    do_sample=True)` needs.
    """
    _positive("max_seq_len", max_seq_len)
    _positive("max_batch", max_batch)
    prefill_len = min(128, max_seq_len) if prefill_len is None else prefill_len
    _positive("prefill_len", prefill_len)
    if prefill_len > max_seq_len:
        raise InvalidArgument(f"prefill_len: {prefill_len} is over max_seq_len {max_seq_len}")
    if not isinstance(sampling, bool):
        raise InvalidArgument(f"sampling: expected a bool, got {sampling!r}")
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise InvalidArgument("model: expected a transformers model (an nn.Module with a "
                              f"config), got {type(model).__name__}")
    dtype = dtype or next(model.parameters()).dtype
    model = model.eval().to(dtype)
    if weights is not None or embeddings is not None:
        from aotrt.exporter.quantize import quantize_embeddings, quantize_linears

        # On a copy: the caller's model keeps its float weights (and its tied head).
        model = copy.deepcopy(model)
        if embeddings is not None:
            # First, so that a tied head shares the table (quantize_linears then skips it).
            with progress.step(f"quantizing embeddings to {embeddings}"):
                quantize_embeddings(model, embeddings, group_size)
        if weights is not None:
            with progress.step(f"quantizing linear layers to {weights}"):
                quantize_linears(model, weights, group_size)
    step = CausalStep(model, max_batch, max_seq_len, dtype).eval()
    i64 = torch.int64

    def args(n: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(max_batch, n, dtype=i64), torch.tensor(0, dtype=i64),
                torch.zeros(max_batch, dtype=i64))

    methods = {"prefill": (step, args(prefill_len)), "decode": (step, args(1))}
    if sampling:
        f32 = torch.float32
        methods["sample"] = (step, args(1) + (
            torch.full((max_batch,), 0.5, dtype=f32), torch.tensor(1.0, dtype=f32),
            torch.tensor(0, dtype=i64), torch.tensor(1.0, dtype=f32)))
    name = type(model).__name__
    what = ", sample 1" if sampling else ""
    with progress.step(f"exporting {name} (prefill {prefill_len}, decode 1{what})"), \
            torch.no_grad(), _grouped_sdpa():
        prog = aotrt_export(methods, name=name, share_state=True)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    vocab = int(config.vocab_size)
    eos_ids = eos if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    # A config's end token outside its vocabulary (a shrunk test config) can never be made.
    spec = LlmSpec(max_seq_len=max_seq_len, max_batch=max_batch, prefill_len=prefill_len,
                   vocab_size=vocab, eos_token_ids=tuple(int(e) for e in eos_ids
                                                         if 0 <= int(e) < vocab),
                   sampling=sampling)
    prog.provenance.update(spec.to_provenance())
    return prog


#: transformers' switch (integrations/sdpa_attention.py) that hands grouped key and value
#: heads to sdpa as they are, with enable_gqa, where it would repeat them for every query head
GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"


@contextlib.contextmanager
def _grouped_sdpa() -> Iterator[None]:
    """Within the block, transformers' sdpa attention passes a grouped-query model's key and
    value heads to sdpa unrepeated (enable_gqa)."""
    # aotrt's attention reads a key head once for its group of query heads; repeated, a
    # Llama of 4 key heads for 12 copied its whole cache twice a layer every step (2 x 786 KB
    # for 256 slots: llama-200m's 128-token prefill 24 copies, its decode step 1.7 ms).
    with library_switch(GQA_SWITCH, "1"):
        yield


def aotrt_export(methods: dict[str, Any], **kwargs: Any) -> Program:
    """aotrt.export of a dict of methods (imported here, so that aotrt.llm loads light)."""
    from aotrt.exporter import export as _export

    return _export(methods, **kwargs)
