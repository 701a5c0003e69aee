"""What `generate` needs to know of a language-model program, read from and checked against
the file (which is untrusted input, like every other field)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from aotrt.errors import ProgramError

KIND = "causal-lm"
_KEYS = ("llm.kind", "llm.max_seq_len", "llm.max_batch", "llm.prefill_len", "llm.vocab_size",
         "llm.eos_token_ids")
# Sizes past these are not a language model's; they bound what generate allocates.
MAX_SEQ_LEN = 1 << 20
MAX_BATCH = 1 << 12
# The in-graph sampling rule a `sample` method implements (aotrt/llm/causal.py
# sample_token): an optional entry, so files exported without sampling read as before.
SAMPLING = "inverse-cdf"


@dataclass(frozen=True)
class LlmSpec:
    """The sizes a causal-LM program was exported for."""

    max_seq_len: int
    max_batch: int
    prefill_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    sampling: bool = False

    def to_provenance(self) -> dict[str, str]:
        """The provenance entries (strings) that record this spec in the file."""
        prov = {"llm.kind": KIND, "llm.max_seq_len": str(self.max_seq_len),
                "llm.max_batch": str(self.max_batch), "llm.prefill_len": str(self.prefill_len),
                "llm.vocab_size": str(self.vocab_size),
                "llm.eos_token_ids": ",".join(map(str, self.eos_token_ids))}
        if self.sampling:
            prov["llm.sampling"] = SAMPLING
        return prov

    @classmethod
    def from_provenance(cls, prov: Mapping[str, Any]) -> "LlmSpec":
        """Read and check the spec; ProgramError naming the entry that is missing or bad."""
        missing = [k for k in _KEYS if k not in prov]
        if missing:
            raise ProgramError(f"provenance: not a language-model program (llm.export): "
                               f"missing {missing}")
        if prov["llm.kind"] != KIND:
            raise ProgramError(f"provenance: llm.kind: expected {KIND!r}, got "
                               f"{prov['llm.kind']!r}")

        def size(key: str, top: int) -> int:
            text = prov[key]
            if not isinstance(text, str) or not text.isdigit() or not 1 <= int(text) <= top:
                raise ProgramError(f"provenance: {key}: expected an int in [1, {top}], got "
                                   f"{text!r}")
            return int(text)

        seq = size("llm.max_seq_len", MAX_SEQ_LEN)
        spec = cls(max_seq_len=seq, max_batch=size("llm.max_batch", MAX_BATCH),
                   prefill_len=size("llm.prefill_len", seq),
                   vocab_size=size("llm.vocab_size", 1 << 31), eos_token_ids=())
        eos_text = prov["llm.eos_token_ids"]
        eos: list[int] = []
        for part in filter(None, str(eos_text).split(",")):
            if not part.isdigit() or int(part) >= spec.vocab_size:
                raise ProgramError(f"provenance: llm.eos_token_ids: {eos_text!r} is not a list "
                                   f"of token ids below the vocabulary size {spec.vocab_size}")
            eos.append(int(part))
        sampling = prov.get("llm.sampling")
        if sampling not in (None, SAMPLING):
            raise ProgramError(f"provenance: llm.sampling: expected {SAMPLING!r} (the rule "
                               f"this version's generate draws by), got {sampling!r}")
        return cls(spec.max_seq_len, spec.max_batch, spec.prefill_len, spec.vocab_size,
                   tuple(eos), sampling=sampling is not None)
