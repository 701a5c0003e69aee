"""aotrt/settings.py: the environment variables are read there and nowhere else."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from aotrt import settings

ROOT = Path(__file__).resolve().parents[1] / "aotrt"


def test_env_reads_each_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "yes")
    monkeypatch.setenv("AOTRT_POOL_MB", "12")
    monkeypatch.setenv("AOTRT_FLUSH_INTERVAL", "3")
    monkeypatch.setenv("AOTRT_CACHE_DIR", "/tmp/x")
    monkeypatch.setenv("AOTRT_CC_SANITIZE", " address ")
    monkeypatch.setenv("CC", "clang")
    e = settings.env()
    assert (e.check_hazards, e.pool_mb, e.flush_interval, e.cache_dir, e.cc_sanitize,
            e.cc) == (True, "12", "3", "/tmp/x", "address", "clang")


@pytest.mark.parametrize("value,on", [("0", False), ("", False), ("false", False),
                                      ("No", False), ("1", True), ("true", True)])
def test_flags(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", value)
    assert settings.env().check_hazards is on


def test_unset_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AOTRT_POOL_MB", "AOTRT_FLUSH_INTERVAL", "AOTRT_CACHE_DIR", "CC"):
        monkeypatch.delenv(name, raising=False)
    e = settings.env()
    assert (e.pool_mb, e.flush_interval, e.cache_dir, e.cc) == (None, None, None, "cc")


def test_no_other_module_reads_the_environment() -> None:
    """os.environ / os.getenv reads appear only in settings.py (setdefault, which sets a
    default for a library the process loads, is a write)."""
    readers = []
    for path in ROOT.rglob("*.py"):
        if path.name == "settings.py":
            continue
        tree = ast.parse(path.read_text())
        writes = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr == "setdefault"}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                    and id(node) not in writes):
                readers.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not readers, readers


def test_default_library_env_sets_all_or_none(monkeypatch) -> None:
    """A library's defaults go in together, and not at all once the process set one."""
    from aotrt import settings

    monkeypatch.delenv("AOTRT_TEST_A", raising=False)
    monkeypatch.delenv("AOTRT_TEST_B", raising=False)
    settings.default_library_env({"AOTRT_TEST_A": "1", "AOTRT_TEST_B": "2"})
    assert (os.environ["AOTRT_TEST_A"], os.environ["AOTRT_TEST_B"]) == ("1", "2")
    monkeypatch.delenv("AOTRT_TEST_B")
    monkeypatch.setenv("AOTRT_TEST_A", "mine")
    settings.default_library_env({"AOTRT_TEST_A": "1", "AOTRT_TEST_B": "2"})
    assert os.environ["AOTRT_TEST_A"] == "mine" and "AOTRT_TEST_B" not in os.environ
