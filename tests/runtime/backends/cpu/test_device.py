"""aotrt/runtime/backends/cpu/device.py: aligned host memory, host_array,
and the kernel compiler with its on-disk cache."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aotrt.errors import CompileError, InvalidArgument, OutOfMemory
from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.backends.cpu import device as cpu_mod
from aotrt.runtime.backends.cpu.device import host_array
from aotrt.runtime.disk_cache import cache_dir
from aotrt.runtime.memory import Owner, owner_scope
from tests.conftest import make_stream
from tests.support import iota, iota_kernel, kernel_fn, upload


@pytest.fixture
def ctx(cpu):
    """A stream and owner on the cpu device (one mode: these tests are about the device)."""
    s = make_stream(cpu, "async")
    o = Owner("cpu-test")
    with cpu.stream_guard(s), owner_scope(o):
        yield s
    leaked = list(o.handles)
    o.close()
    s.close()
    assert not leaked


# -- memory -----------------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [1, 63, 64, 65, 1000, 4096])
def test_alloc_is_64_byte_aligned_and_large_enough(cpu, nbytes):
    block = cpu._alloc(nbytes)
    assert block.ptr % 64 == 0 and block.nbytes == nbytes
    base = block.keep.ctypes.data
    assert base <= block.ptr and block.ptr + nbytes <= base + block.keep.nbytes
    cpu._free(block)


def test_alloc_too_large_is_out_of_memory(cpu):
    with pytest.raises(OutOfMemory, match="cpu"):
        cpu._alloc(1 << 61)


def test_alloc_beyond_physical_memory_is_refused_before_touching_it(cpu, monkeypatch):
    """An overcommitting kernel would grant it and kill the process at the first touch (a
    2 KB fuzz mutant asked for a 2 GiB arena, which load zero-fills)."""
    monkeypatch.setattr(cpu_mod, "physical_memory", lambda: 1 << 20)
    with pytest.raises(OutOfMemory, match="more than this machine's 1048576 bytes"):
        cpu._alloc((1 << 20) + 1)
    block = cpu._alloc(1 << 20)
    assert block.nbytes == 1 << 20


def test_host_array_is_a_zero_copy_strided_view(cpu, ctx):
    base = shims.empty_strided([4, 6], None, "float32")
    upload(base, iota([4, 6]))
    v = shims.reinterpret_tensor(base, [3, 2], [6, 3], 1)
    arr = host_array(v)
    assert arr.shape == (3, 2) and arr.strides == (24, 12)
    np.testing.assert_array_equal(arr, iota([4, 6]).ravel()[[1, 4, 7, 10, 13, 16]].reshape(3, 2))
    arr[0, 0] = -7.0
    assert base.numpy()[0, 1] == -7.0
    assert cpu.host_view(v).__array_interface__["data"][0] == arr.__array_interface__["data"][0]
    for h in (v, base):
        shims.delete_tensor_object(h)


def test_host_array_of_broadcast_and_empty_views(cpu, ctx):
    base = shims.empty_strided([4], None, "int32")
    upload(base, np.array([1, 2, 3, 4], np.int32))
    bc = shims.reinterpret_tensor(base, [3, 4], [0, 1], 0)
    np.testing.assert_array_equal(host_array(bc), np.tile([1, 2, 3, 4], (3, 1)))
    e = shims.reinterpret_tensor(base, [0, 2], [2, 1], 4)
    assert host_array(e).shape == (0, 2)
    for h in (bc, e, base):
        shims.delete_tensor_object(h)


def test_read_and_write_copy_in_and_out(cpu, ctx):
    h = shims.empty_strided([2, 3], None, "bfloat16")
    cpu.write(h, np.array([[1.5, 2.25, -3], [4, 5, 6]], np.float64))
    got = cpu.read(h)
    assert got.dtype == h.dtype.np
    np.testing.assert_array_equal(got.astype(np.float64), [[1.5, 2.25, -3], [4, 5, 6]])
    got[:] = 0
    assert cpu.read(h)[0, 0] == 1.5
    shims.delete_tensor_object(h)


@pytest.mark.parametrize("dtype,byte,expect", [
    ("float16", 0x3C, np.frombuffer(b"\x3c\x3c", "<f2")[0]),
    ("bool", 1, True),
    ("int64", 0xFF, -1),
    ("uint8", 7, 7),
])
def test_fill_writes_the_byte_pattern(cpu, ctx, dtype, byte, expect):
    h = shims.empty_strided([3], None, dtype)
    ctx.fill(h, byte)
    np.testing.assert_array_equal(h.numpy(), np.full(3, expect, h.dtype.np))
    shims.delete_tensor_object(h)


# -- kernel compilation and the cache ---------------------------------------------------------


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("AOTRT_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "aotrt"


def test_library_is_compiled_once_into_the_cache(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    k = iota_kernel([5], [1], base=42.0)
    lib = cpu.kernel_library([k])
    assert lib.path.parent == tmp_path and lib.path.exists()
    # the library and its checksum sidecar; no temporary left behind
    assert sorted(tmp_path.iterdir()) == [lib.path, lib.path.with_suffix(".so.sha256")]

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    version = cpu_mod._compiler_version(lib_cc())      # warm, so only the compile is blocked
    monkeypatch.setattr(cpu_mod.subprocess, "run", no_compiler)
    again = cpu.kernel_library([k])
    assert again.path == lib.path and version


def lib_cc() -> str:
    import os
    import shutil

    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def test_cache_key_covers_source_flags_and_compiler(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    k = iota_kernel([6], [1], base=1.0)
    first = cpu.kernel_library([k]).path
    other_source = cpu.kernel_library([iota_kernel([6], [1], base=2.0)]).path
    monkeypatch.setattr(cpu_mod, "CFLAGS", cpu_mod.CFLAGS + ("-DAOTRT_TEST_FLAG",))
    other_flags = cpu.kernel_library([k]).path
    monkeypatch.setattr(cpu_mod, "_versions", {lib_cc(): "another compiler 1.0"})
    other_cc = cpu.kernel_library([k]).path
    assert len({first, other_source, other_flags, other_cc}) == 4


def test_cache_key_covers_the_cpu_features(cpu, monkeypatch):
    """-march=native code is keyed by what the compiler sees of this CPU: a library built on
    one CPU is never picked up on another; without that view there is no -march=native."""
    cc, src, names = lib_cc(), "int32_t aotrt_error = 0;\n", ["aotrt_k0", "aotrt_error"]
    keys = {}
    for features in ("-march= znver3\n-mavx2 [enabled]", "-march= skylake\n-mavx2 [enabled]",
                     None):
        monkeypatch.setattr(cpu_mod, "cpu_features", lambda cc, f=features: f)
        key, flags = cpu_mod.KernelCache().key(cc, src, names)
        assert ("-march=native" in flags) == (features is not None)
        assert "-fopenmp" in flags and "-fwrapv" in flags and "-ffp-contract=off" in flags
        keys[features] = key
    assert len(set(keys.values())) == 3
    real = cpu_mod.cpu_features(cc)
    assert real is None or "-march=" in real


def test_gcc_gets_room_for_more_alias_checks_and_other_compilers_do_not(monkeypatch):
    """gcc vectorises a loop of many loads (a 5x5 max pool's 25) only with more run-time
    overlap checks than its default 10; the --param is gcc's, so no other compiler gets it."""
    cc, src, names = lib_cc(), "int32_t aotrt_error = 0;\n", ["aotrt_k0", "aotrt_error"]
    for version, expect in (("cc (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software "
                             "Foundation, Inc.", True), ("Debian clang version 14.0.6", False)):
        monkeypatch.setattr(cpu_mod, "_versions", {cc: version})
        _, flags = cpu_mod.KernelCache().key(cc, src, names)
        assert all(f in flags for f in cpu_mod.GCC_FLAGS) is expect, (version, flags)


def test_a_library_builds_and_runs_without_native_flags(cpu, ctx, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "cache", cpu_mod.KernelCache())
    monkeypatch.setattr(cpu_mod, "cpu_features", lambda cc: None)
    lib = cpu.kernel_library([iota_kernel([7], [1], base=3.0)])
    h = shims.empty_strided([7], None, "float32")
    lib.kernel(next(iter(lib.kernels)))(ctx, h)
    np.testing.assert_array_equal(h.numpy(), iota([7], base=3.0))
    shims.delete_tensor_object(h)
    lib.close()


def _threads_source(syms: list[str]) -> str:
    """Each kernel writes the thread count it was called with into P[0][0]."""
    return "#include <stdint.h>\nint32_t aotrt_error = 0;\n" + "".join(
        f"void {s}(char **P, int64_t b, int64_t e, int64_t t) {{ ((int64_t *)P[0])[0] = t; }}\n"
        for s in syms)


def test_a_kernel_call_gets_its_streams_thread_count(cpu, monkeypatch, tmp_path):
    import os

    from aotrt.runtime.device import StreamOptions

    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "renderer", _HandWritten(_threads_source))
    k = _int64_kernel("k_threads")
    lib = cpu.kernel_library([k])
    fn = lib.kernel(k.name)
    o = Owner("threads")
    seen = {}
    for threads in (1, 3, None):
        s = cpu.create_stream(StreamOptions(threads=threads))
        with cpu.stream_guard(s), owner_scope(o):
            h = shims.empty_strided([2], None, "int64")
            upload(h, np.zeros(2, np.int64))
            fn(s, h)
            launch = fn.prepare([h])            # a prepared launch reads the stream's too
            seen[threads] = [int(h.numpy()[0])]
            upload(h, np.zeros(2, np.int64))
            launch.launch(s)
            seen[threads].append(int(h.numpy()[0]))
            shims.delete_tensor_object(h)
        s.close()
    o.close()
    lib.close()
    cores = len(os.sched_getaffinity(0))
    assert seen == {1: [1, 1], 3: [3, 3], None: [cores, cores]}


