"""aotrt.runtime.ops.check: every library op validated from metadata alone, with the same
code (and so the same errors) as the op at call time, and its cpu cost.

Each op has a valid base call; the tests break one field of it at a time (counts, params of
every kind, dtypes, shapes, metadata) and expect a refusal naming the field, from `check`
and from the op run on real cpu handles alike.
"""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import numpy as np
import pytest

from aotrt.errors import AotrtError, InvalidArgument, Unsupported
from aotrt.runtime.ops import OPS, OpCost, TensorMeta, check
from aotrt.program.strides import contiguous_strides

F32, F16, I64 = "float32", "float16", "int64"


def meta(sizes: tuple[int, ...], dtype: str = F32,
         strides: tuple[int, ...] | None = None) -> TensorMeta:
    """A TensorMeta, row-major unless `strides` is given."""
    sizes = tuple(sizes)
    return TensorMeta(dtype, sizes, contiguous_strides(sizes) if strides is None
                      else tuple(strides))


# name -> (outs, ins, params): a valid call of each op.
BASE: dict[str, tuple[list, list, dict]] = {
    "mm": ([meta((2, 3))], [meta((2, 4)), meta((4, 3))], {}),
    "bmm": ([meta((2, 2, 3))], [meta((2, 2, 4)), meta((2, 4, 3))], {}),
    "addmm": ([meta((2, 3))], [meta((3,)), meta((2, 4)), meta((4, 3))],
              {"beta": 0.5, "alpha": 2.0}),
    "linear": ([meta((2, 3))], [meta((2, 4)), meta((3, 4)), meta((3,))], {}),
    "convolution": ([meta((1, 4, 4, 4))], [meta((1, 2, 8, 8)), meta((4, 2, 3, 3)), meta((4,))],
                    {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
                     "transposed": False, "output_padding": [0, 0], "groups": 1}),
    "sdpa": ([meta((1, 2, 3, 4))], [meta((1, 2, 3, 4)), meta((1, 2, 5, 4)),
                                    meta((1, 2, 5, 4)), None],
             {"dropout_p": 0.0, "is_causal": False, "scale": 0.5, "enable_gqa": False}),
    "topk": ([meta((2, 2)), meta((2, 2), I64)], [meta((2, 5))],
             {"k": 2, "dim": -1, "largest": True, "sorted": True}),
    "max_pool2d": ([meta((1, 2, 4, 4)), meta((1, 2, 4, 4), I64)], [meta((1, 2, 8, 8))],
                   {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0],
                    "dilation": [1, 1], "ceil_mode": False}),
    "upsample_nearest2d": ([meta((1, 2, 6, 8))], [meta((1, 2, 3, 4))],
                           {"output_size": [6, 8], "scale_factors": None}),
    # int4 weights, two groups of 32 along K = 64: x, qweight, scales, zeros, bias
    "linear_wq": ([meta((2, 3))], [meta((2, 64)), meta((3, 32), "uint8"), meta((3, 2)),
                                   meta((3, 2)), meta((3,))], {"bits": 4, "group_size": 32}),
}

INT_PARAMS = {  # (op, param, minimum)
    ("convolution", "stride", 1), ("convolution", "padding", 0),
    ("convolution", "dilation", 1), ("convolution", "output_padding", 0),
    ("convolution", "groups", 1), ("max_pool2d", "kernel_size", 1),
    ("max_pool2d", "stride", 1), ("max_pool2d", "padding", 0),
    ("max_pool2d", "dilation", 1), ("topk", "k", 0), ("topk", "dim", -2),
    ("upsample_nearest2d", "output_size", 1),
}
BOOL_PARAMS = {("convolution", "transposed"), ("sdpa", "is_causal"), ("sdpa", "enable_gqa"),
               ("topk", "largest"), ("topk", "sorted"), ("max_pool2d", "ceil_mode")}
FLOAT_PARAMS = {("addmm", "beta"), ("addmm", "alpha"), ("sdpa", "scale"),
                ("sdpa", "dropout_p"), ("upsample_nearest2d", "scale_factors")}

# Not an int, in every JSON shape a hostile file can give, and ints no geometry can use.
BAD_INTS = [True, False, 1.5, 2.0, "2", None, {"a": 1}, [[1]], [1, 2, 3], [1.0, 1.0],
            [True, True], 2 ** 31, 2 ** 62, -(2 ** 62), 10 ** 30]
