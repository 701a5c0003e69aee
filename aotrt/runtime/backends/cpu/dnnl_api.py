"""The oneDNN 3.2 C API through ctypes: where `libdnnl.so.3` comes from (the `onednn-cpu-gomp`
wheel), the signatures aotrt binds, and loading it once. The device state and primitives
built on it are backends/cpu/dnnl.py.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("aotrt.runtime.backends.cpu.dnnl")

DIST = "onednn-cpu-gomp"
SONAME = "libdnnl.so.3"
MAX_NDIMS = 12

VoidP = ctypes.c_void_p
_p = VoidP
#: a dims array of the C API (dnnl_dims_t)
Dims = ctypes.c_int64 * MAX_NDIMS
_Dims = Dims


class ExecArg(ctypes.Structure):
    """dnnl_exec_arg_t: an argument index and its memory object."""

    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "dnnl_engine_create": (ctypes.c_int, [ctypes.POINTER(_p), ctypes.c_int, ctypes.c_size_t]),
    "dnnl_stream_create": (ctypes.c_int, [ctypes.POINTER(_p), _p, ctypes.c_uint]),
    "dnnl_stream_wait": (ctypes.c_int, [_p]),
    "dnnl_stream_destroy": (ctypes.c_int, [_p]),
    "dnnl_memory_desc_create_with_strides": (
        ctypes.c_int, [ctypes.POINTER(_p), ctypes.c_int, _Dims, ctypes.c_int, _Dims]),
    "dnnl_memory_desc_create_with_tag": (
        ctypes.c_int, [ctypes.POINTER(_p), ctypes.c_int, _Dims, ctypes.c_int, ctypes.c_int]),
    "dnnl_memory_desc_destroy": (ctypes.c_int, [_p]),
    "dnnl_memory_desc_equal": (ctypes.c_int, [_p, _p]),
    "dnnl_memory_desc_get_size": (ctypes.c_size_t, [_p]),
    "dnnl_primitive_attr_create": (ctypes.c_int, [ctypes.POINTER(_p)]),
    "dnnl_primitive_attr_destroy": (ctypes.c_int, [_p]),
    "dnnl_primitive_attr_set_scratchpad_mode": (ctypes.c_int, [_p, ctypes.c_int]),
    "dnnl_primitive_attr_set_post_ops": (ctypes.c_int, [_p, _p]),
    "dnnl_post_ops_create": (ctypes.c_int, [ctypes.POINTER(_p)]),
    "dnnl_post_ops_append_eltwise": (ctypes.c_int, [_p, ctypes.c_int, ctypes.c_float,
                                                    ctypes.c_float]),
    "dnnl_post_ops_append_binary": (ctypes.c_int, [_p, ctypes.c_int, _p]),
    "dnnl_post_ops_destroy": (ctypes.c_int, [_p]),
    "dnnl_convolution_forward_primitive_desc_create": (
        ctypes.c_int, [ctypes.POINTER(_p), _p, ctypes.c_int, ctypes.c_int, _p, _p, _p, _p,
                       _Dims, _Dims, _Dims, _Dims, _p]),
    "dnnl_matmul_primitive_desc_create": (
        ctypes.c_int, [ctypes.POINTER(_p), _p, _p, _p, _p, _p, _p]),
    "dnnl_reorder_primitive_desc_create": (
        ctypes.c_int, [ctypes.POINTER(_p), _p, _p, _p, _p, _p]),
    "dnnl_primitive_desc_query": (ctypes.c_int, [_p, ctypes.c_int, ctypes.c_int, _p]),
    "dnnl_primitive_desc_query_md": (_p, [_p, ctypes.c_int, ctypes.c_int]),
    "dnnl_primitive_desc_destroy": (ctypes.c_int, [_p]),
    "dnnl_primitive_create": (ctypes.c_int, [ctypes.POINTER(_p), _p]),
    "dnnl_primitive_execute": (ctypes.c_int, [_p, _p, ctypes.c_int, ctypes.POINTER(ExecArg)]),
    "dnnl_primitive_destroy": (ctypes.c_int, [_p]),
    "dnnl_memory_create": (ctypes.c_int, [ctypes.POINTER(_p), _p, _p, _p]),
    "dnnl_memory_set_data_handle": (ctypes.c_int, [_p, _p]),
    "dnnl_memory_destroy": (ctypes.c_int, [_p]),
}


def find_library() -> Path | None:
    """libdnnl.so.3 of the installed onednn-cpu-gomp distribution, or None."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == SONAME:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    return None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded libdnnl with its signatures bound, or None (logged) where it is missing."""
    path = find_library()
    if path is None:
        log.debug("oneDNN: %s is not installed; cpu convolutions use numpy", DIST)
        return None
    try:
        lib = ctypes.CDLL(str(path))
        for name, (res, args) in _SIGNATURES.items():
            # getattr, not lib[name]: an attribute is cached on the CDLL, so the signature
            # set here is the one every later call uses.
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
    except (OSError, AttributeError) as e:
        log.debug("oneDNN: cannot load %s (%s); cpu convolutions use numpy", path, e)
        return None
    return lib