def test_the_openmp_runtime_stays_mapped_after_the_last_library_closes(tmp_path):
    """Its pool threads outlive the library that started them: unmapping the runtime with
    the library would crash the process when they wake (a fresh process, so that no other
    library holds the runtime)."""
    import os
    import subprocess
    import sys

    script = """
import numpy as np
from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.memory import Owner, owner_scope
from tests.kernels.test_render_c import softmax_kernel
cpu = get_device("cpu")
s = cpu.create_stream(StreamOptions(threads=2))
k = softmax_kernel(1001, 257, "float32")
lib = cpu.kernel_library([k])
o = Owner("pin")
with cpu.stream_guard(s), owner_scope(o):
    x, y = (shims.empty_strided([1001, 257], None, "float32") for _ in range(2))
    lib.kernel(k.name)(s, x, y)
    s.commit_and_wait()
    for h in (x, y):
        shims.delete_tensor_object(h)
o.close()
lib.close()
maps = open("/proc/self/maps").read()
print("unmapped" if str(lib.path) in maps else "closed",
      "gomp" if "libgomp" in maps or "libomp" in maps else "no-runtime")
"""
    env = dict(os.environ, AOTRT_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parents[4], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["closed", "gomp"], proc.stdout


def test_compiled_kernel_runs(cpu, ctx):
    h = shims.empty_strided([5], None, "float32")
    kernel_fn(cpu, iota_kernel([5], [1], base=42.0))(ctx, h)
    np.testing.assert_array_equal(h.numpy(), iota([5], base=42.0))
    shims.delete_tensor_object(h)


def test_compile_error_carries_the_compilers_log(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))

    class Broken:
        def render(self, kernels):
            return "this is not C;\n"

    monkeypatch.setattr(cpu, "renderer", Broken())
    with pytest.raises(CompileError) as e:
        cpu.kernel_library([iota_kernel([2], [1])])
    assert "error" in e.value.log and e.value.log in str(e.value)
    assert list(tmp_path.glob("*.so")) == []