BAD_BOOLS = [2, -1, 0.5, "true", [True], {"x": True}]
BAD_FLOATS = ["1", [[1.0]], True, {"x": 1.0}, 10 ** 400]


def expect_refused(fn: str, outs: list, ins: list, params: dict, field: str,
                   kind: type = InvalidArgument) -> AotrtError:
    """check refuses the call with `kind`, naming `field`."""
    with pytest.raises(kind) as e:
        check(fn, outs, ins, params)
    assert field in str(e.value), (field, str(e.value))
    return e.value


def test_base_calls_are_accepted_with_a_cost():
    for fn, (outs, ins, params) in BASE.items():
        cost = check(fn, outs, ins, params)
        assert isinstance(cost, OpCost)
        assert cost.work > 0 and cost.scratch_bytes > 0, fn
    assert set(BASE) == set(OPS)


@pytest.mark.parametrize("fn", ["nope", "", "MM", "__init__", "OPS", "check", "mm ", 3, None,
                                ("mm",)])
def test_unknown_op_is_unsupported(fn):
    with pytest.raises(Unsupported, match="not in this runtime"):
        check(fn, [meta((2, 3))], [meta((2, 4)), meta((4, 3))], {})


@pytest.mark.parametrize("fn", sorted(BASE))
def test_wrong_counts_and_absent_tensors(fn):
    outs, ins, params = BASE[fn]
    expect_refused(fn, outs + [meta((1,)), meta((1,))], ins, params, "outs")
    expect_refused(fn, [], ins, params, "outs")
    expect_refused(fn, outs[0], ins, params, "outs")
    expect_refused(fn, [None] + outs[1:], ins, params, "outs[0]")
    # two too many: convolution's residual may be left out, so one more is still a count
    expect_refused(fn, outs, ins + [meta((1,))] * 2, params, "ins")
    expect_refused(fn, outs, ins[:-1], params, "ins")
    expect_refused(fn, outs, {"a": ins}, params, "ins")
    expect_refused(fn, outs, [None] + ins[1:], params, "ins[0]")


@pytest.mark.parametrize("fn", sorted(BASE))
def test_unknown_and_missing_params(fn):
    outs, ins, params = BASE[fn]
    expect_refused(fn, outs, ins, dict(params, bogus=1), "bogus")
    expect_refused(fn, outs, ins, dict(params, __class__=1), "__class__")
    expect_refused(fn, outs, ins, [1, 2], "params")
    expect_refused(fn, outs, ins, {1: 2}, "params")
    for name in {"topk": ["k"], "max_pool2d": ["kernel_size"]}.get(fn, []):
        expect_refused(fn, outs, ins, {k: v for k, v in params.items() if k != name}, name)


@pytest.mark.parametrize("fn,param,minimum", sorted(INT_PARAMS))
def test_bad_int_params_name_the_param(fn, param, minimum):
    outs, ins, params = BASE[fn]
    bad = list(BAD_INTS) + [minimum - 1, [minimum - 1, minimum - 1]]
    if fn == "upsample_nearest2d":
        bad = [v for v in bad if v is not None]  # None: sizes from scale_factors
    for v in bad:
        if param in ("padding", "stride", "dilation", "output_padding") and v in (None, []):
            continue  # aten's defaults
        if param == "dim" and v is False:
            continue
        expect_refused(fn, outs, ins, dict(params, **{param: v}), param)


@pytest.mark.parametrize("fn,param", sorted(BOOL_PARAMS))
def test_bad_bool_params_name_the_param(fn, param):
    outs, ins, params = BASE[fn]
    for v in BAD_BOOLS:
        expect_refused(fn, outs, ins, dict(params, **{param: v}), param)


@pytest.mark.parametrize("fn,param", sorted(FLOAT_PARAMS))
def test_bad_float_params_name_the_param(fn, param):
    outs, ins, params = BASE[fn]
    bad = list(BAD_FLOATS)
    if param == "scale_factors":
        bad = [[v, 1.0] for v in bad] + [[0.0, 1.0], [-1.0, 1.0], [1e-300, 1.0], [2.0], 2.0]
    for v in bad:
        expect_refused(fn, outs, ins, dict(params, **{param: v}), param)


def test_dropout_is_unsupported():
    outs, ins, params = BASE["sdpa"]
    expect_refused("sdpa", outs, ins, dict(params, dropout_p=0.1), "dropout", Unsupported)


