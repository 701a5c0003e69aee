"""The fuzzer's version-2 part: stateful and multi-method seeds, their mutation kinds, and
the reference's state (kept across runs and methods) that judges them."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from tests.fuzz import harness as H
from tests.fuzz import mutate as M
from tests.fuzz import reference as R

V2_KINDS = {"state_spec", "methods", "state_root"}


@pytest.mark.parametrize("name", sorted(M.SEEDS_V2))
def test_every_v2_seed_runs_equal_over_two_rounds(name: str) -> None:
    doc, entries, data = M.seed_files()[name]
    assert doc["version"] == 2
    for seed in range(2):
        r = H.judge(M.join(doc, entries, data), seed)
        assert r["outcome"] == "ran_equal", r


def test_reference_keeps_state_across_runs_and_methods() -> None:
    ref = R.Reference(M.seed_methods_shared())
    x = np.array([1, 2, 3, 4], np.float32)
    total, = ref.run([x], "prefill")
    assert total["v"].tolist() == [10.0] and not total["undef"].any()
    cache, = ref.run([np.array([9], np.float32)], "decode")
    assert cache["v"].tolist() == [1, 2, 3, 4, 9, 0, 0, 0]
    cache, = ref.run([np.array([7], np.float32)], "decode")
    assert cache["v"].tolist() == [1, 2, 3, 4, 9, 7, 0, 0]
    peek, = ref.run([], "peek")         # the strided state view at byte 4: cache[1::2]
    assert peek["v"].tolist() == [2, 4, 7, 0]
    cache_s, pos = ref.state_values()
    assert cache_s["v"].tolist() == [1, 2, 3, 4, 9, 7, 0, 0] and pos["v"].tolist() == [6]


def test_reference_starts_state_from_its_init_and_own_state_is_apart() -> None:
    prog = M.seed_methods_own()
    ref = R.Reference(prog)
    x, i = np.ones(6, np.float32), np.array([0, 1, 9], np.int64)
    o, o_ring, o_count = ref.run([x, i], "a")
    assert o["v"].tolist() == [0.5] * 6 and o_count["v"].tolist() == [1]
    # ring [5, -3, 7, 2**31 - 1] read at clamp(i + count) with count 1 (written first)
    assert o_ring["v"].tolist() == [-3, 7, 2**31 - 1]
    o, _, o_count = ref.run([x, i], "b")
    assert o["v"].tolist() == [-2.0] * 6 and o_count["v"].tolist() == [1]
    o, o_ring, o_count = ref.run([x, i], "a")
    assert o["v"].tolist() == [1.0] * 6 and o_count["v"].tolist() == [2]
    # a's ring stepped once (x * 3 + 1, wrapping int32), at clamp(i + 2)
    assert o_ring["v"].tolist() == [22, 2**31 - 2, 2**31 - 2]


def test_compare_of_state_finds_a_wrong_state() -> None:
    prog = M.seed_state()
    ref = R.Reference(prog)
    ref.run([np.ones(6, np.float32), np.zeros(3, np.int64)])
    want = ref.state_values()
    good = [w["v"].copy() for w in want]
    assert R.compare(want, good) == ""
    bad = copy.deepcopy(good)
    bad[2][0] += 1      # the counter
    assert "differ" in R.compare(want, bad)


def test_v2_mutants_use_every_v2_kind_and_v1_mutants_none() -> None:
    files = M.seed_files()
    got = [M.mutant(files, i, 5) for i in range(400)]
    assert got == [M.mutant(files, i, 5) for i in range(400)]
    v2 = [(n, k) for n, k, _ in got if n in M.SEEDS_V2]
    v1 = [(n, k) for n, k, _ in got if n not in M.SEEDS_V2]
    assert 60 < len(v2) < 200 and v1
    assert V2_KINDS <= {k for _, ks in v2 for k in ks.split("+")}
    assert not V2_KINDS & {k for _, ks in v1 for k in ks.split("+")}
    assert {n for n, _ in v2} == set(M.SEEDS_V2)


@pytest.mark.parametrize("mutate", [M.mutate_state_spec, M.mutate_methods,
                                    M.mutate_state_root])
def test_v2_mutators_change_the_document(mutate: object) -> None:
    doc = M.seed_files()["methods_shared"][0]
    changed = 0
    for i in range(40):
        d = copy.deepcopy(doc)
        d = mutate(random.Random(i), d)
        changed += d != doc
    assert changed >= 30


def test_a_mutator_meeting_an_earlier_mutation_of_a_node_type_goes_on() -> None:
    # campaign mutant (1, 5577): a structure mutation nested an IR node's "t" in a list, and
    # the IR field mutator after it looked the list up in a dict (TypeError: the campaign
    # stopped at its generation)
    name, kinds, data = M.mutant(M.seed_files(), 5577, 1)
    assert (name, kinds) == ("copy_fill", "structure+ir_field+structure")
    assert H.judge(data, 5577)["outcome"] in ("refused", "ran_equal")


def test_reference_marks_a_lane_reading_what_another_lane_writes_undefined() -> None:
    # acc[i] = acc[min(i, 1)] + x[i] in place: lanes 2.. read what lane 1 writes, so their
    # answer depends on the lanes' order; lane 0 and 1 read only what they write themselves
    from aotrt.exporter.builder import ProgramBuilder
    from aotrt.kernels.ir import Arg, Const, Idx, Kernel, Load, Op, Store

    b = ProgramBuilder("t")
    x = b.input("x", "float32", [4])
    acc = b.state("acc", np.arange(1, 5, dtype=np.float32))
    o = b.output("o", "float32", [4])
    at = Op("minimum", (Idx(0), Const(1, "int64")), "int64")
    b.kernel(Kernel("k", (4,), (), (Arg("float32", "r"), Arg("float32", "rw")),
                    (Store(1, Idx(0), Op("add", (Load(1, at, "float32"),
                                                 Load(0, Idx(0), "float32")), "float32")),)),
             [x, acc])
    b.copy(o, acc)
    out, = R.Reference(b.build()).run([np.zeros(4, np.float32)])
    assert out["undef"].all()       # one store, so the whole store is marked racy


#: (master, id) of campaign mutants that once gave a bad outcome
KNOWN_V2 = [(1, 4532),    # ring[i >> (2**63 - 1)] read by lanes 1.. was not seen as a race
            (1, 11509),   # acc[bool(i)] likewise (the reference read the old value)
            (1, 6074),    # an instruction's op a list: TypeError in the validator
            (1, 6920)]    # ... in a method of a version-2 file


@pytest.mark.parametrize("master,index", KNOWN_V2)
def test_known_v2_findings_stay_fixed(master: int, index: int) -> None:
    r = H.judge(M.mutant(M.seed_files(), index, master)[2], index)
    assert r["outcome"] in ("refused", "ran_equal"), r


def test_reference_relu_keeps_the_sign_of_zero_and_nan() -> None:
    # campaign mutant (1, 18663): relu(-0.0) is -0.0 (torch.relu, render_c); the reference
    # said +0.0
    from aotrt.kernels.ir import Op

    from tests.fuzz.test_fuzz import _run1
    x = np.array([-0.0, 0.0, -1.0, 2.0, np.nan], np.float32)
    got = _run1(lambda e: Op("relu", (e,), "float32"), x, "float32")
    assert np.signbit(got).tolist() == [True, False, False, False, False]
    assert got[2:4].tolist() == [0.0, 2.0] and np.isnan(got[4])