def test_missing_compiler_is_a_compile_error(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_mod.shutil, "which", lambda name: None)
    with pytest.raises(CompileError, match="no C compiler"):
        cpu.kernel_library([iota_kernel([2], [1])])


def test_concurrent_builds_of_one_library_agree(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    k = iota_kernel([7], [1], base=3.0)
    paths, errors = [], []

    def build() -> None:
        try:
            paths.append(cpu.kernel_library([k]).path)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(paths)) == 1 and len(list(tmp_path.glob("*.so"))) == 1


# -- library lifetime: dlclose, calls in flight -----------------------------------------------


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps") as f:
        return any(str(path) in line for line in f)


def test_close_unmaps_the_library_and_refuses_later_calls(cpu, ctx, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    lib = cpu.kernel_library([iota_kernel([5], [1], base=11.0)])
    fn = lib.kernel(lib.kernels and next(iter(lib.kernels)))
    h = shims.empty_strided([5], None, "float32")
    fn(ctx, h)
    ctx.commit_and_wait()
    assert _mapped(lib.path)
    lib.close()
    lib.close()                                     # twice is fine
    assert not _mapped(lib.path)
    with pytest.raises(InvalidArgument, match="closed"):
        fn(ctx, h)
    with pytest.raises(InvalidArgument, match="closed"):
        lib.loaded.call(lib.symbol(fn.name), fn.name, None, 1)
    np.testing.assert_array_equal(h.numpy(), iota([5], base=11.0))
    shims.delete_tensor_object(h)


def test_queued_work_of_a_closed_library_is_refused_not_run(cpu, monkeypatch, tmp_path):
    """Work recorded before the close and run after it fails cleanly (it never jumps into
    unmapped code)."""
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    s = make_stream(cpu, "deferred")
    o = Owner("queued")
    with cpu.stream_guard(s), owner_scope(o):
        k = iota_kernel([4], [1], base=12.0)
        lib = cpu.kernel_library([k])
        h = shims.empty_strided([4], None, "float32")
        lib.kernel(k.name)(s, h)
        lib.close()
        with pytest.raises(InvalidArgument, match="closed"):
            s.commit_and_wait()
        shims.delete_tensor_object(h)
    o.close()
    s.close()


def _spin_source(symbols: list[str]) -> str:
    """A kernel that spins until P[0][0] is set (from another thread), then returns."""
    return ("#include <stdint.h>\nint32_t aotrt_error = 0;\n" + "".join(
        f"void {sym}(char **P, int64_t b, int64_t e) {{ volatile int64_t *f = "
        f"(volatile int64_t *)P[0]; f[1] = 1; while (!f[0]) {{}} }}\n" for sym in symbols))


class _HandWritten:
    """A renderer that returns fixed C text for every library (symbols as C1 names them)."""

    def __init__(self, make) -> None:
        self.make = make

    def render(self, kernels):
        from aotrt.kernels.render_c import symbol

        return self.make([symbol(i) for i in range(len(kernels))])


def _int64_kernel(name: str) -> "Any":
    from aotrt.kernels import ir

    return ir.Kernel(name, (2,), (), (ir.Arg("int64", "rw"),),
                     (ir.store(0, (1,), ir.load(0, (1,), "int64")),))


def test_close_waits_for_a_running_kernel_and_times_out_mapped(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "renderer", _HandWritten(_spin_source))
    k = _int64_kernel("k_spin")
    lib = cpu.kernel_library([k])
    flag = np.zeros(2, np.int64)
    ptrs = (cpu_mod.ctypes.c_void_p * 1)(flag.ctypes.data)
    t = threading.Thread(target=lib.loaded.call, args=(lib.symbol(k.name), k.name, ptrs, 2))
    t.start()
    try:
        for _ in range(5000):
            if flag[1]:
                break
            threading.Event().wait(0.001)
        assert flag[1], "the kernel did not start"
        assert lib.loaded.close(timeout=0.05) is False  # still running: stays mapped
        assert _mapped(lib.path)
        closer = threading.Thread(target=lib.close)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive() and _mapped(lib.path)  # waits for the kernel
    finally:
        flag[0] = 1                                     # never leave the kernel spinning
    t.join(5)
    closer.join(5)
    assert not t.is_alive() and not closer.is_alive() and not _mapped(lib.path)


# -- symbols (issue 7, item 7) ----------------------------------------------------------------


HOSTILE_NAMES = ["__gmon_start__", "_handle", "_name", "_func_flags_", "__x__", "dlopen", "main",
                 "_init", "_fini", "aotrt_error"]


def test_kernels_named_like_libc_or_ctypes_symbols_run(tmp_path):
    """Kernel names are labels: a kernel named __gmon_start__ (called by _init at dlopen
    today), _handle (a CDLL attribute), main or dlopen runs like any other."""
    import os
    import subprocess
    import sys

    script = f"""
import dataclasses
import numpy as np
from aotrt.runtime import shims
from aotrt.runtime.device import get_device
from tests.support import iota, iota_kernel
from aotrt.kernels import ir
names = {HOSTILE_NAMES!r}
cpu = get_device("cpu")
ks = [dataclasses.replace(iota_kernel([3], [1], base=float(i)), name=n)
      for i, n in enumerate(names)]
lib = cpu.kernel_library(ks)
s = cpu.default_stream()
for i, n in enumerate(names):
    h = shims.empty_strided([3], None, "float32")
    lib.kernel(n)(s, h)
    np.testing.assert_array_equal(h.numpy(), iota([3], base=float(i)))
    shims.delete_tensor_object(h)
lib.close()
print("ok", len(names))
"""
    env = dict(os.environ, AOTRT_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parents[4], timeout=120)
    assert proc.returncode == 0 and f"ok {len(HOSTILE_NAMES)}" in proc.stdout, proc.stderr


def test_library_exports_only_its_kernel_symbols_and_the_error_flag(cpu, monkeypatch,
                                                                    tmp_path):
    import subprocess

    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    ks = [iota_kernel([3], [1], base=21.0), iota_kernel([4], [1], base=22.0)]
    lib = cpu.kernel_library(ks)
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib.path)], capture_output=True,
                         text=True).stdout
    defined = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert defined == {"aotrt_k0", "aotrt_k1", "aotrt_error"} == set(lib.exported())
    lib.close()


