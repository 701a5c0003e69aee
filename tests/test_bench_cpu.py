"""bench/bench_cpu.py's pass combining: the table's figure is the median pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_cpu", ROOT / "bench" / "bench_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_passes_combine_to_their_median(bench) -> None:
    runs = [{"ok": True, "ms": 5.0, "load_s": 1.0}, {"ok": True, "ms": 4.0, "load_s": 2.0},
            {"ok": True, "ms": 9.0, "load_s": 3.0}]
    got = bench.combine(runs)
    assert got["ms"] == 5.0 and got["load_s"] == 1.0 and got["passes_ms"] == [5.0, 4.0, 9.0]
    two = bench.combine(runs[:2])
    assert two["ms"] == 4.5 and two["passes_ms"] == [5.0, 4.0]
    assert bench.combine([runs[0]])["ms"] == 5.0


def test_a_failed_pass_fails_the_runner(bench) -> None:
    bad = {"ok": False, "error": "timed out"}
    assert bench.combine([{"ok": True, "ms": 1.0}, bad]) is bad
