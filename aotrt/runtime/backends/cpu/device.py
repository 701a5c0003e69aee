"""The cpu device: 64-byte aligned host memory, an asynchronous stream on a worker thread,
C kernels compiled by the system compiler (cached on disk), oneDNN (convolutions) and numpy
for library ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from aotrt import settings
from aotrt import progress
from aotrt.errors import CompileError, InvalidArgument, OutOfMemory
from aotrt.kernels import ir
from aotrt.kernels.render_c import CRenderer
from aotrt.runtime import finalize, hazards
from aotrt.runtime.device import (Block, Device, KernelFunction, KernelLibrary, Stream,
                                  StreamOptions)
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.libraries import CpuLibraries, OpenMP
from aotrt.runtime.backends.cpu.library import LoadedLibrary  # noqa: F401 - its home was here
from aotrt.runtime.backends.cpu.stream import CpuStream, Worker
# host_array lives beside Handle; the ops import it from here, as they always have.
from aotrt.runtime.disk_cache import DiskCache
from aotrt.runtime.tensor import Handle, host_array, physical_memory  # noqa: F401
from aotrt.runtime.work import Work

log = logging.getLogger(__name__)

# -fwrapv and -fno-strict-aliasing: the bounds proof assumes wrapping int64 arithmetic, and
# the optimizer must not delete a clamp after an overflow it may assume away. -fopenmp: the
# rendered kernels split their outer range across threads (render_c.CRenderer).
# -ffp-contract=off: no fused multiply-add where the source has a multiply and an add, so a
# kernel rounds the same on every CPU, with or without FMA units (as without -march).
CFLAGS = ("-O3", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-fwrapv",
          "-fno-strict-aliasing", "-fopenmp", "-ffp-contract=off")
#: the vector units of the CPU this runs on; only used when the cache key holds the CPU's
#: features (KernelCache.key), so a library built here never runs on another CPU
NATIVE_FLAGS = ("-march=native",)
#: gcc only: a loop whose loads might alias its stores is vectorised behind run-time overlap
#: checks, at most 10 of them by default; YOLO's 5x5 SPPF max pool (25 loads) then stayed
#: scalar, 300 us a pool where the 3x3 one (9 loads) vectorised. The checks only choose
#: between two versions of the same loop, so the results are unchanged.
GCC_FLAGS = ("--param=vect-max-version-for-alias-checks=64",)
#: OpenMP settings the device asks for unless the process set either: the runtime reads
#: them once, when the first kernel library loads it. A pool thread spins briefly when a
#: parallel region ends, then sleeps. Not for milliseconds (libgomp's default, 300,000
#: spins): on a core the next library op (numpy's BLAS threads) or another process needs,
#: that doubled the CPU time of a resnet18 run (bench/results/cpu/cpu-threads-2026-12-02.md).
#: Not at once either (a passive policy alone): waking the pool cost each oneDNN
#: convolution about 50 us, a tiny one 95 against 10 us, MobileNet-v2 7.2-7.7 against
#: 3.8-4.9 ms a run and YOLOv8n 14.8-15.2 against 11.0-11.1, at the same CPU time (2 cores,
#: AVX-512, 2026-12-03).
OPENMP_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "30000"}


class CpuKernelFunction(KernelFunction):
    """A C function `k(char **P, int64_t begin, int64_t end, int64_t threads)` (ctypes)."""

    def __init__(self, library: "CpuKernelLibrary", kernel: ir.Kernel) -> None:
        super().__init__(library, kernel)
        self._symbol = library.symbol(kernel.name)
        library.loaded.function(self._symbol)     # look it up now: a missing one fails here

    def _work(self, bound: list[Handle], n: int) -> Any:
        return self._work_addresses([h.address for h in bound], n)

    def _work_addresses(self, addrs: list[int], n: int) -> Any:
        ptrs = (ctypes.c_void_p * max(len(addrs), 1))(*addrs)
        # The work holds the loaded library, never a ctypes function: a call after close
        # is refused instead of jumping into unmapped code. It holds the library object too,
        # so the garbage collector never closes a library whose work is still queued.
        library, symbol, label = self.library, self._symbol, self.name
        worker = library.device.worker

        def work() -> None:
            library.loaded.call(symbol, label, ptrs, n, getattr(worker, "threads", 1))

        return Work(work, native=lambda: cpu_native.kernel(
            library.loaded, symbol, label, ptrs, n, getattr(worker, "threads", 1)))


class CpuKernelLibrary(KernelLibrary):
    """C source compiled to a shared library once per (compiler, flags, source)."""

    def _compile(self) -> None:
        self.path = self.device.cache.build_so(self.source, self.exported(), len(self.kernels))
        try:
            self.loaded = LoadedLibrary(self.path)
        except OSError as e:
            # A verified entry that still does not load: rebuild it once, then give up.
            log.warning("kernel cache: %s does not load (%s); rebuilding", self.path, e)
            self.path = self.device.cache.build_so(self.source, self.exported(),
                                                   len(self.kernels), force=True)
            try:
                self.loaded = LoadedLibrary(self.path)
            except OSError as e2:
                raise CompileError(f"cannot load the kernel library {self.path}: {e2}") from None
        self.device.openmp.pin()
        self._closer = finalize.finalizer(self, self.loaded.close)
        # At exit a daemon stream may still run a kernel: unmapping then buys nothing.
        self._closer.atexit = False

    def exported(self) -> list[str]:
        """The names the library exports: each kernel's symbol and the error flag."""
        return [*(self.symbol(n) for n in self.kernels), "aotrt_error"]

    def _function(self, kernel: ir.Kernel) -> KernelFunction:
        return CpuKernelFunction(self, kernel)

    def _close(self) -> None:
        self._closer()