def test_a_library_without_the_error_flag_is_a_compile_error(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "renderer", _HandWritten(lambda syms: "#include <stdint.h>\n" +
        "".join(f"void {s}(char **P, int64_t b, int64_t e) {{}}\n" for s in syms)))
    with pytest.raises(CompileError, match="aotrt_error"):
        cpu.kernel_library([_int64_kernel("k_noflag")])


# -- the cache: unusable directories, corrupt entries (issue 7, item 9) ---------------------


def _run_iota(cpu, base: float) -> None:
    """Build, run and close a one-kernel library; check what it wrote."""
    s = make_stream(cpu, "async")
    o = Owner("cache")
    with cpu.stream_guard(s), owner_scope(o):
        k = iota_kernel([6], [1], base=base)
        lib = cpu.kernel_library([k])
        h = shims.empty_strided([6], None, "float32")
        lib.kernel(k.name)(s, h)
        np.testing.assert_array_equal(h.numpy(), iota([6], base=base))
        shims.delete_tensor_object(h)
        lib.close()
    o.close()
    s.close()
    return lib.path


@pytest.mark.parametrize("make", ["file", "parent_is_file"])
def test_unusable_cache_dir_is_a_clear_error(cpu, monkeypatch, tmp_path, make):
    bad = tmp_path / "f"
    bad.write_text("not a directory")
    if make == "parent_is_file":
        bad = bad / "sub"
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(bad))
    with pytest.raises(CompileError, match="AOTRT_CACHE_DIR") as e:
        cpu.kernel_library([iota_kernel([3], [1], base=31.5)])
    assert str(bad) in str(e.value)


