"""aotrt/measure.py: the timing and error helpers of the CLI and the demo."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aotrt import measure
from tests.support import rand


def test_max_errors_is_the_worst_over_outputs() -> None:
    a, b = rand([4, 5], seed=1), rand([7], seed=2)
    da, db = a + 1e-3 * rand([4, 5], seed=3), b.copy()
    db[3] += 0.25
    abs_err, rel = measure.max_errors([da, db], [a, b])
    want_abs = max(np.max(np.abs(da.astype(np.float64) - a)), 0.25)
    assert abs_err == pytest.approx(want_abs, rel=1e-6)
    want_rel = max(np.max(np.abs(da.astype(np.float64) - a)) / np.max(np.abs(a)),
                   abs(float(db[3]) - float(b[3])) / np.max(np.abs(b)))
    assert rel == pytest.approx(want_rel, rel=1e-6)


def test_max_errors_skips_empty_and_survives_zero_references() -> None:
    assert measure.max_errors([np.zeros(0)], [np.zeros(0)]) == (0.0, 0.0)
    abs_err, rel = measure.max_errors([np.full(3, 2.0)], [np.zeros(3)])
    assert abs_err == 2.0 and rel == pytest.approx(2.0 / 1e-30)


def test_max_errors_is_nan_for_an_all_nan_output() -> None:
    """np.max gives NaN, and Python's max(0.0, nan) is 0.0: the error must stay NaN."""
    ref = rand([4, 5], seed=4)
    abs_err, rel = measure.max_errors([np.full((4, 5), np.nan, np.float32)], [ref])
    assert np.isnan(abs_err) and np.isnan(rel)
    # ... also after a good output, and for one NaN among finite values.
    one = ref.copy()
    one[2, 3] = np.nan
    abs_err, rel = measure.max_errors([ref, one], [ref, ref])
    assert np.isnan(abs_err) and np.isnan(rel)


@pytest.mark.parametrize("bad", ["lost_nan", "lost_inf", "sign_of_inf", "shape"])
def test_max_errors_judges_non_finite_values_and_shapes(bad: str) -> None:
    ref = rand([6], seed=5).astype(np.float64)
    ref[1], ref[4] = np.nan, -np.inf
    good = ref.copy()
    assert measure.max_errors([good], [ref]) == (0.0, 0.0)
    got = {"lost_nan": np.where(np.isnan(ref), 0.0, ref),
           "lost_inf": np.where(np.isinf(ref), -1e30, ref),
           "sign_of_inf": np.where(np.isinf(ref), np.inf, ref),
           "shape": ref[:5]}[bad]
    abs_err, rel = measure.max_errors([got], [ref])
    assert np.isnan(abs_err) and np.isnan(rel)


def test_time_calls_warms_up_then_times_each_run() -> None:
    calls: list[int] = []
    times = measure.time_calls(lambda: calls.append(1), runs=4, warmup=3)
    assert len(calls) == 7 and len(times) == 4 and all(t >= 0 for t in times)


def test_ms() -> None:
    assert measure.ms(0.00125) == "1.25 ms" and measure.ms(2) == "2000.00 ms"


def test_synced_run_waits_for_the_stream() -> None:
    events: list[str] = []

    class Stream:
        def synchronize(self) -> None:
            events.append("sync")

    class Delegate:
        stream = Stream()

        def run(self, *inputs: Any) -> tuple:
            events.append(f"run{len(inputs)}")
            return ("out",)

    assert measure.synced_run(Delegate(), [1, 2]) == ("out",)
    assert events == ["run2", "sync"]
