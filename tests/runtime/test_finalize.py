"""Tests for aotrt/runtime/finalize.py: collector-started finalizers never deadlock a stream.

The campaign of issue 7 saw rare 60 s hangs: the garbage collector ran a Tensor's or a
Delegate's finalizer on a cpu stream's worker thread while the main thread, holding the
memory lock, waited for that worker. These tests force the collector onto the worker.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from aotrt.runtime import finalize

REPO = Path(__file__).resolve().parents[2]

# The collector runs on the delegate's worker (a queued gc.collect) while the main thread
# frees memory that waits for that worker: before the fix, every run of this hung.
_SCRIPT = textwrap.dedent("""
    import gc, sys, faulthandler
    faulthandler.dump_traceback_later(50, exit=True)
    import numpy as np
    import aotrt
    from aotrt.runtime import finalize
    from tests.runtime.test_delegate import seed_program
    from tests.support import rand

    what = sys.argv[1]
    a = aotrt.load(seed_program(module="A"))
    x = rand([12, 7], seed=1)
    outs = a.run(x)

    class Cycle:
        pass

    c = Cycle()
    c.me = c
    if what == "tensor":
        c.t = outs[0]
        owner = None
    else:
        b = aotrt.load(seed_program(module="B"))
        b.run(x)
        c.d, owner = b, b.owner
        del b
    del outs, c
    gc.disable()
    a.stream.record([], gc.collect, "collect on the worker")
    out2 = a.run(x)
    a.stream.commit_and_wait()
    finalize.drain()
    assert owner is None or owner.closed
    print("ok", float(np.abs(np.asarray(out2[0])).sum()) > 0)
    a.close()
""")


@pytest.mark.parametrize("what", ["tensor", "delegate"])
def test_collector_on_worker_thread_does_not_deadlock(what: str, tmp_path: Path) -> None:
    script = tmp_path / "collect_on_worker.py"
    script.write_text(_SCRIPT)
    r = subprocess.run([sys.executable, str(script), what], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok True"


def test_run_or_defer_runs_inline_off_worker_threads() -> None:
    seen: list[str] = []
    finalize.run_or_defer(lambda: seen.append(threading.current_thread().name))
    assert seen == [threading.current_thread().name]


def test_run_or_defer_hands_worker_calls_to_the_reaper() -> None:
    seen: list[str] = []
    done = threading.Event()

    def worker() -> None:
        finalize.mark_worker_thread()
        assert finalize.on_worker_thread()
        finalize.run_or_defer(lambda: seen.append(threading.current_thread().name))
        done.set()

    t = threading.Thread(target=worker, name="fake-worker")
    t.start()
    t.join(10)
    assert done.is_set()
    finalize.drain()
    assert seen == ["aotrt-reaper"]
    assert not finalize.on_worker_thread()


def test_finalizer_explicit_call_runs_once_and_at_once() -> None:
    class Obj:
        pass

    calls: list[int] = []
    o = Obj()
    f = finalize.finalizer(o, calls.append, 1)
    f()
    f()
    assert calls == [1]
    del o
    gc.collect()
    assert calls == [1]


def test_reaper_survives_a_failing_finalizer(caplog: pytest.LogCaptureFixture) -> None:
    reaper = finalize.Reaper()
    out: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    reaper.submit(boom, ())
    reaper.submit(out.append, (7,))
    reaper.drain()
    assert out == [7]
    assert "boom" in caplog.text