def test_unwritable_cache_dir_is_a_clear_error(cpu, monkeypatch, tmp_path):
    """A directory that refuses new files, as a read-only one does for a user: root (CI)
    writes anywhere, so the refusal is the one os.open gives a user, patched in."""
    import errno
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    real_open = os.open

    def refusing_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & os.O_CREAT and Path(os.fsdecode(path)).parent == ro:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(ro))
    with pytest.raises(CompileError, match="AOTRT_CACHE_DIR") as e:
        cpu.kernel_library([iota_kernel([3], [1], base=32.5)])
    assert str(ro) in str(e.value) and "PermissionError" in str(e.value)
    assert not list(ro.iterdir())        # nothing was published there


def test_missing_parents_of_the_cache_dir_are_created(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path / "a" / "b"))
    assert _run_iota(cpu, 33.5).parent == tmp_path / "a" / "b"


def test_unusable_default_cache_falls_back_with_a_warning(cpu, monkeypatch, tmp_path, caplog):
    home = tmp_path / "home"
    home.write_text("a file, so ~/.cache cannot be made")
    monkeypatch.delenv("AOTRT_CACHE_DIR")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(cpu, "cache", cpu_mod.KernelCache())   # the fallback is per device
    with caplog.at_level("WARNING", logger="aotrt.runtime.disk_cache"):
        path = _run_iota(cpu, 34.5)
    assert str(home) not in str(path) and "unusable" in caplog.text
    assert _run_iota(cpu, 34.5) == path     # the fallback is a cache too