def _with(metas: list, i: int, **changes: Any) -> list:
    m = metas[i]
    new = TensorMeta(changes.get("dtype", m.dtype), changes.get("sizes", m.sizes),
                     changes.get("strides", m.strides))
    return metas[:i] + [new] + metas[i + 1:]


# Per op, the field name of each out and in position.
FIELDS = {"mm": (["out"], ["a", "b"]), "bmm": (["out"], ["a", "b"]),
          "addmm": (["out"], ["bias", "a", "b"]), "linear": (["out"], ["x", "w", "bias"]),
          "convolution": (["out"], ["x", "w", "bias"]),
          "sdpa": (["out"], ["q", "k", "v", "attn_mask"]),
          "topk": (["values_out", "indices_out"], ["x"]),
          "max_pool2d": (["out", "indices_out"], ["x"]), "upsample_nearest2d": (["out"], ["x"]),
          "linear_wq": (["out"], ["x", "qweight", "scales", "zeros", "bias"])}
#: inputs that take any float dtype (so a wrong one is an integer dtype)
ANY_FLOAT = {("linear_wq", "scales")}


@pytest.mark.parametrize("fn", sorted(BASE))
def test_dtype_mismatches_name_the_tensor(fn):
    outs, ins, params = BASE[fn]
    out_names, in_names = FIELDS[fn]
    for i, m in enumerate(outs):
        other = F16 if m.dtype != F16 else F32
        if fn in ("topk", "max_pool2d", "upsample_nearest2d") and i == 0:
            # the value output is compared with x
            expect_refused(fn, _with(outs, i, dtype=other), ins, params, out_names[i])
            continue
        kind = (InvalidArgument, Unsupported)
        e = expect_refused(fn, _with(outs, i, dtype=other), ins, params, "", kind)
        assert out_names[i] in str(e) or "x" in str(e) or "a" in str(e), str(e)
    for i, m in enumerate(ins):
        if m is None:
            continue
        bad = I64 if (fn, in_names[i]) in ANY_FLOAT else F16
        expect_refused(fn, outs, _with(ins, i, dtype=bad), params, in_names[i],
                       (InvalidArgument, Unsupported))
    if fn == "sdpa":
        mask = meta((1, 2, 3, 5), "int32")
        expect_refused(fn, outs, ins[:3] + [mask], params, "attn_mask")


@pytest.mark.parametrize("fn", sorted(BASE))
def test_output_shape_mismatches_name_the_output(fn):
    outs, ins, params = BASE[fn]
    out_names, _ = FIELDS[fn]
    for i, m in enumerate(outs):
        for d in range(len(m.sizes)):
            sizes = list(m.sizes)
            sizes[d] += 1
            expect_refused(fn, _with(outs, i, sizes=tuple(sizes), strides=contiguous_strides(
                tuple(sizes))), ins, params, out_names[i])
        extra = tuple(m.sizes) + (1,)
        expect_refused(fn, _with(outs, i, sizes=extra, strides=contiguous_strides(extra)), ins,
                       params, out_names[i])


@pytest.mark.parametrize("fn", sorted(BASE))
def test_input_shape_mismatches_are_refused(fn):
    outs, ins, params = BASE[fn]
    _, in_names = FIELDS[fn]
    for i, m in enumerate(ins):
        if m is None or in_names[i] == "bias":  # a 0-D bias broadcasts
            continue
        for sizes in (tuple(m.sizes) + (1,), tuple(m.sizes)[:-1]):
            with pytest.raises((InvalidArgument, Unsupported)):
                check(fn, outs, _with(ins, i, sizes=sizes, strides=contiguous_strides(sizes)),
                      params)
    if fn in ("mm", "bmm", "addmm"):  # K mismatch
        a = ins[-2]
        sizes = tuple(a.sizes[:-1]) + (a.sizes[-1] + 1,)
        expect_refused(fn, outs, _with(ins, len(ins) - 2, sizes=sizes,
                                       strides=contiguous_strides(sizes)), params, "b")


