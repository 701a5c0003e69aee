"""llm.export(sampling=True) and llm.generate(do_sample=True): the `sample` method draws, for
a uniform draw u, exactly the token at u in the inverse CDF of Hugging Face's filtered
distribution (its temperature, top-k and top-p warpers on the eager model's logits); top_k=1
is greedy; a seed repeats its tokens; bad arguments and inconsistent files are refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

import aotrt
from aotrt import llm
from aotrt.errors import InvalidArgument, ProgramError
from tests.conftest import DEVICES
from tests.llm.models import VOCAB, build

I64, F32 = np.int64, np.float32
_PROGRAM: list[tuple[Any, aotrt.Program]] = []


def _exported() -> tuple[Any, aotrt.Program]:
    """A Llama model and its program with sampling (3 rows, 64 slots, prefill 8), once."""
    if not _PROGRAM:
        model = build("llama")
        _PROGRAM.append((model, llm.export(model, max_seq_len=64, max_batch=3, prefill_len=8,
                                           sampling=True)))
    return _PROGRAM[0]


def _prompts() -> tuple[np.ndarray, np.ndarray]:
    """Two left-padded prompts: 7 real tokens, and 11."""
    rng = np.random.default_rng(0)
    ids = np.zeros((2, 11), I64)
    mask = np.zeros((2, 11), I64)
    ids[0, 4:], mask[0, 4:] = rng.integers(3, VOCAB, 7), 1
    ids[1], mask[1] = rng.integers(3, VOCAB, 11), 1
    return ids, mask


def _variant(prog: aotrt.Program, names: dict[str, str], **prov: str | None) -> aotrt.Program:
    """`prog` with methods renamed or dropped (new name -> old) and provenance changed
    (None: removed): the files a careless or hostile writer could make."""
    provenance = dict(prog.provenance)
    for key, value in prov.items():
        key = key.replace("_", ".", 1)
        if value is None:
            provenance.pop(key, None)
        else:
            provenance[key] = value
    return aotrt.Program.with_methods(
        {new: prog.method(old) for new, old in names.items()}, constants=prog.constants,
        kernels=prog.kernels, state=prog.state, provenance=provenance)


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_1_is_greedy(device: str) -> None:
    """Through the sample path (prefill of all but the last token, then `sample`)."""
    _, prog = _exported()
    ids, mask = _prompts()
    with aotrt.load(prog, device=device, check_hazards=True) as m:
        greedy = llm.generate(m, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
        assert len(np.unique(greedy[:, 11:])) > 8
        for temperature in (1.0, 0.3):
            got = llm.generate(m, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[],
                               do_sample=True, top_k=1, temperature=temperature, seed=1)
            np.testing.assert_array_equal(got, greedy)
        # A prompt of one token (no prefill at all), and one of the prefill length (8).
        for n in (1, 8, 9):
            want = llm.generate(m, ids[1, :n], max_new_tokens=12, eos_token_id=[])
            got = llm.generate(m, ids[1, :n], max_new_tokens=12, eos_token_id=[],
                               do_sample=True, top_k=1)
            np.testing.assert_array_equal(got, want)


def _hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float
              ) -> torch.Tensor:
    """Hugging Face's filtered distribution [V] (float64): its warpers, in its order."""
    scores = logits[None].clone()
    warpers: list[Any] = [TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(top_p))
    for w in warpers:
        scores = w(None, scores)
    return torch.softmax(scores[0].double(), -1)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (7, 1.0), (1, 1.0), (0, 0.9), (0, 0.4),
                                         (50, 0.8), (1000, 0.93)])
