"""The cuda device: cuda.core and cuda.bindings (NVRTC, streams, events, stream-ordered
memory, CUDA graphs) behind the same protocol as the cpu device.

- Memory comes from the device's stream-ordered pool (cuMemAllocAsync through cuda.core's
  `Device.allocate`) on a private allocation stream that is synchronized once per raw
  block, so a new block is usable from every stream; the runtime's own pool (memory.Pool)
  caches blocks above it, so raw allocations are rare.
- A stream is one CUDA stream. CUDA queues are already asynchronous, so `record` launches
  at once (or, in deferred mode, at the next wait), commit is a no-op apart from the hazard
  scope, and a wait is a stream synchronize.
- Work payloads on this device are callables taking the `CudaStream`; they enqueue onto
  `stream.cs` (a cuda.core Stream) or `stream.handle` (the raw CUstream as an int).
- Kernels are CUDA C (render_cuda), compiled by NVRTC to a cubin for the device's
  architecture and cached on disk beside the cpu device's shared libraries.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import threading
from pathlib import Path
from types import FunctionType
from typing import Any, Callable, Sequence

import numpy as np

from aotrt import progress
from aotrt.dtypes import DType, as_dtype
from aotrt.errors import (AotrtError, CompileError, DeviceError, InvalidArgument, OutOfMemory,
                          Unsupported)
from aotrt.kernels import ir
from aotrt.kernels.render_cuda import BLOCK, CudaRenderer
from aotrt.runtime import hazards
from aotrt.runtime.device import (Block, Device, KernelFunction, KernelLibrary, Stream,
                                  StreamOptions)
from aotrt.runtime.backends.cuda import copies as cuda_copies
from aotrt.runtime.backends.cuda.flags import ErrorFlag, take_error
from aotrt.runtime.backends.cuda.graphs import CaptureScratch, CudaGraph, is_chain, serialize_graph
from aotrt.runtime.disk_cache import DiskCache
from aotrt.runtime.tensor import Handle, same_dense_layout

log = logging.getLogger(__name__)

try:  # the device is simply unavailable where NVIDIA's bindings are missing
    from cuda.bindings import driver as _drv
    from cuda.bindings import nvrtc as _nvrtc
    from cuda.core import Device as _CoreDevice
    from cuda.core import EventOptions, LaunchConfig, ObjectCode, Program, ProgramOptions, launch
    _IMPORT_ERROR: BaseException | None = None
except Exception as _e:  # noqa: BLE001 - any import failure means "no cuda here"
    _IMPORT_ERROR = _e

Work = Callable[["CudaStream"], None]


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings (err, *values) tuple; raise DeviceError/OutOfMemory on error."""
    err = result[0]
    if int(err) != 0:
        _, name = _drv.cuGetErrorName(err)
        text = name.decode() if isinstance(name, bytes) else str(err)
        if "OUT_OF_MEMORY" in text:
            raise OutOfMemory(f"cuda: {what}: {text}")
        raise DeviceError(f"cuda: {what} failed: {text}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _takes_stream(work: Any) -> bool:
    """Whether a callable without a code object (a bound method, a partial) takes one arg."""
    import inspect

    try:
        params = inspect.signature(work).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


def _wrap(e: BaseException, what: str) -> AotrtError:
    """A cuda.core or driver exception as the matching aotrt error."""
    if isinstance(e, AotrtError):
        return e
    text = f"{type(e).__name__}: {e}"
    if "OUT_OF_MEMORY" in text:
        return OutOfMemory(f"cuda: {what}: {text}")
    return DeviceError(f"cuda: {what} failed: {text}")


def compile_source(source: str, arch: str, what: str = "source") -> bytes:
    """NVRTC: CUDA C to a cubin for `arch` (needs no GPU); CompileError carries the log."""
    if _IMPORT_ERROR is not None:
        raise CompileError(f"nvrtc is not available: {_IMPORT_ERROR!r}")
    logs = io.StringIO()
    try:
        prog = Program(source, "c++", ProgramOptions(arch=arch, std="c++17"))
        return bytes(prog.compile("cubin", logs=logs).code)
    except Exception as e:  # noqa: BLE001 - NVRTC's error carries the log
        raise CompileError(f"nvrtc failed on {what} for {arch}",
                           f"{logs.getvalue()}\n{e}") from None


# ---------------------------------------------------------------------------------------------
# streams


def _wait_event(stream: "CudaStream", event: Any) -> None:
    """Make `stream` wait for `event`; a failure is logged, not raised: it must not fail
    the stream's next run, which is not the one at fault."""
    err = _drv.cuStreamWaitEvent(stream.handle, event, 0)[0]
    if int(err) != 0:
        log.warning("cuda stream %d: could not wait for a DLPack consumer's stream (%s)",
                    stream.id, err)


class CudaStream(Stream):
    """One CUDA stream; recorded work is enqueued at once (deferred mode: at the next wait)."""

    def __init__(self, device: "CudaDevice", options: StreamOptions) -> None:
        super().__init__(device, options)
        device.ensure_current()
        try:
            self.cs = device.core.create_stream()
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, "create stream") from e
        self.handle = int(self.cs.handle)
        self._deferred: list[Work] = []
        self._error: BaseException | None = None
        # Library ops' scratch while capturing (given to the graph at the end); set exactly
        # while the stream is being captured
        self.capture_scratch: CaptureScratch | None = None
        # Library ops' shared scratch (cuDNN, cuBLASLt): (pointer, bytes, buffer), grown in
        # stream order by backends/cuda/ops/common.stream_workspace; the buffer frees itself with
        # the stream's last reference. A workspace a captured graph has baked in is kept in
        # `retired` when it is outgrown, since that graph still uses it.
        self.workspace: tuple[int, int, Any] | None = None
        self.workspace_baked = False
        self.retired: list[Any] = []
        # Error flags of the libraries whose kernels ran here (graphs too): read at each wait
        self.flags: set[ErrorFlag] = set()

    @property
    def capturing(self) -> bool:
        """Whether the stream is being captured into a CUDA graph."""
        return self.capture_scratch is not None

    @property
    def failed(self) -> bool:
        """Whether queued work failed (the next wait raises it)."""
        return self._error is not None

    def _run(self, work: Any) -> None:
        if self._error is not None:
            return  # like the cpu stream: after a failure, nothing runs until the wait
        try:
            # Device work takes the stream; any other payload is a host callable (tests).
            if type(work) is FunctionType:
                takes = work.__code__.co_argcount >= 1
            else:
                takes = _takes_stream(work)
            if takes:
                work(self)
            else:
                work()
        except BaseException as e:  # noqa: BLE001 - reported at the next wait, as on cpu
            self._error = e

    def _record(self, work: Any) -> None:
        if self.options.deferred and not self.capturing:
            self._deferred.append(work)
        else:
            self.device.ensure_current()
            self._run(work)
            if self.capturing and self._error is not None:
                err, self._error = self._error, None
                raise _wrap(err, f"stream {self.id}: enqueue while capturing") from err

    def _submit(self) -> None:
        # NOTE: CUDA streams start work as soon as it is enqueued; nothing to hand over.
        pass

    def _wait(self) -> None:
        if self.capturing:
            raise DeviceError(f"cuda stream {self.id}: cannot wait while capturing a graph")
        self.device.ensure_current()
        work, self._deferred = self._deferred, []
        for w in work:
            self._run(w)
        try:
            self.cs.sync()
        except Exception as e:  # noqa: BLE001 - an asynchronous fault of earlier work
            raise _wrap(e, f"stream {self.id}: queued work") from e
        kernel_error = take_error(self.flags)      # host memory: no sync of its own
        if self._error is not None:
            err, self._error = self._error, None
            raise DeviceError(f"cuda stream {self.id}: queued work failed: "
                              f"{type(err).__name__}: {err}") from err
        if kernel_error:
            raise InvalidArgument(f"cuda stream {self.id}: {kernel_error}")

    def _close(self) -> None:
        try:
            self.cs.close()
        except Exception:  # noqa: BLE001 - closing twice or at shutdown
            pass

    # -- graphs -------------------------------------------------------------------------------

    def begin_capture(self) -> None:
        """Start capturing everything enqueued on this stream into a CUDA graph."""
        if self.capturing:
            raise DeviceError(f"cuda stream {self.id}: already capturing")
        self.commit_and_wait()
        mode = _drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        _check(_drv.cuStreamBeginCapture(self.cs.handle, mode), "begin capture")
        self.capture_scratch = CaptureScratch()

    def end_capture(self) -> CudaGraph:
        """Stop capturing; the instantiated graph of what was enqueued since begin_capture."""
        if not self.capturing:
            raise DeviceError(f"cuda stream {self.id}: not capturing")
        scratch, self.capture_scratch = self.capture_scratch, None
        try:
            graph = _check(_drv.cuStreamEndCapture(self.cs.handle), "end capture")
        except BaseException:
            scratch.close()
            raise
        try:
            n = serialize_graph(graph)
            if scratch.reused and not is_chain(graph):
                raise Unsupported("cuda graph: library ops share scratch blocks, and the "
                                  "captured graph does not run its nodes one by one")
        except BaseException:
            _drv.cuGraphDestroy(graph)
            scratch.close()
            raise
        if n:
            log.debug("cuda stream %d: %d early-launch edges made full dependencies", self.id, n)
        # The graph writes the workspace it was captured with: a larger one must not free it
        # (backends/cuda/ops/common.stream_workspace keeps a baked one in `retired`).
        self.workspace_baked = self.workspace_baked or self.workspace is not None
        try:
            exec_ = _check(_drv.cuGraphInstantiate(graph, 0), "graph instantiate")
        except BaseException:
            _drv.cuGraphDestroy(graph)
            scratch.close()
            raise
        return CudaGraph(graph, exec_, scratch)

    def capture(self, fn: Callable[["CudaStream"], None]) -> CudaGraph:
        """A CUDA graph of what `fn(self)` enqueues, which does not run now; the stream's
        commands and counters are untouched (unlike begin_capture, nothing is waited for)."""
        if self.capturing:
            raise DeviceError(f"cuda stream {self.id}: already capturing")
        self.device.ensure_current()
        mode = _drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        _check(_drv.cuStreamBeginCapture(self.cs.handle, mode), "begin capture")
        self.capture_scratch = CaptureScratch()
        try:
            fn(self)
        except BaseException:
            self.abort_capture()
            raise
        return self.end_capture()

    def abort_capture(self) -> None:
        """End a capture that failed half-way, dropping what it captured."""
        if self.capturing:
            scratch, self.capture_scratch = self.capture_scratch, None
            res = _drv.cuStreamEndCapture(self.cs.handle)
            if int(res[0]) == 0 and res[1] is not None:
                _drv.cuGraphDestroy(res[1])
            scratch.close()

    # -- events -------------------------------------------------------------------------------

    def timing_event(self) -> Any:
        """Record a timing event on this stream now (subtract two for milliseconds)."""
        return self.cs.record(options=EventOptions(timing_enabled=True))

    # -- data movement ------------------------------------------------------------------------

    def _copy_work(self, dst: Handle, src: Handle) -> Any:
        dev = self.device
        if same_dense_layout(dst, src):
            dlo, dhi = dst.byte_range()
            slo, _ = src.byte_range()
            dptr, sptr, n = dst.alloc.ptr + dlo, src.alloc.ptr + slo, dhi - dlo

            def work(s: CudaStream) -> None:
                _check(_drv.cuMemcpyDtoDAsync(dptr, sptr, n, s.cs.handle), "copy")
            return work
        return dev.strided_copy_work(dst, src)

    def _fill_work(self, view: Handle, byte: int) -> Any:
        if view.packed:
            lo, hi = view.byte_range()
            ptr, n = view.alloc.ptr + lo, hi - lo

            def work(s: CudaStream) -> None:
                _check(_drv.cuMemsetD8Async(ptr, byte, n, s.cs.handle), "fill")
            return work
        return self.device.strided_fill_work(view, byte)