def compile_flags() -> tuple[str, ...]:
    """CFLAGS, plus AddressSanitizer/UBSan flags when AOTRT_CC_SANITIZE is set (tests)."""
    san = settings.env().cc_sanitize
    if not san:
        return CFLAGS
    if not re.fullmatch(r"[a-z]+(,[a-z]+)*", san):
        raise InvalidArgument(f"AOTRT_CC_SANITIZE: expected names like 'address,undefined', "
                              f"got {san!r}")
    return (*CFLAGS, f"-fsanitize={san}", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-g")


class KernelCache(DiskCache):
    """C compiled to shared libraries, cached on disk (DiskCache) by compiler, flags, the
    CPU's features and source."""

    def __init__(self) -> None:
        super().__init__()
        self._features: dict[str, str | None] = {}     # per compiler: cpu_features()

    def features(self, cc: str) -> str | None:
        """What -march=native means to compiler `cc` on this CPU (None: not supported)."""
        with self._lock:
            if cc not in self._features:
                self._features[cc] = cpu_features(cc)
            return self._features[cc]

    def key(self, cc: str, source: str, exported: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """(cache key, compiler flags) of building `source` with `cc` on this CPU.

        -march=native is used only with the CPU's features in the key: a library built for
        one CPU's vector units is never loaded on another.
        """
        flags = compile_flags()
        if "Free Software Foundation" in _compiler_version(cc):     # gcc, not clang
            flags = (*flags, *GCC_FLAGS)
        features = self.features(cc)
        if features is not None:
            flags = (*flags, *NATIVE_FLAGS)
        key = hashlib.sha256("\0".join([_compiler_version(cc), *flags, features or "",
                                        version_script(exported), source])
                             .encode()).hexdigest()
        return key, flags

    def build_so(self, source: str, exported: Sequence[str], count: int,
                 force: bool = False) -> Path:
        """The verified shared library of C `source` exporting only `exported`."""
        cc = shutil.which(settings.env().cc) or shutil.which("gcc")
        if cc is None:
            raise CompileError("no C compiler found (set CC)")
        key, flags = self.key(cc, source, exported)
        script = version_script(exported)
        name = f"{key[:32]}.so"
        if not force and self.read(name) is not None:
            return self.root() / name
        root = self.writable_root()
        try:
            with tempfile.TemporaryDirectory(dir=root) as tmp:
                src = Path(tmp) / "k.c"
                src.write_text(source)
                (Path(tmp) / "k.map").write_text(script)
                so = Path(tmp) / "k.so"
                with progress.step(f"compiling {count} kernel(s) with {Path(cc).name}"):
                    proc = subprocess.run([cc, *flags, f"-Wl,--version-script={tmp}/k.map",
                                           str(src), "-o", str(so), "-lm"],
                                          capture_output=True, text=True)
                if proc.returncode != 0:
                    raise CompileError(f"{cc} failed on {count} kernel(s)",
                                       proc.stderr + proc.stdout)
                self.write(root / name, so)
        except OSError as e:
            raise CompileError(f"kernel cache directory {str(root)!r}: cannot write "
                               f"{name}: {e}") from None
        log.debug("compiled %d kernels into %s", count, root / name)
        return root / name


def version_script(exported: Sequence[str]) -> str:
    """The linker version script exporting only `exported`."""
    return "{ global: " + " ".join(f"{s};" for s in exported) + " local: *; };\n"


def cpu_features(cc: str) -> str | None:
    """The target options `cc -march=native` selects here (the CPU's features as that
    compiler sees them), or None when it cannot say (no -march=native then)."""
    try:
        proc = subprocess.run([cc, "-march=native", "-Q", "--help=target"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or "-march=" not in proc.stdout:
        return None
    return proc.stdout


_versions: dict[str, str] = {}


def _compiler_version(cc: str) -> str:
    if cc not in _versions:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True)
        _versions[cc] = cc + "\n" + proc.stdout
    return _versions[cc]


class CpuDevice(Device):
    """Host memory and host execution behind the device protocol.

    It owns, each as one object: `libraries`, what the library ops keep between calls
    (oneDNN, the ops' own compiled C, the native plans' C loop); `openmp`, the OpenMP
    runtime they run on; `worker`, the calling thread's state as a stream's worker (its
    kernel thread count, the library ops' scratch).
    """

    name = "cpu"
    host_addressable = True
    dlpack_type = 1     # kDLCPU
    renderer = CRenderer()

    def __init__(self) -> None:
        super().__init__()
        self.cache = KernelCache()
        self.openmp = OpenMP()
        self.libraries = CpuLibraries(self)
        # Per thread: the thread count of the stream whose worker it is (CpuStream), scratch.
        self.worker = Worker()
        settings.default_library_env(OPENMP_ENV)

    def prefers_channels_last(self, dtype: str) -> bool:
        """With oneDNN, in every dtype: its convolutions run NHWC on the views themselves,
        while NCHW goes through blocked copies of every activation (resnet18 86 against 139
        ms, mobilenet_v2 44 against 66: bench/results/cpu/cpu-speed-2026-12-02.md). numpy's path
        prefers NCHW."""
        return self.libraries.dnnl is not None

    def native_plan(self, works: Sequence[tuple[str, Callable[[], None]]]) -> Any:
        """A runner of a static plan's works (label, work) that calls the ones with a
        native form from one C loop (backends/cpu/native.py); None where none has one."""
        runner = self.libraries.native_runner()
        plan = cpu_native.NativePlan(runner, works,
                                     lambda: getattr(self.worker, "threads", 1))
        log.debug("native plan: %d steps in %d segments", plan.steps, plan.segments)
        return plan if plan.steps else None

    def native_moves(self, slot: Any, moves: Sequence[tuple[int, int, int]]) -> Any:
        """The memmoves' native form: MOVE_AT steps of the C loop."""
        return cpu_native.moves_to(slot, moves)

    def _create_stream(self, options: StreamOptions) -> Stream:
        return CpuStream(self, options)

    def _alloc(self, nbytes: int) -> Block:
        if nbytes > physical_memory():
            # Where the kernel overcommits, numpy's allocation would succeed and the first
            # touch (the arena's zero fill at load) would get the process killed.
            raise OutOfMemory(f"cpu: cannot allocate {nbytes} bytes: more than this machine's "
                              f"{physical_memory()} bytes of memory")
        try:
            raw = np.empty(nbytes + 64, dtype=np.uint8)
        except MemoryError:
            raise OutOfMemory(f"cpu: cannot allocate {nbytes} bytes") from None
        base = raw.ctypes.data
        ptr = (base + 63) // 64 * 64
        return Block(ptr, nbytes, raw)

    def _free(self, block: Block) -> None:
        # The numpy buffer in block.keep is released with the last reference to the block.
        pass

    def _library(self, kernels: Sequence[ir.Kernel]) -> KernelLibrary:
        return CpuKernelLibrary(self, kernels)

    def read(self, handle: Handle) -> np.ndarray:
        """A host copy of the elements (the caller has waited for pending writes)."""
        if handle.alloc is not None:
            hazards.check_host_access(handle.alloc, False, "read")
        return np.array(host_array(handle), copy=True)

    def write(self, handle: Handle, array: np.ndarray) -> None:
        """Copy `array` into the elements (the caller has waited for pending work)."""
        if handle.alloc is not None:
            hazards.check_host_access(handle.alloc, True, "write")
        np.copyto(host_array(handle), np.asarray(array, dtype=handle.dtype.np))

    def host_view(self, handle: Handle) -> np.ndarray:
        """Zero-copy numpy view of the elements."""
        return host_array(handle)


def _register_ops() -> None:
    """Register the cpu op implementations (backends/cpu/ops/<op>.py) under CpuDevice."""
    # Imported here, once CpuDevice exists: the op modules are of this backend and the generic
    # ops dispatch through the registry, never importing a device.
    from aotrt.runtime.ops import _common
    from aotrt.runtime.backends.cpu.ops import conv as cpu_conv
    from aotrt.runtime.backends.cpu.ops import linear_wq as cpu_linear_wq
    from aotrt.runtime.backends.cpu.ops import max_pool as cpu_max_pool
    from aotrt.runtime.backends.cpu.ops import mm as cpu_mm
    from aotrt.runtime.backends.cpu.ops import sdpa as cpu_sdpa
    from aotrt.runtime.backends.cpu.ops import topk as cpu_topk
    from aotrt.runtime.backends.cpu.ops import upsample as cpu_upsample

    for impl, make in (("convolution", cpu_conv.make_conv), ("matmul", cpu_mm.make_matmul),
                       ("linear", cpu_mm.make_linear), ("max_pool2d", cpu_max_pool.make_max_pool),
                       ("sdpa", cpu_sdpa.make_sdpa), ("topk", cpu_topk.make_topk),
                       ("upsample_nearest2d", cpu_upsample.make_upsample),
                       ("linear_wq", cpu_linear_wq.make_linear_wq)):
        _common.register(CpuDevice, impl, make)


_register_ops()
