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
