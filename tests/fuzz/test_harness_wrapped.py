"""tests/fuzz/harness.py counts a refusal that wraps a Python exception as a raw exception
(issue 34 item 5): such a message hid a bug of aotrt behind a clean refusal."""

from __future__ import annotations

from typing import Any

import pytest

from aotrt.errors import InvalidArgument, ProgramError
from tests.fuzz import harness as H


@pytest.mark.parametrize("msg,name", [
    ("kernels[0]: invalid kernel IR: AttributeError: 'Idx' object has no attribute 'mode'",
     "AttributeError"),
    ("invalid program: TypeError: '<=' not supported", "TypeError"),
    ("invalid kernel IR: RecursionError: maximum recursion depth exceeded", "RecursionError"),
    ("kernels[0]: invalid kernel IR: IR node Idx.dim: expected an integer, got str", ""),
    ("instructions[3] (copy).dst: tensor 9 is a view of an input", ""),
])
def test_wrapped_names_the_python_exception(msg: str, name: str) -> None:
    assert H.wrapped(ProgramError(msg)) == name


def test_judge_counts_a_wrapped_refusal_as_raw(monkeypatch: Any) -> None:
    import aotrt

    def loads(data: bytes) -> Any:
        raise ProgramError("<bytes>: kernels[0]: invalid kernel IR: AttributeError: 'Idx' "
                           "object has no attribute 'mode'")

    monkeypatch.setattr(aotrt.Program, "loads", staticmethod(loads))
    r = H.judge(b"x", 0)
    assert r["outcome"] == "raw_exception" and "AttributeError" in r["detail"]

    def refuse(data: bytes) -> Any:
        raise InvalidArgument("inputs[0]: expected float32")

    monkeypatch.setattr(aotrt.Program, "loads", staticmethod(refuse))
    assert H.judge(b"x", 0)["outcome"] == "refused"