def test_sample_draws_the_inverse_cdf_of_hugging_faces_distribution(top_k: int,
                                                                   top_p: float) -> None:
    """For u at the middle of each kept token's interval of the CDF (over the tokens by
    descending logit), and for u just under 1, `sample` returns exactly that token."""
    model, prog = _exported()
    ids, mask = _prompts()
    lengths = mask.sum(1)
    with torch.no_grad():
        logits = [model(torch.tensor(ids[r, 11 - lengths[r]:])[None]).logits[0, -1]
                  for r in range(2)]
    # The cache as generate(do_sample=True) leaves it: all but the last token prefilled.
    start = np.array([16 - lengths[0] + 1, 16 - lengths[1] + 1, 16], I64)
    tokens = np.zeros((3, 16), I64)
    tokens[:2, 6:] = ids[:, :10]
    last = np.zeros((3, 1), I64)
    last[:2, 0] = ids[:, -1]
    checked = 0
    with aotrt.load(prog, device="cpu") as m:
        for s in (0, 8):
            m.method("prefill").run(tokens[:, s:s + 8], np.array(s, I64), start)
        sample = m.method("sample").bind()
        for temperature in (0.6, 1.0, 1.5):
            draws, want = [], []
            for r in range(2):
                probs = _hf_probs(logits[r], temperature, top_k, top_p)
                order = torch.sort(logits[r], descending=True, stable=True).indices
                p = probs[order].numpy()
                kept = int((p > 0).sum())
                # The filtered set is a prefix of the order, and the test's top_p is not at a
                # rounding's distance from a prefix's mass (that would test the rounding).
                assert (p[:kept] > 0).all() and (p[kept:] == 0).all()
                full = torch.softmax(logits[r].double() / temperature, -1)[order].numpy()
                if top_k:
                    full[top_k:] = 0
                mass = np.cumsum(full) / full.sum()
                assert np.abs(mass - top_p).min() > 1e-5 or top_p == 1
                cdf = np.cumsum(p)
                lo = np.concatenate([[0.0], cdf[:-1]])
                wide = np.flatnonzero(p > 1e-5)
                wide = wide[np.linspace(0, len(wide) - 1, min(len(wide), 40)).astype(int)]
                u = list((lo[wide] + cdf[wide]) / 2)
                w = list(order[wide].numpy())
                if p[kept - 1] > 1e-5:
                    u.append(np.nextafter(F32(1), F32(0)))
                    w.append(int(order[kept - 1]))
                draws.append(u)
                want.append(w)
            for j in range(max(map(len, draws))):
                uniform = np.zeros(3, F32)
                for r in range(2):
                    uniform[r] = draws[r][min(j, len(draws[r]) - 1)]
                got, = sample.run(last, np.array(16, I64), start, uniform,
                                  np.array(temperature, F32), np.array(top_k, I64),
                                  np.array(top_p, F32))
                got = np.asarray(got)
                for r in range(2):
                    k = min(j, len(draws[r]) - 1)
                    assert got[r] == want[r][k], (temperature, r, draws[r][k])
                    checked += 1
    assert checked >= 12


def test_a_seed_repeats_its_tokens() -> None:
    _, prog = _exported()
    ids, mask = _prompts()
    seen: list[np.ndarray] = []
    kw: dict[str, Any] = dict(attention_mask=mask, max_new_tokens=24, eos_token_id=[],
                              do_sample=True)
    with aotrt.load(prog, device="cpu") as m:
        a = llm.generate(m, ids, seed=7, on_token=lambda step, t: seen.append(t), **kw)
        b = llm.generate(m, ids, seed=np.random.default_rng(7), **kw)
        c = llm.generate(m, ids, seed=8, **kw)
        d = llm.generate(m, ids, seed=7, top_k=20, top_p=0.9, temperature=0.7, **kw)
        greedy = llm.generate(m, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.stack(seen, 1), a[:, 11:])
    np.testing.assert_array_equal(a[:, :11], ids)
    assert (a[:, 11:] != c[:, 11:]).mean() > 0.5
    assert (a[:, 11:] != greedy[:, 11:]).any() and (d[:, 11:] != a[:, 11:]).any()
    assert len(np.unique(a[:, 11:])) > 12 and ((0 <= a) & (a < VOCAB)).all()