@pytest.mark.parametrize("fn", sorted(BASE))
def test_malformed_metadata_is_refused(fn):
    outs, ins, params = BASE[fn]
    m = outs[0]
    n = len(m.sizes)
    for bad in (TensorMeta("float128", m.sizes, m.strides), TensorMeta(["float32"], m.sizes,
                                                                       m.strides),
                TensorMeta("torch.float32", m.sizes, m.strides),
                TensorMeta(m.dtype, (True,) * n, m.strides),
                TensorMeta(m.dtype, (-1,) + m.sizes[1:], m.strides),
                TensorMeta(m.dtype, (2.0,) * n, m.strides),
                TensorMeta(m.dtype, m.sizes, m.strides + (1,)),
                TensorMeta(m.dtype, m.sizes, (1.5,) * n),
                TensorMeta(m.dtype, 3, m.strides),
                TensorMeta(m.dtype, (1,) * 65, (1,) * 65),
                {"dtype": "float32", "sizes": [2, 3], "strides": [3, 1]}):
        expect_refused(fn, [bad] + outs[1:], ins, params, "outs[0]")
        expect_refused(fn, outs, [bad] + ins[1:], params, "ins[0]")


@pytest.mark.parametrize("fn", sorted(BASE))
def test_outputs_whose_elements_alias_are_refused(fn):
    outs, ins, params = BASE[fn]
    out_names, _ = FIELDS[fn]
    for i, m in enumerate(outs):
        d = next(d for d, n in enumerate(m.sizes) if n > 1)
        strides = list(m.strides)
        strides[d] = 0
        expect_refused(fn, _with(outs, i, strides=tuple(strides)), ins, params, out_names[i])


def test_zero_stride_inputs_are_accepted():
    # Broadcast (expanded) inputs are ordinary; only outputs may not alias.
    outs, ins, params = BASE["mm"]
    check("mm", outs, [meta((2, 4), strides=(0, 1)), meta((4, 3), strides=(0, 0))], params)


# -- hostile geometry: refused, or costed so that the load budget refuses it ---------------------