@pytest.mark.parametrize("damage", ["truncate", "garbage", "sidecar", "no_sidecar",
                                    "empty", "both"])
def test_a_damaged_cache_entry_is_rebuilt(cpu, monkeypatch, tmp_path, damage):
    """A truncated, corrupt or mismatching entry is rebuilt, and later loads work too."""
    import hashlib

    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    base = 40.0 + ["truncate", "garbage", "sidecar", "no_sidecar", "empty", "both"].index(damage)
    path = _run_iota(cpu, base)
    side = path.with_name(path.name + ".sha256")
    good = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(good[:len(good) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x7fELF" + bytes(range(256)) * 8)
    elif damage == "sidecar":
        side.write_text("0" * 64)
    elif damage == "no_sidecar":
        side.unlink()
    elif damage == "empty":
        path.write_bytes(b"")
    else:                                   # a corrupt file whose sidecar matches it
        path.write_bytes(b"corrupt")
        side.write_text(hashlib.sha256(b"corrupt").hexdigest())
    assert _run_iota(cpu, base) == path
    assert path.read_bytes() == good or hashlib.sha256(path.read_bytes()).hexdigest() == \
        side.read_text().strip()
    assert _run_iota(cpu, base) == path


# -- flags: wrapping arithmetic, the kernel error flag, sanitizers ----------------------------


def test_signed_overflow_wraps(cpu, ctx, monkeypatch, tmp_path):
    """-fwrapv: `x + 1 > x` is false for INT64_MAX (without it -O3 folds it to true)."""
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "renderer", _HandWritten(lambda syms: (
        "#include <stdint.h>\nint32_t aotrt_error = 0;\n" + "".join(
            f"void {s}(char **P, int64_t b, int64_t e) {{ int64_t *x = (int64_t *)P[0];\n"
            f"  for (int64_t i = b; i < e; i++) x[i] = (x[i] + 1 > x[i]); }}\n"
            for s in syms))))
    assert "-fwrapv" in cpu_mod.CFLAGS and "-fno-strict-aliasing" in cpu_mod.CFLAGS
    k = _int64_kernel("k_wrap")
    h = shims.empty_strided([2], None, "int64")
    upload(h, np.array([np.iinfo(np.int64).max, 5], np.int64))
    cpu.kernel_library([k]).kernel(k.name)(ctx, h)
    np.testing.assert_array_equal(h.numpy(), [0, 1])
    shims.delete_tensor_object(h)


def _flag_source(syms: list[str]) -> str:
    """Each kernel sets the error flag (code P[0][0]) when P[0][0] != 0, as C2 says."""
    return "#include <stdint.h>\nint32_t aotrt_error = 0;\n" + "".join(
        f"void {s}(char **P, int64_t b, int64_t e) {{ int64_t *x = (int64_t *)P[0];\n"
        f"  if (x[0]) __atomic_store_n(&aotrt_error, (int32_t)x[0], __ATOMIC_RELAXED);\n"
        f"  x[1] = 7; }}\n" for s in syms)


@pytest.mark.parametrize("mode", ["async", "deferred"])
def test_kernel_error_flag_raises_invalid_argument_and_resets(cpu, monkeypatch, tmp_path, mode):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "renderer", _HandWritten(_flag_source))
    s = make_stream(cpu, mode)
    o = Owner("flag")
    with cpu.stream_guard(s), owner_scope(o):
        k = _int64_kernel("k_flag")
        lib = cpu.kernel_library([k])
        h = shims.empty_strided([2], None, "int64")
        upload(h, np.array([1, 0], np.int64))
        lib.kernel(k.name)(s, h)
        with pytest.raises(InvalidArgument, match="kernel k_flag: "):
            s.commit_and_wait()           # InvalidArgument as raised, not a DeviceError
        upload(h, np.array([0, 0], np.int64))
        lib.kernel(k.name)(s, h)          # the flag was reset: the next call succeeds
        s.commit_and_wait()
        np.testing.assert_array_equal(h.numpy(), [0, 7])
        shims.delete_tensor_object(h)
        lib.close()
    o.close()
    s.close()