# ---------------------------------------------------------------------------------------------
# kernels


class CudaKernelFunction(KernelFunction):
    """A generated __global__ kernel: pointer arguments, then the outer element count."""

    def __init__(self, library: "CudaKernelLibrary", kernel: ir.Kernel) -> None:
        super().__init__(library, kernel)
        self._kern = library.cuda_kernel(kernel.name)
        self._lanes = CudaRenderer.lanes(kernel)

    def _work(self, bound: list[Handle], n: int) -> Any:
        return self._work_addresses([h.address for h in bound], n)

    def _work_addresses(self, addrs: list[int], n: int) -> Any:
        dev: CudaDevice = self.library.device
        cfg = dev.launch_config(n * self._lanes)
        # Typed scalars: the kernel reads 8-byte pointers and an int64 count.
        args: list[Any] = [np.uint64(a) for a in addrs]
        flag = self.library.flag
        args.extend((np.int64(n), np.uint64(flag.device_ptr)))
        kern = self._kern

        def work(s: CudaStream) -> None:
            s.flags.add(flag)       # read at the stream's waits (a graph's replays too)
            launch(s.cs, cfg, kern, *args)
        return work


class CudaKernelLibrary(KernelLibrary):
    """CUDA C compiled by NVRTC to a cubin once per (NVRTC version, options, source)."""

    def _compile(self) -> None:
        dev: CudaDevice = self.device
        # The library's own module, not the device's cache of modules: it is unloaded when
        # the library closes (cuda.core unloads a module with its last reference).
        self.module = dev.compile_cubin(self.source, f"{len(self.kernels)} kernel(s)",
                                        keep=False)
        self._cuda_kernels: dict[str, Any] = {}
        self.flag = ErrorFlag()     # where the kernels report errors (an index out of range)

    def cuda_kernel(self, name: str) -> Any:
        """The loaded cuda.core Kernel of kernel `name` (looked up by its symbol)."""
        if self.module is None:
            raise InvalidArgument(f"kernel {name}: its library is closed")
        if name not in self._cuda_kernels:
            try:
                self._cuda_kernels[name] = self.module.get_kernel(self.symbol(name))
            except Exception as e:  # noqa: BLE001
                raise _wrap(e, f"load kernel {name}") from e
        return self._cuda_kernels[name]

    def _function(self, kernel: ir.Kernel) -> KernelFunction:
        return CudaKernelFunction(self, kernel)

    def _close(self) -> None:
        # Work still queued holds its own Kernel (and so the module): nothing dangles. The
        # flag stays with the streams that ran its kernels until their next wait.
        self._cuda_kernels = {}
        self.module = None
        self.flag.retired = True