def test_bad_sampling_arguments_are_refused() -> None:
    _, prog = _exported()
    ids = np.ones((1, 3), I64)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"temperature": 0}, "temperature: expected > 0"),
        ({"temperature": 1e-50}, "temperature: expected > 0"),
        ({"temperature": -1.0}, "temperature: expected > 0"),
        ({"temperature": float("nan")}, "temperature: expected a finite"),
        ({"temperature": 1e39}, "temperature: expected a finite"),
        ({"temperature": "1"}, "temperature: expected a number"),
        ({"top_k": -1}, "top_k: expected an int >= 0"),
        ({"top_k": 2.0}, "top_k: expected an int >= 0"),
        ({"top_k": True}, "top_k: expected an int >= 0"),
        ({"top_p": 0.0}, "top_p: expected a number in \\(0, 1\\]"),
        ({"top_p": 1.5}, "top_p: expected a number in \\(0, 1\\]"),
        ({"top_p": None}, "top_p: expected a number"),
        ({"seed": -1}, "seed: expected None, an int >= 0"),
        ({"seed": 1.5}, "seed: expected None, an int >= 0"),
        ({"do_sample": "yes"}, "do_sample: expected a bool"),
    ]
    with aotrt.load(prog, device="cpu") as m:
        for kw, match in bad:
            with pytest.raises(InvalidArgument, match=match):
                llm.generate(m, ids, **{"do_sample": True, **kw})
        # Sampling settings without do_sample would silently decode greedily.
        with pytest.raises(InvalidArgument, match="temperature, top_p: only apply with "
                                                   "do_sample=True"):
            llm.generate(m, ids, temperature=0.7, top_p=0.5)
        # The prompt's last token takes a slot of its own: 56 prefilled + 9 new > 64.
        with pytest.raises(InvalidArgument, match="need 65 cache slots"):
            llm.generate(m, np.ones((1, 57), I64), max_new_tokens=9, do_sample=True)
        # No end token: an unseeded draw of the config's eos would stop it early (flaky).
        assert llm.generate(m, np.ones((1, 57), I64), max_new_tokens=8, do_sample=True,
                            eos_token_id=[]).shape == (1, 65)
    with pytest.raises(InvalidArgument, match="sampling: expected a bool"):
        llm.export(build("gpt2"), max_seq_len=8, sampling=1)


def test_the_file_records_sampling_and_generate_checks_it() -> None:
    _, prog = _exported()
    assert sorted(prog.methods) == ["decode", "prefill", "sample"]
    assert prog.provenance["llm.sampling"] == "inverse-cdf"
    sample = prog.method("sample")
    assert [(s["dtype"], list(s["shape"])) for s in sample.inputs] == [
        ("int64", [3, 1]), ("int64", []), ("int64", [3]), ("float32", [3]), ("float32", []),
        ("int64", []), ("float32", [])]
    ids = np.ones((1, 3), I64)
    greedy_only = _variant(prog, {"prefill": "prefill", "decode": "decode"}, llm_sampling=None)
    with aotrt.load(greedy_only, device="cpu") as m:
        with pytest.raises(InvalidArgument, match="do_sample: the program has no 'sample' "
                                                   "method .*sampling=True"):
            llm.generate(m, ids, do_sample=True)
        assert llm.generate(m, ids, max_new_tokens=2).shape == (1, 5)
    cases: list[tuple[aotrt.Program, str]] = [
        # a `sample` method that is the decode method: inputs checked like _check_method's
        (_variant(prog, {"prefill": "prefill", "decode": "decode", "sample": "decode"}),
         "methods\\['sample'\\]: expected inputs"),
        (_variant(prog, {"prefill": "prefill", "decode": "decode"}),
         "methods: a language-model program needs 'sample'"),
        (_variant(prog, {"prefill": "prefill", "decode": "decode", "sample": "sample"},
                  llm_sampling=None), "'sample' method but no llm.sampling"),
        (_variant(prog, {"prefill": "prefill", "decode": "decode", "sample": "sample"},
                  llm_sampling="multinomial"), "llm.sampling: expected 'inverse-cdf'"),
    ]
    for variant, match in cases:
        with aotrt.load(variant, device="cpu") as m:
            with pytest.raises(ProgramError, match=match):
                llm.generate(m, ids, do_sample=True)