def test_sanitize_flags_enter_the_compile_and_the_key(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    k = iota_kernel([3], [1], base=50.5)
    plain = cpu.kernel_library([k])
    monkeypatch.setenv("AOTRT_CC_SANITIZE", "address,undefined")
    flags = cpu_mod.compile_flags()
    assert "-fsanitize=address,undefined" in flags and "-fno-sanitize-recover=all" in flags
    monkeypatch.setenv("AOTRT_CC_SANITIZE", "address; rm -rf /")
    with pytest.raises(InvalidArgument, match="AOTRT_CC_SANITIZE"):
        cpu_mod.compile_flags()
    monkeypatch.delenv("AOTRT_CC_SANITIZE")
    plain.close()


def test_sanitized_build_reports_an_out_of_bounds_write(tmp_path):
    """AOTRT_CC_SANITIZE=address,undefined with libasan preloaded: a kernel writing one
    element past its buffer is reported (ASan), where a plain build would not notice."""
    import os
    import shutil
    import subprocess
    import sys

    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    if not asan or not os.path.isabs(asan) or not os.path.exists(asan):
        pytest.skip("no libasan for this compiler")
    script = """
import numpy as np
from aotrt.runtime.device import get_device
from tests.runtime.backends.cpu.test_device import _HandWritten, _int64_kernel
cpu = get_device("cpu")
cpu.renderer = _HandWritten(lambda syms: "#include <stdint.h>\\nint32_t aotrt_error = 0;\\n" +
    "".join(f"void {s}(char **P, int64_t b, int64_t e) {{ ((int64_t *)P[0])[e] = 1; }}\\n"
            for s in syms))
k = _int64_kernel("k_oob")
lib = cpu.kernel_library([k])
buf = np.zeros(2, np.int64)
ptrs = (__import__("ctypes").c_void_p * 1)(buf.ctypes.data)
lib.loaded.call(lib.symbol(k.name), k.name, ptrs, 2)
print("not reported")
"""
    env = dict(os.environ, AOTRT_CACHE_DIR=str(tmp_path), AOTRT_CC_SANITIZE="address,undefined",
               LD_PRELOAD=asan, ASAN_OPTIONS="detect_leaks=0")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parents[4], timeout=300)
    assert proc.returncode != 0 and "AddressSanitizer" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow   # 18 s on 2 cores; the sanitized build's check above is the CI slice's