def test_pool_with_a_huge_kernel_costs_its_taps():
    k = 2 ** 28
    cost = check("max_pool2d", [meta((1, 1, 1, 1))], [meta((1, 1, 1, 1))],
                 {"kernel_size": [k, k], "padding": [k // 2, k // 2]})
    assert cost.work >= k * k
    cost = check("max_pool2d", [meta((1, 1, 1, 1))], [meta((1, 1, 1, 1))],
                 {"kernel_size": [k, 1], "padding": [k // 2, 0]})
    assert cost.work >= k and cost.scratch_bytes >= 4 * k  # the padded copy of the input


def test_conv_padding_costs_the_padded_copy():
    # padding 40000 with a stride over it: a 1x1 output from a 25.6 GB padded input.
    p = 40000
    cost = check("convolution", [meta((1, 1, 1, 1))], [meta((1, 1, 1, 1)), meta((1, 1, 1, 1)),
                                                        None],
                 {"padding": [p, p], "stride": [2 ** 31 - 1, 2 ** 31 - 1]})
    assert cost.scratch_bytes >= 4 * (2 * p + 1) ** 2 >= 16 << 30
    # 1-D: the same for the padded row.
    cost = check("convolution", [meta((1, 1, 1))], [meta((1, 1, 1)), meta((1, 1, 1)), None],
                 {"padding": [2 ** 30 - 1], "stride": [2 ** 31 - 1]})
    assert cost.scratch_bytes >= 4 * (2 ** 31 - 1)


@pytest.mark.parametrize("param", ["stride", "padding", "dilation"])
@pytest.mark.parametrize("value", [2 ** 31, 2 ** 62, 2 ** 63, 2 ** 64 + 1])
def test_geometry_beyond_int32_is_refused(param, value):
    x, w = meta((1, 1, 4, 4)), meta((1, 1, 1, 1))
    expect_refused("convolution", [meta((1, 1, 1, 1))], [x, w, None], {param: [value, value]},
                   param)
    expect_refused("max_pool2d", [meta((1, 1, 1, 1))], [x], {"kernel_size": [1, 1],
                                                             param: [value, value]}, param)


def test_transposed_conv_with_a_huge_stride_costs_its_output():
    s = 2 ** 31 - 1
    out = (s + 1)
    cost = check("convolution", [meta((1, 1, 1, out))], [meta((1, 1, 1, 2)), meta((1, 1, 1, 1)),
                                                          None],
                 {"stride": [1, s], "transposed": True})
    assert cost.work >= out and cost.scratch_bytes >= 4 * out


def test_upsample_scale_beyond_float32_is_refused():
    # 1 / 1e-300 is infinite in float32: the source index would be NaN cast to int64.
    expect_refused("upsample_nearest2d", [meta((1, 1, 4, 4))], [meta((1, 1, 2, 2))],
                   {"output_size": [4, 4], "scale_factors": [1e-300, 1e-300]}, "scale_factors")
    expect_refused("upsample_nearest2d", [meta((1, 1, 4, 4))], [meta((1, 1, 2, 2))],
                   {"scale_factors": [1e308, 1e308]}, "")


# -- cost --------------------------------------------------------------------------------------

def test_work_covers_the_elementary_steps():
    m, n, k = 7, 5, 11
    assert check("mm", [meta((m, n))], [meta((m, k)), meta((k, n))], {}).work >= m * n * k
    b = 3
    assert check("bmm", [meta((b, m, n))], [meta((b, m, k)), meta((b, k, n))],
                 {}).work >= b * m * n * k
    assert check("linear", [meta((b, m, n))], [meta((b, m, k)), meta((n, k)), None],
                 {}).work >= b * m * n * k
    # conv: N*Cout*Hout*Wout*Cin/groups*kh*kw
    cost = check("convolution", [meta((2, 6, 6, 6))], [meta((2, 4, 8, 8)), meta((6, 2, 3, 3)),
                                                        None], {"groups": 2})
    assert cost.work >= 2 * 6 * 6 * 6 * 2 * 3 * 3
    # pool: N*C*Hout*Wout*kh*kw, with and without indices
    for outs in ([meta((2, 3, 2, 2))], [meta((2, 3, 2, 2)), meta((2, 3, 2, 2), I64)]):
        cost = check("max_pool2d", outs, [meta((2, 3, 8, 8))], {"kernel_size": [4, 4]})
        assert cost.work >= 2 * 3 * 2 * 2 * 16
    # sdpa: B*H*Lq*Lk*D*2
    cost = check("sdpa", [meta((2, 3, 5, 4))], [meta((2, 3, 5, 4)), meta((2, 3, 7, 4)),
                                                meta((2, 3, 7, 4)), None], {})
    assert cost.work >= 2 * 3 * 5 * 7 * 4 * 2
    cost = check("topk", [meta((3, 2)), meta((3, 2), I64)], [meta((3, 64))], {"k": 2})
    assert cost.work >= 3 * 64 * 6
    cost = check("upsample_nearest2d", [meta((2, 3, 8, 8))], [meta((2, 3, 2, 2))],
                 {"output_size": [8, 8]})
    assert cost.work >= 2 * 3 * 8 * 8


def test_work_grows_with_the_problem():
    def pool(k: int) -> int:
        return check("max_pool2d", [meta((1, 1, 1, 1))], [meta((1, 1, k, k))],
                     {"kernel_size": [k, k]}).work

    # Windows big enough that their taps, not the reduction's fixed python steps, dominate.
    assert pool(512) >= 4 * pool(256) * 0.9
    big = check("mm", [meta((64, 64))], [meta((64, 4096)), meta((4096, 64))], {}).work
    assert big >= 32 * check("mm", [meta((64, 64))], [meta((64, 64)), meta((64, 64))], {}).work


def test_outputs_without_elements_cost_nothing():
    assert check("mm", [meta((0, 3))], [meta((0, 4)), meta((4, 3))], {}) == OpCost(0, 0)


# Calls whose scratch the cpu implementation's peak allocation must stay within.
SCRATCH_CASES = [
    ("mm", [meta((64, 48), F16)], [meta((64, 96), F16), meta((96, 48), F16)], {}),
    ("addmm", [meta((64, 48))], [meta((64, 48)), meta((64, 96)), meta((96, 48))],
     {"beta": 0.5}),
    ("linear", [meta((4, 16, 48), F16)], [meta((4, 16, 96), F16), meta((48, 96), F16),
                                          meta((48,), F16)], {}),
    ("convolution", [meta((2, 8, 30, 30))], [meta((2, 4, 32, 32)), meta((8, 4, 5, 5)), None],
     {"padding": [1, 1]}),
    ("convolution", [meta((2, 8, 32, 32))], [meta((2, 8, 32, 32)), meta((8, 1, 3, 3)), None],
     {"padding": [1, 1], "groups": 8}),
    ("convolution", [meta((2, 4, 63, 63), F16)], [meta((2, 8, 32, 32), F16),
                                                  meta((8, 2, 3, 3), F16), None],
     {"stride": [2, 2], "padding": [1, 1], "transposed": True, "output_padding": [0, 0],
      "groups": 2}),
    ("convolution", [meta((2, 8, 30))], [meta((2, 4, 32)), meta((8, 4, 3)), None], {}),
    ("convolution", [meta((2, 8, 4, 14, 14))], [meta((2, 4, 6, 16, 16)), meta((8, 4, 3, 3, 3)),
                                                None], {}),
    ("convolution", [meta((2, 8, 6, 8, 8), F16)], [meta((2, 8, 6, 16, 16), F16),
                                                   meta((8, 1, 3, 3, 3), F16), None],
     {"stride": [1, 2, 2], "padding": [1, 1, 1], "groups": 8}),
    ("convolution", [meta((2, 4, 8, 10, 10))], [meta((2, 8, 4, 5, 5)), meta((8, 2, 3, 3, 3)),
                                                None],
     {"stride": [2, 2, 2], "padding": [1, 1, 1], "transposed": True,
      "output_padding": [1, 1, 1], "groups": 2}),
    ("max_pool2d", [meta((2, 4, 17, 17)), meta((2, 4, 17, 17), I64)], [meta((2, 4, 32, 32))],
     {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True}),
    ("max_pool2d", [meta((2, 4, 16, 16), F16)], [meta((2, 4, 32, 32), F16)],
     {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
    ("sdpa", [meta((2, 4, 64, 32))], [meta((2, 4, 64, 32)), meta((2, 4, 96, 32)),
                                      meta((2, 4, 96, 32)), meta((2, 1, 64, 96))], {}),
    ("sdpa", [meta((2, 4, 200, 32), F16)], [meta((2, 4, 200, 32), F16), meta((2, 2, 200, 32),
                                                                             F16),
                                            meta((2, 2, 200, 32), F16), None],
     {"is_causal": True, "enable_gqa": True}),
    ("topk", [meta((64, 8), "bfloat16"), meta((64, 8), I64)], [meta((64, 300), "bfloat16")],
     {"k": 8, "dim": 1}),
    ("topk", [meta((8, 64)), meta((8, 64), I64)], [meta((300, 64))], {"k": 8, "dim": 0,
                                                                      "largest": False}),
    ("upsample_nearest2d", [meta((2, 3, 48, 40))], [meta((2, 3, 16, 20))],
     {"output_size": [48, 40]}),
]


@pytest.mark.parametrize("dev", ["cpu"], indirect=True)
@pytest.mark.parametrize("stream", ["async"], indirect=True)
@pytest.mark.parametrize("case", range(len(SCRATCH_CASES)))
def test_scratch_bounds_the_cpu_peak_allocation(kit, stream, case):
    fn, outs, ins, params = SCRATCH_CASES[case]
    cost = check(fn, outs, ins, params)
    ih = [None if m is None else _tensor(kit, m) for m in ins]
    oh = [_tensor(kit, m) for m in outs]
    # Once per device, not the op's scratch: oneDNN loaded and probed, and the kernels or
    # primitives an op compiles at its first call (kept by the device). So: a warm-up call.
    OPS[fn](stream, oh, ih, **params)
    stream.synchronize()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        OPS[fn](stream, oh, ih, **params)
        stream.synchronize()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    used = peak - base
    # 8 KiB: the stream's own bookkeeping of the command.
    assert used <= cost.scratch_bytes + (8 << 10), (fn, used, cost)
    assert cost.scratch_bytes <= 16 * used + (1 << 20), (fn, used, cost)  # not wildly loose


def _tensor(kit: Any, m: TensorMeta) -> Any:
    """A cpu view with m's sizes and strides holding fresh random values."""
    from tests.runtime.ops.conftest import NP

    dt = "bfloat16" if m.dtype == "bfloat16" else m.dtype
    if dt in ("int64", "int32"):
        vals = kit.rng.integers(-50, 50, m.sizes).astype(NP[dt])
    elif dt == "bool":
        vals = kit.rng.random(m.sizes) < 0.7
    else:
        vals = kit.randn(tuple(m.sizes), dt)
    return kit.tensor(vals, strides=tuple(m.strides), offset=0)


def test_cost_is_exact_python_int_arithmetic():
    big = 2 ** 40
    cost = check("mm", [meta((big, big))], [meta((big, big)), meta((big, big))], {})
    assert cost.work >= big ** 3 and isinstance(cost.work, int)
    assert math.log2(cost.scratch_bytes) > 80
