"""Stream options and Fp32Math: defaults and the refusals of bad values."""

from __future__ import annotations

import pytest

from aotrt.errors import InvalidArgument
from aotrt.runtime.options import Fp32Math, StreamOptions, check_threads


def test_float32_stays_float32_unless_asked():
    assert Fp32Math() == Fp32Math(conv_tf32=False, matmul_tf32=False)
    assert StreamOptions().fp32_math == Fp32Math()


@pytest.mark.parametrize("field", ["conv_tf32", "matmul_tf32"])
@pytest.mark.parametrize("value", [1, "yes", None, 0.0])
def test_fp32_math_takes_bools_only(field, value):
    with pytest.raises(InvalidArgument, match=field):
        Fp32Math(**{field: value})


@pytest.mark.parametrize("value", ["tf32", True, {"conv_tf32": True}])
def test_stream_options_refuse_other_fp32_math(value):
    with pytest.raises(InvalidArgument, match="fp32_math"):
        StreamOptions(fp32_math=value)


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "2"])
def test_threads_must_be_a_positive_int(value):
    with pytest.raises(InvalidArgument, match="threads"):
        check_threads(value)
    with pytest.raises(InvalidArgument, match="threads"):
        StreamOptions(threads=value)


def test_flush_interval_must_be_an_int_at_least_zero():
    with pytest.raises(InvalidArgument, match="flush_interval"):
        StreamOptions(flush_interval=-1)
