"""Shared test setup: hazard checking on, an isolated kernel cache, and per-test streams and
owners on every device present (cpu always, cuda where a GPU is).

The environment is set before anything imports aotrt, so every stream the tests create
(the default stream included) checks hazards, and no test reads or pollutes ~/.cache/aotrt.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile

os.environ["AOTRT_CHECK_HAZARDS"] = "1"
# AOTRT_TEST_CACHE_DIR keeps compiled kernels across runs (mutation testing runs the suite
# hundreds of times); otherwise every session compiles into a fresh directory of its own.
_KEEP_CACHE = os.environ.get("AOTRT_TEST_CACHE_DIR")
_CACHE = _KEEP_CACHE or tempfile.mkdtemp(prefix="aotrt-test-cache-")
os.environ["AOTRT_CACHE_DIR"] = _CACHE

from typing import Iterator  # noqa: E402

import pytest  # noqa: E402

from aotrt.runtime.device import Device, Stream, StreamOptions, cuda_available  # noqa: E402
from aotrt.runtime.device import get_device  # noqa: E402
from aotrt.runtime.memory import Owner, owner_scope  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA device here"),
])]
STREAM_MODES = ["async", "deferred"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (torch, transformers, every test module: some 400,000
    objects): the tests' gc.collect() calls and the collector's full passes then walk only
    what tests made since (six runtime and model files on 2 cores: 16 s in the collector
    before, 3 s after). Nothing a test frees was made before its run, so nothing it checks
    is frozen; frozen objects still go when their last reference does."""
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test module's last test and its fixtures: collect, then freeze what is left
    (the module caches of programs and models), which later tests never free. With only the
    freeze above, the CI slice still spent 150 s in 300 full collections."""
    yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove this session's private kernel cache."""
    if not _KEEP_CACHE:
        shutil.rmtree(_CACHE, ignore_errors=True)


def make_stream(dev: Device, mode: str) -> Stream:
    """A new hazard-checked stream: 'async' runs on commit, 'deferred' runs only at a wait."""
    return dev.create_stream(StreamOptions(deferred=mode == "deferred", check_hazards=True))


@pytest.fixture(params=DEVICES)
def dev(request: pytest.FixtureRequest) -> Device:
    """Each device present."""
    return get_device(request.param)


@pytest.fixture
def cpu(request: pytest.FixtureRequest) -> Device:
    """The cpu device, for tests that use host addresses (regions, host_array).

    In a test that is also parametrized over devices it runs only with the cpu one: its
    stream and owner fixtures would otherwise belong to another device.
    """
    if "dev" in request.fixturenames and request.getfixturevalue("dev").name != "cpu":
        pytest.skip("host-memory test: cpu device only")
    return get_device("cpu")


@pytest.fixture(params=STREAM_MODES)
def stream(dev: Device, request: pytest.FixtureRequest) -> Iterator[Stream]:
    """A fresh hazard-checked stream, current for the test; closed (and so purged) after."""
    s = make_stream(dev, request.param)
    with dev.stream_guard(s):
        yield s
    s.close()


@pytest.fixture
def owner(dev: Device, stream: Stream) -> Iterator[Owner]:
    """An Owner scope per test, closed at teardown, which checks that nothing leaked.

    Before the close the test must have deleted every handle it made (owner.handles is
    empty); after it no allocation of the owner may be live (constants go with the close;
    memory that no handle and no owner list holds would stay).
    """
    o = Owner("test")
    with owner_scope(o):
        yield o
    leaks = [f"live handle {h!r}" for h in o.handles]
    o.close()
    leaks += [f"live allocation {a!r}" for a in dev.memory.live() if a.owner is o]
    if leaks:
        pytest.fail("test leaked:\n  " + "\n  ".join(leaks), pytrace=False)
