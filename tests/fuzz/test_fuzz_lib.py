"""The library-op seeds and their param mutations: each seed loads and runs, mutants put
geometry params at their extremes, and those are refused naming the param (never raw)."""

from __future__ import annotations

import copy
import random

import pytest

from tests.fuzz import harness as H
from tests.fuzz import mutate as M


@pytest.mark.parametrize("name", sorted(M.SEEDS_LIB))
def test_library_seeds_load_and_run(name: str) -> None:
    r = H.judge(M.join(*M.seed_files()[name]), 1)
    # The reference interpreter has no convolution, pooling, upsampling or topk: the run is
    # judged for crashes, hangs and raw errors only. linear_wq it has (reference_lib.py).
    assert r["outcome"] == ("ran_equal" if name == "lib_linear_wq" else "ran_unchecked"), r


@pytest.mark.parametrize("name", sorted(M.SEEDS_LIB))
def test_params_at_their_extremes_are_refused_by_name(name: str) -> None:
    doc, entries, data = M.seed_files()[name]
    params = sorted(doc["instructions"][0]["params"])
    for param in params:
        for value in (-1, 2**31, 2**63, [2**62, 1], [], "3"):
            d = copy.deepcopy(doc)
            if d["instructions"][0]["params"][param] == value:
                continue
            d["instructions"][0]["params"][param] = value
            r = H.judge(M.join(d, entries, data), 1)
            assert r["outcome"] in ("refused", "ran_unchecked", "ran_equal"), (param, value, r)
            if value in (2**63, "3"):
                # never a valid value of any of these params: refused, naming the param
                assert r["outcome"] == "refused" and f"params.{param}" in r["detail"], \
                    (param, value, r["detail"])


def test_lib_params_mutation_changes_one_param() -> None:
    doc = M.seed_files()["lib_conv"][0]
    before = copy.deepcopy(doc["instructions"][0]["params"])
    after = M.mutate_lib_params(random.Random(3), copy.deepcopy(doc))["instructions"][0]
    changed = [k for k in before if after["params"].get(k) != before[k]]
    assert len(changed) == 1


def test_earlier_campaigns_keep_their_mutants() -> None:
    """Masters below LIB_FROM_MASTER never draw a library seed (their ids replay as
    recorded); from it on, about LIB_SHARE of the mutants do."""
    files = M.seed_files()
    early = [M.mutant(files, i, 1)[0] for i in range(400)]
    assert not set(early) & set(M.SEEDS_LIB)
    late = [M.mutant(files, i, M.LIB_FROM_MASTER)[0] for i in range(400)]
    share = sum(n in M.SEEDS_LIB for n in late) / len(late)
    assert 0.08 < share < 0.25, share