def test_sanitized_build_runs_a_threaded_kernel_cleanly(tmp_path):
    """ASan+UBSan with OpenMP: a kernel split across threads runs without a report and gives
    the single-threaded result."""
    import os
    import shutil
    import subprocess
    import sys

    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    if not asan or not os.path.isabs(asan) or not os.path.exists(asan):
        pytest.skip("no libasan for this compiler")
    script = """
import numpy as np
from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.memory import Owner, owner_scope
from tests.kernels.test_render_c import softmax_kernel
from tests.support import rand, upload
cpu = get_device("cpu")
k = softmax_kernel(1001, 257, "float32")
lib = cpu.kernel_library([k])
out = {}
for threads in (1, 2):
    s = cpu.create_stream(StreamOptions(threads=threads))
    o = Owner("san")
    with cpu.stream_guard(s), owner_scope(o):
        x, y = (shims.empty_strided([1001, 257], None, "float32") for _ in range(2))
        upload(x, rand((1001, 257), seed=5))
        lib.kernel(k.name)(s, x, y)
        out[threads] = y.numpy().tobytes()
        for h in (x, y):
            shims.delete_tensor_object(h)
    o.close()
    s.close()
print("equal" if out[1] == out[2] else "different")
"""
    env = dict(os.environ, AOTRT_CACHE_DIR=str(tmp_path), AOTRT_CC_SANITIZE="address,undefined",
               LD_PRELOAD=asan, ASAN_OPTIONS="detect_leaks=0")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parents[4], timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["equal"], proc.stderr[-2000:]
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr


@pytest.mark.parametrize("preset", [None, ("OMP_WAIT_POLICY", "ACTIVE"),
                                    ("GOMP_SPINCOUNT", "1000")])
def test_openmp_threads_spin_briefly_unless_the_process_says_otherwise(preset):
    """A fresh process: the device asks for a passive policy with a short spin before any
    kernel library loads the OpenMP runtime; a policy or spin count the process set stays,
    and then the device sets neither."""
    import os
    import subprocess
    import sys

    from aotrt.runtime.backends.cpu.device import OPENMP_ENV

    env = {k: v for k, v in os.environ.items() if k not in OPENMP_ENV}
    if preset is not None:
        env[preset[0]] = preset[1]
    script = ("import os\nfrom aotrt.runtime.device import get_device\nget_device('cpu')\n"
              "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parents[4], timeout=120)
    want = {None: ["PASSIVE", "30000"], "OMP_WAIT_POLICY": ["ACTIVE", "None"],
            "GOMP_SPINCOUNT": ["None", "1000"]}[preset and preset[0]]
    assert proc.stdout.split() == want, proc.stderr[-2000:]


def test_scratch_is_aligned_kept_per_thread_and_grown(cpu):
    """Library ops' scratch: 64-byte aligned, the same bytes on the next call from the
    same thread (no fresh pages each run), grown when asked for more, and each thread's
    its own (two streams' workers never share one)."""
    a = cpu.worker.scratch(1000)
    assert a.nbytes == 1000 and a.ctypes.data % 64 == 0
    b = cpu.worker.scratch(500)
    assert b.ctypes.data == a.ctypes.data
    c = cpu.worker.scratch(10 << 20)
    assert c.nbytes == 10 << 20 and c.ctypes.data % 64 == 0
    assert cpu.worker.scratch(100).ctypes.data == c.ctypes.data
    seen = []
    t = threading.Thread(target=lambda: seen.append(cpu.worker.scratch(1000)))
    t.start()
    t.join()
    assert not np.shares_memory(seen[0], c)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_streams_openmp_regions_take_its_thread_count(threads: int) -> None:
    """oneDNN's parallel regions, started on a stream's worker, get the stream's thread
    count (OpenMP reads it from the calling thread), not every core."""
    import ctypes
    import os

    dev = get_device("cpu")
    s = dev.create_stream(StreamOptions(threads=threads))
    try:
        seen: list[int] = []

        def ask() -> None:
            gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
            seen.append(gomp.omp_get_max_threads())
        s.record([], ask)
        s.commit_and_wait()
        assert seen == [threads]
    finally:
        s.close()


def test_openmp_scope_sets_the_count_for_the_block() -> None:
    """The calling thread's OpenMP count is `n` inside the block and as before after it."""
    dev = get_device("cpu")
    before = dev.openmp.max_threads()
    assert before >= 1
    with dev.openmp.scope(1):
        assert dev.openmp.max_threads() == 1
    assert dev.openmp.max_threads() == before
    with dev.openmp.scope(0):        # 0: unchanged
        assert dev.openmp.max_threads() == before
