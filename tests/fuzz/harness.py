"""Run mutants in subprocess workers and classify each outcome.

Outcomes: refused (an AotrtError at load or run that wraps no Python exception), ran_equal,
ran_different, raw_exception
(any other exception), crash (the worker died of a signal), hang (over the per-mutant
timeout), sanitizer (an AddressSanitizer/UBSan report), plus loaded_not_run (inputs the
harness cannot make) and ran_unchecked (the reference cannot judge: too big, an op it does
not model). A dead or hung worker is replaced and the harness goes on.

    python -m tests.fuzz.harness --worker      # the worker loop (stdin/stdout, JSON lines)
"""

from __future__ import annotations

import base64
import builtins
import faulthandler
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

OUTCOMES = ("refused", "ran_equal", "ran_different", "raw_exception", "crash", "hang",
            "sanitizer", "loaded_not_run", "ran_unchecked")
BAD = ("ran_different", "raw_exception", "crash", "hang", "sanitizer")
INPUT_LIMIT = 16 << 20
ROOT = Path(__file__).resolve().parents[2]
#: with AOTRT_FUZZ_PROBES=1 a worker dies of SIGSEGV on this job, or sleeps on the next one:
#: the harness's own tests use them to see crashes and hangs counted
CRASH_PROBE = b"aotrt-fuzz-probe:crash"
HANG_PROBE = b"aotrt-fuzz-probe:hang"
SAN_PROBE = b"aotrt-fuzz-probe:heap-overflow"


def make_inputs(prog: Any, seed: int) -> list[np.ndarray] | None:
    """Fresh random inputs for a program's input specs (None when too big to make)."""
    from aotrt import dtypes

    rng = np.random.default_rng(seed)
    out = []
    for spec in prog.inputs:
        dt = dtypes.as_dtype(spec["dtype"])
        shape = tuple(spec["shape"])
        n = int(np.prod(shape, dtype=object)) if shape else 1
        if n * dt.itemsize > INPUT_LIMIT:
            return None
        if dt.name == "bool":
            raw = rng.choice(np.array([0, 1, 1, 2, 200, 255], np.uint8), size=n)
            arr = raw.view(np.bool_).reshape(shape)
        elif dt.name in ("float32", "float16", "bfloat16"):
            f = rng.standard_normal(n) * 3
            special = rng.random(n)
            f = np.where(special < 0.03, np.nan, f)
            f = np.where((special > 0.03) & (special < 0.05), -0.0, f)
            f = np.where((special > 0.05) & (special < 0.06), np.inf, f)
            f = np.where((special > 0.06) & (special < 0.07), 1e30, f)
            arr = f.astype(dt.np).reshape(shape)
        else:
            info = np.iinfo(dt.np)
            edges = np.array([0, 1, -1, info.min, info.max, info.min + 1, info.max - 1],
                             np.int64)
            small = rng.integers(-9, 10, size=n)
            pick = rng.random(n)
            edge = edges[rng.integers(0, len(edges), size=n)]
            v = np.where(pick < 0.12, edge, np.where(small == 0, 1 + rng.integers(0, 3, n),
                                                     small))
            v = np.where(pick > 0.985, 0, v)
            arr = np.asarray(v).astype(dt.np).reshape(shape)
        out.append(arr)
    return out