# ---------------------------------------------------------------------------------------------
# the device


class CudaDevice(Device):
    """GPU 0 through cuda.core: stream-ordered memory, NVRTC kernels, CUDA graphs."""

    name = "cuda"
    supports_graphs = True
    dlpack_type = 2     # kDLCUDA
    renderer = CudaRenderer()

    def prefers_channels_last(self, dtype: str) -> bool:
        """Half types: cuDNN's tensor-core engines are NHWC. Not float32, whose engines
        (without TF32) are NCHW kernels: ResNet-18 took 7.13 ms channels-last and 1.49 ms
        NCHW on the H200, eager 2.07-2.39 (bench/results/cuda/h200-fp32-probe-2026-12-03.txt)."""
        return dtype in ("float16", "bfloat16")

    def __init__(self) -> None:
        if _IMPORT_ERROR is not None:
            raise DeviceError(f"cuda: NVIDIA's Python bindings are missing: {_IMPORT_ERROR!r}")
        self._current = threading.local()
        try:
            self.core = _CoreDevice(0)
            self.core.set_current()
            major, minor = self.core.compute_capability
            self.sm_count = int(self.core.properties.multiprocessor_count)
            self._alloc_stream = self.core.create_stream()
        except Exception as e:  # noqa: BLE001 - no driver, no GPU, no context
            raise DeviceError(f"cuda: no usable GPU: {type(e).__name__}: {e}") from e
        self._current.ok = True
        self.arch = f"sm_{major}{minor}"
        self.max_blocks = self.sm_count * 16
        self._configs: dict[int, Any] = {}
        # Modules of fixed sources only (helpers, library ops): bounded, kept for the device.
        self._modules: dict[str, Any] = {}
        self.cache = DiskCache()
        self._helpers: Any = None
        self._helper_lock = threading.Lock()
        self._libraries: Any = None
        super().__init__()

    def ensure_current(self) -> None:
        """Make the device's context current in the calling thread (once per thread)."""
        if not getattr(self._current, "ok", False):
            self.core.set_current()
            self._current.ok = True

    def _create_stream(self, options: StreamOptions) -> Stream:
        return CudaStream(self, options)

    def after_consumer(self, alloc: Any, stream: Any) -> None:
        """The stream `alloc` is pooled on waits, in stream order, for an event recorded on
        the consumer's stream now. torch frees a DLPack tensor as soon as its last kernel
        is queued, not run: without the wait, the next run() could write the reused block
        while that kernel still had to read it. DLPack's stream numbers: None and 1 are
        the legacy default stream, 2 the per-thread one, -1 "unknown" (the whole device
        is waited for)."""
        own = alloc.stream
        if own is None or own.closed or alloc.freed:
            return
        self.ensure_current()
        consumer = 1 if stream is None else int(stream)
        if consumer == -1:
            _check(_drv.cuCtxSynchronize(), "wait for a DLPack consumer")
            return
        flags = _drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        event = _check(_drv.cuEventCreate(flags), "event create")
        try:
            _check(_drv.cuEventRecord(event, consumer), "event record on the consumer's stream")
            if own.is_planning:     # another thread is planning its steps: wait here
                _check(_drv.cuEventSynchronize(event), "wait for a DLPack consumer")
                return
            own.record([hazards.Access(alloc, 0, alloc.nbytes, True)],
                       lambda s: _wait_event(s, event), "wait for a DLPack consumer")
            own.commit()
        finally:
            # Destroying an event that a queued wait still names is allowed: its resources
            # go once the wait is done.
            _drv.cuEventDestroy(event)

    @property
    def libraries(self) -> Any:
        """This device's library state (cuBLASLt, cuDNN, plan caches, index buffers):
        aotrt.runtime.backends.cuda.libraries.CudaLibraries, made on first use."""
        with self._helper_lock:
            if self._libraries is None:
                from aotrt.runtime.backends.cuda.libraries import CudaLibraries

                self._libraries = CudaLibraries(self)
            return self._libraries

    # -- memory -------------------------------------------------------------------------------

    def _alloc(self, nbytes: int) -> Block:
        self.ensure_current()
        try:
            buf = self.core.allocate(nbytes, stream=self._alloc_stream)
            # NOTE: one sync per raw block makes it usable from any stream, not only the
            # allocation stream; the runtime pool makes raw allocations rare.
            self._alloc_stream.sync()
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"allocate {nbytes} bytes") from e
        return Block(int(buf.handle), nbytes, buf)

    def _free(self, block: Block) -> None:
        # The memory layer waited for every stream that used the block before freeing it.
        self.ensure_current()
        try:
            block.keep.close(self._alloc_stream)
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, "free") from e

    def read(self, handle: Handle) -> np.ndarray:
        """A host copy of the view's elements (the caller has waited for pending writes)."""
        if handle.alloc is not None:
            hazards.check_host_access(handle.alloc, False, "read")
        if handle.numel == 0 or handle.alloc is None:
            return np.zeros(handle.sizes, dtype=handle.dtype.np)
        self.ensure_current()
        lo, hi = handle.byte_range()
        host = np.empty(hi - lo, dtype=np.uint8)
        _check(_drv.cuMemcpyDtoH(host.ctypes.data, handle.alloc.ptr + lo, hi - lo), "read")
        isz = handle.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            host[handle.byte_offset - lo:].view(handle.dtype.np), shape=handle.sizes,
            strides=[s * isz for s in handle.strides])
        return np.array(view, copy=True)

    def write(self, handle: Handle, array: Any) -> None:
        """Copy a host array (broadcast to the view's sizes) into the view's elements."""
        if handle.alloc is not None:
            hazards.check_host_access(handle.alloc, True, "write")
        if handle.numel == 0 or handle.alloc is None:
            return
        self.ensure_current()
        src = np.broadcast_to(np.asarray(array, dtype=handle.dtype.np), handle.sizes)
        lo, hi = handle.byte_range()
        isz = handle.dtype.itemsize
        if handle.packed:
            # The view covers its byte span exactly: lay the host data out the same way.
            host = np.empty(hi - lo, dtype=np.uint8)
            view = np.lib.stride_tricks.as_strided(
                host[handle.byte_offset - lo:].view(handle.dtype.np), shape=handle.sizes,
                strides=[s * isz for s in handle.strides])
            view[...] = src
            self._upload(handle.alloc.ptr + lo, host, hi - lo)
            return
        # Holes between the elements may belong to others: scatter through a kernel.
        dense = np.ascontiguousarray(src)
        tmp = self.core.allocate(max(dense.nbytes, 1), stream=self._alloc_stream)
        try:
            self._alloc_stream.sync()
            tmp_ptr = int(tmp.handle)
            self._upload(tmp_ptr, dense, dense.nbytes)
            strides = [1] * handle.ndim
            acc = 1
            for d in range(handle.ndim - 1, -1, -1):
                strides[d] = acc
                acc *= handle.sizes[d]
            self.strided_work(handle.address, tmp_ptr, handle.sizes, handle.strides, strides,
                          isz, None)(self._alloc_stream)
            self._alloc_stream.sync()
        finally:
            tmp.close(self._alloc_stream)

    def _upload(self, dst: int, host: np.ndarray, nbytes: int) -> None:
        """Copy `nbytes` of `host` to device address `dst`, complete when this returns.

        cuMemcpyHtoD from pageable memory may return before its DMA lands, and only the
        legacy default stream is ordered after it; the streams here are non-blocking, so a
        kernel could read the old bytes (intermittent wrong answers under GPU load on the
        H200, 2026-12-02). The copy goes on a stream of ours, which is then synchronized.
        """
        _check(_drv.cuMemcpyHtoDAsync(dst, host.ctypes.data, nbytes,
                                      self._alloc_stream.handle), "write")
        self._alloc_stream.sync()

    # -- kernels ------------------------------------------------------------------------------

    def _library(self, kernels: Sequence[ir.Kernel]) -> KernelLibrary:
        return CudaKernelLibrary(self, kernels)

    def launch_config(self, threads: int) -> Any:
        """A LaunchConfig of BLOCK-thread blocks covering `threads` (grid-stride capped)."""
        blocks = max(1, min((threads + BLOCK - 1) // BLOCK, self.max_blocks))
        cfg = self._configs.get(blocks)
        if cfg is None:
            cfg = self._configs[blocks] = LaunchConfig(grid=(blocks, 1, 1), block=(BLOCK, 1, 1))
        return cfg

    def compile_options(self) -> tuple[str, ...]:
        """NVRTC options of every compile (part of the cache key)."""
        return (f"-arch={self.arch}", "-std=c++17")

    def compile_cubin(self, source: str, what: str, keep: bool = True) -> Any:
        """Compile CUDA C to a loaded module, through the verified on-disk cubin cache.

        `keep` holds the module for the device's lifetime (helpers, library ops, whose
        sources are fixed); a kernel library passes False and owns its module.
        """
        self.ensure_current()
        version = ".".join(str(v) for v in _check(_nvrtc.nvrtcVersion(), "nvrtc version"))
        key = hashlib.sha256("\0".join(
            ["nvrtc " + version, *self.compile_options(), source]).encode()).hexdigest()
        if key in self._modules:
            return self._modules[key]
        name = f"{key[:32]}.cubin"
        code = self.cache.read(name)
        if code is None:
            with progress.step(f"compiling {what} with nvrtc for {self.arch}"):
                code = compile_source(source, self.arch, what)
            root = self.cache.writable_root()
            try:
                fd, tmp = tempfile.mkstemp(dir=root, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(code)
                self.cache.write(root / name, Path(tmp))
            except OSError as e:
                raise CompileError(f"kernel cache directory {str(root)!r}: cannot write "
                                   f"{name}: {e}") from None
            log.debug("compiled %s into %s", what, root / name)
        try:
            module = ObjectCode.from_cubin(code)
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"load {name}") from e
        if keep:
            self._modules[key] = module
        return module

    def _helper_kernels(self) -> Any:
        with self._helper_lock:
            if self._helpers is None:
                self._helpers = self.compile_cubin(cuda_copies.COPY_SOURCE,
                                                   "copy/fill helpers")
            return self._helpers

    def strided_work(self, dst_ptr: int, src_ptr: int | None, sizes: Sequence[int],
                     dst_strides: Sequence[int], src_strides: Sequence[int], itemsize: int,
                     fill: int | None) -> Work:
        """Work copying (or filling with the repeated byte `fill`) a strided view between raw
        device addresses (the library ops' packed temporaries have no Handle)."""
        name, n, args = cuda_copies.plan(dst_ptr, src_ptr, sizes, dst_strides, src_strides,
                                         itemsize, fill)
        kern = self._helper_kernels().get_kernel(name)
        cfg = self.launch_config(n)

        def work(s: Any) -> None:
            launch(s.cs if isinstance(s, CudaStream) else s, cfg, kern, *args)
        return work

    def strided_copy_work(self, dst: Handle, src: Handle) -> Work:
        """Work of an element-wise copy between two views of any layout."""
        return self.strided_work(dst.address, src.address, dst.sizes, dst.strides, src.strides,
                             dst.dtype.itemsize, None)

    def strided_fill_work(self, view: Handle, byte: int) -> Work:
        """Work setting every byte of a view's elements to `byte`."""
        return self.strided_work(view.address, None, view.sizes, view.strides, view.strides,
                             view.dtype.itemsize, byte)

    # -- foreign memory -----------------------------------------------------------------------

    def dlpack_info(self, obj: Any, stream: CudaStream | None = None
                    ) -> tuple[int, tuple[int, ...], tuple[int, ...], DType]:
        """(address, sizes, strides in elements, dtype) of a CUDA `__dlpack__` object.

        The producer orders its pending work before `stream` (the DLPack stream handshake),
        so the memory can be read there without a copy.
        """
        from cuda.core.utils import StridedMemoryView

        stream = stream or self.current_stream()
        try:
            view = StridedMemoryView.from_dlpack(obj, stream_ptr=stream.handle)
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, "import a __dlpack__ object") from e
        if not view.is_device_accessible or view.device_id != 0:
            raise DeviceError(f"cuda: object on device {view.device_id} is not on cuda:0")
        sizes = tuple(int(n) for n in view.shape)
        if view.strides is None:
            acc, st = 1, []
            for n in reversed(sizes):
                st.append(acc)
                acc *= max(n, 1)
            strides = tuple(reversed(st))
        else:
            strides = tuple(int(s) for s in view.strides)
        return int(view.ptr), sizes, strides, as_dtype(view.dtype)

    def mempool_stats(self) -> dict[str, int]:
        """Bytes used now and at the high-water mark of the device's stream-ordered pool."""
        self.ensure_current()
        pool = _check(_drv.cuDeviceGetDefaultMemPool(0), "mem pool")
        attrs = _drv.CUmemPool_attribute
        out = {}
        for key, attr in (("used", attrs.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
                          ("used_high", attrs.CU_MEMPOOL_ATTR_USED_MEM_HIGH),
                          ("reserved", attrs.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
                          ("reserved_high", attrs.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)):
            value = _check(_drv.cuMemPoolGetAttribute(pool, attr), "mem pool attribute")
            out[key] = int(value)
        return out


def _register_ops() -> None:
    """Register the cuda op implementations (backends/cuda/ops/<op>.py) under CudaDevice."""
    # Imported here, once CudaDevice exists (the op modules name it for type checks only).
    from aotrt.runtime.ops import _common
    from aotrt.runtime.backends.cuda.ops import conv, gemm, linear_wq, pool, sdpa, topk, upsample

    def convolution(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: Any,
                    residual: Handle | None, fp32: Any) -> Any:
        # The stream's Fp32Math says whether a float32 convolution may use TF32.
        return conv.make_conv(out, x, w, bias, p, residual, fp32.conv_tf32)

    for impl, make in (("convolution", convolution), ("matmul", gemm.make_matmul),
                       ("linear", gemm.make_linear), ("max_pool2d", pool.make_maxpool),
                       ("sdpa", sdpa.make_sdpa), ("topk", topk.make_topk),
                       ("upsample_nearest2d", upsample.make_upsample),
                       ("linear_wq", linear_wq.make_linear_wq)):
        _common.register(CudaDevice, impl, make)


_register_ops()