def size_points(m: Any) -> list[dict[str, int] | None]:
    """The sizes a method runs at: None (as stored) for a static one; for a dynamic one its
    upper bounds (as stored), its lower bounds and every symbol halfway between."""
    if not m.symbols:
        return [None]
    lo = {s["name"]: s["min"] for s in m.symbols}
    hi = {s["name"]: s["max"] for s in m.symbols}
    mid = {n: (lo[n] + hi[n]) // 2 for n in lo}
    points: list[dict[str, int] | None] = [None]
    for p in (lo, mid):
        if p != hi and p not in points:
            points.append(p)
    return points


def wrapped(e: BaseException) -> str:
    """The name of a Python exception that a refusal's message carries ("" if none): an
    aotrt error wrapping, say, "AttributeError: 'Idx' object has no attribute 'mode'" hid a
    bug of aotrt behind a refusal; the harness counts it as a raw exception."""
    for name in re.findall(r"\b([A-Z][A-Za-z]*(?:Error|Exception))\b", str(e)):
        cls = getattr(builtins, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return name
    return ""


def _refused(e: BaseException, stage: str, detail: str) -> dict[str, Any]:
    name = wrapped(e)
    if name:
        return {"outcome": "raw_exception", "stage": stage,
                "detail": f"a refusal wrapping {name}: {detail}"[:300]}
    return {"outcome": "refused", "stage": stage, "detail": detail[:200]}


def judge(data: bytes, seed: int) -> dict[str, Any]:
    """Load and run one mutant on cpu and compare it with the reference (in this process)."""
    import aotrt
    from aotrt.errors import AotrtError
    from aotrt.program.symbols import instantiate
    from tests.fuzz import reference as R

    res: dict[str, Any] = {"outcome": "", "detail": ""}
    try:
        prog = aotrt.Program.loads(data)
    except AotrtError as e:
        return _refused(e, "parse", str(e))
    except Exception as e:  # noqa: BLE001 - the finding itself
        return {"outcome": "raw_exception", "stage": "parse",
                "detail": f"{type(e).__name__}: {e}"[:300] + _tb()}
    # A program with state or several methods runs every method in the file's order, twice
    # (the second round reads the state the first left); the reference follows the same
    # runs, and the state is compared at the end.
    names = list(prog.methods)
    stateful = bool(prog.state) or prog.has_methods
    plan = []
    for j, name in enumerate(names * (2 if stateful else 1)):
        # a dynamic method runs at its upper bounds, its lower bounds and a size between
        for k, sizes in enumerate(size_points(prog.method(name))):
            meth = prog.method(name) if sizes is None else instantiate(prog.method(name), sizes)
            inputs = make_inputs(meth, seed + 7919 * j + 104729 * k)
            if inputs is None:
                return {"outcome": "loaded_not_run", "detail": "inputs too big"}
            plan.append((name, sizes, inputs))
    stage = "load"
    runs = []
    try:
        with aotrt.load(prog, device="cpu") as m:
            stage = "run"
            for name, _, inputs in plan:
                outs = (m.method(name) if prog.has_methods else m).run(*inputs)
                runs.append([np.array(np.asarray(o)) for o in outs])
            states = [np.array(np.asarray(m.state[s["name"]])) for s in prog.state]
    except AotrtError as e:
        return _refused(e, stage, f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - the finding itself
        return {"outcome": "raw_exception", "stage": stage,
                "detail": f"{type(e).__name__}: {e}"[:300] + _tb()}
    try:
        ref = R.Reference(prog)
        diffs = []
        for j, ((name, sizes, inputs), got) in enumerate(zip(plan, runs)):
            diff = R.compare(ref.run(inputs, name, sizes), got)
            if diff:
                at = "" if sizes is None else f" at {sizes}"
                diffs.append(f"run {j} ({name}{at}): {diff}" if stateful or at else diff)
                break
        if not diffs and states:
            diff = R.compare(ref.state_values(), states)
            if diff:
                diffs.append(f"state after {len(plan)} runs: {diff.replace('output', 'state')}")
    except R.RefRefusal as e:
        return {"outcome": "ran_different", "stage": "reference",
                "detail": f"runtime ran, but the reference refuses: {e}"[:300]}
    except R.RefUnchecked as e:
        return {"outcome": "ran_unchecked", "detail": str(e)[:200]}
    except Exception as e:  # noqa: BLE001 - a harness bug, reported as such
        return {"outcome": "raw_exception", "stage": "reference-bug",
                "detail": f"{type(e).__name__}: {e}"[:300] + _tb()}
    res["outcome"] = "ran_different" if diffs else "ran_equal"
    res["detail"] = diffs[0] if diffs else ""
    return res


def _tb() -> str:
    return " | " + " <- ".join(f"{Path(f.filename).name}:{f.lineno}"
                               for f in traceback.extract_tb(sys.exc_info()[2])[-4:])


def _overflow() -> None:
    """Read 8 bytes past a 16-byte malloc block (memmove is checked by ASan)."""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    p = libc.malloc(16)
    buf = ctypes.create_string_buffer(8)
    ctypes.memmove(buf, p + 16, 8)


#: seconds after which a worker dumps its threads' stacks for the mutant it still runs
STACKS_AFTER_S = 45.0


def worker_main() -> None:
    """Read {"id", "data", "seed"} lines on stdin, write {"id", ...result} lines."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)       # anything else printed to stdout goes to the log, not the protocol
    if os.environ.get("AOTRT_FUZZ_RLIMIT_AS"):
        import resource
        lim = int(os.environ["AOTRT_FUZZ_RLIMIT_AS"])
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    import aotrt  # noqa: F401 - import once, before the first mutant
    for line in sys.stdin:
        msg = json.loads(line)
        t0 = time.perf_counter()
        data = base64.b64decode(msg["data"])
        if os.environ.get("AOTRT_FUZZ_PROBES") == "1" and data == CRASH_PROBE:
            os.kill(os.getpid(), signal.SIGSEGV)
        if os.environ.get("AOTRT_FUZZ_PROBES") == "1" and data == HANG_PROBE:
            time.sleep(3600)
        if os.environ.get("AOTRT_FUZZ_PROBES") == "1" and data == SAN_PROBE:
            _overflow()
        # A mutant still running after this long leaves every thread's stack in the log,
        # so that a timeout says where it was stuck (the runtime or the harness).
        faulthandler.dump_traceback_later(STACKS_AFTER_S, exit=False)
        r = judge(data, msg["seed"])
        faulthandler.cancel_dump_traceback_later()
        r["id"] = msg["id"]
        r["seconds"] = round(time.perf_counter() - t0, 4)
        out.write(json.dumps(r) + "\n")


def sanitizer_env(env: dict[str, str]) -> dict[str, str]:
    """Contract C5: ASan+UBSan kernels, libasan preloaded, leaks off."""
    lib = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True,
                         text=True).stdout.strip()
    env = dict(env)
    env["AOTRT_CC_SANITIZE"] = "address,undefined"
    env["LD_PRELOAD"] = lib
    env["ASAN_OPTIONS"] = ("detect_leaks=0:allocator_may_return_null=1:abort_on_error=0:"
                           "max_allocation_size_mb=4096:handle_segv=1")
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    return env


class Worker:
    """One subprocess running `worker_main`, its stderr in a log file."""

    def __init__(self, env: dict[str, str], log_dir: Path, n: int) -> None:
        self.log = log_dir / f"worker-{n}-{time.monotonic_ns()}.log"
        self.logf = open(self.log, "wb")
        self.p = subprocess.Popen([sys.executable, "-m", "tests.fuzz.harness", "--worker"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.logf, env=env, cwd=ROOT)
        self.busy: dict[str, Any] | None = None
        self.t0 = 0.0
        self.buf = b""

    def send(self, job: dict[str, Any]) -> None:
        """Hand one mutant to the worker."""
        self.busy = job
        self.t0 = time.monotonic()
        msg = {"id": job["id"], "seed": job["seed"], "data": base64.b64encode(
            job["data"]).decode()}
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    def stop(self) -> None:
        """Kill this worker (only this process)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self.logf.close()

    def log_tail(self, start: int = 0) -> str:
        """The end of the worker's stderr."""
        self.logf.flush()
        try:
            return self.log.read_bytes()[start:][-4000:].decode("utf-8", "replace")
        except OSError:
            return ""


def run_jobs(jobs: Iterable[dict[str, Any]], workers: int = 2, timeout: float = 30.0,
             sanitize: bool = False, log_dir: Path | None = None,
             env: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Judge every job ({"id", "seed", "data", ...}) in `workers` subprocesses; yield results."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if sanitize:
        env = sanitizer_env(env)
    else:
        env.setdefault("AOTRT_FUZZ_RLIMIT_AS", str(8 << 30))
    log_dir = Path(log_dir or "/tmp")
    log_dir.mkdir(parents=True, exist_ok=True)
    it = iter(jobs)
    pool = [Worker(env, log_dir, n) for n in range(workers)]
    done = False
    try:
        while True:
            for w in pool:
                if w.busy is None and not done:
                    job = next(it, None)
                    if job is None:
                        done = True
                    else:
                        w.log_pos = w.logf.tell() if not w.logf.closed else 0
                        w.send(job)
            active = [w for w in pool if w.busy is not None]
            if not active:
                return
            ready, _, _ = select.select([w.p.stdout for w in active], [], [], 0.2)
            now = time.monotonic()
            for i, w in enumerate(pool):
                if w.busy is None:
                    continue
                res = None
                if w.p.stdout in ready:
                    chunk = os.read(w.p.stdout.fileno(), 1 << 20)
                    if chunk:
                        w.buf += chunk
                        if b"\n" in w.buf:
                            line, w.buf = w.buf.split(b"\n", 1)
                            res = json.loads(line)
                            w.busy = None
                    else:
                        res = _death(w)
                        pool[i] = Worker(env, log_dir, i)
                if res is None and w.busy is not None and now - w.t0 > timeout:
                    job = w.busy
                    stacks = w.log_tail()[-1500:]
                    w.stop()
                    res = {"id": job["id"], "outcome": "hang",
                           "detail": f"no answer within {timeout} s",
                           "stacks": stacks}
                    pool[i] = Worker(env, log_dir, i)
                if res is not None:
                    yield res
    finally:
        for w in pool:
            w.stop()


def _death(w: Worker) -> dict[str, Any]:
    job = w.busy
    w.p.wait()
    rc = w.p.returncode
    tail = w.log_tail()
    try:        # the report's first line may be far above the tail (long stacks)
        whole = w.log.read_bytes()[-(1 << 20):].decode("utf-8", "replace")
    except OSError:
        whole = tail
    if "AddressSanitizer" in whole or "runtime error:" in whole or "UndefinedBehavior" in whole:
        outcome = "sanitizer"
    else:
        outcome = "crash"
    w.logf.close()
    lines = [ln for ln in whole.splitlines() if ln.strip()]
    key = next((ln for ln in lines if "ERROR: AddressSanitizer" in ln or "runtime error" in ln),
               lines[-1] if lines else "")
    return {"id": job["id"], "outcome": outcome, "detail": f"exit {rc}: {key[:300]}",
            "log": str(w.log)}


def table(counts: dict[str, int]) -> str:
    """The outcome counts as a markdown table."""
    rows = ["| outcome | count |", "|---|---|"]
    rows += [f"| {k} | {counts.get(k, 0)} |" for k in OUTCOMES]
    rows.append(f"| total | {sum(counts.values())} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_main()
