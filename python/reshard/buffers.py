"""What an array is, for execute: address, bytes, device, dtype, layout.

Accepted (in this order): torch tensors (by duck typing: data_ptr,
is_contiguous, element_size; torch is never imported here), objects with
``__cuda_array_interface__`` (CuPy, Numba, torch CUDA tensors) or
``__array_interface__`` (numpy and most host arrays), objects with
``__dlpack__`` (CPU or CUDA), and writable or read-only buffers
(bytearray, memoryview). Whatever is accepted is kept referenced by the
binding that uses it, so its memory outlives the executes.
"""
import ctypes
import sys
from dataclasses import dataclass

from . import dtypes as _dt


@dataclass
class ArrayInfo:
    ptr: int
    nbytes: int
    device: bool          # CUDA memory (device, managed or mapped host)
    dtype: object         # reshard_dtype_t, or None (no such reshard type)
    contiguous: bool
    readonly: bool
    keep: tuple           # objects that keep the memory alive
    kind: str             # what the object was taken as, for messages
    unusable: str = None  # why reshard cannot use it at all (None: it can)


def _c_contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _typestr_dtype(typestr):
    """(reshard dtype or None, itemsize) of an array interface typestr."""
    import numpy as np
    dt = np.dtype(typestr)
    return _dt.to_c_or_none(dt.name), dt.itemsize


def _interface(obj, iface, device, kind):
    data = iface["data"]
    if data is None:
        return None  # the data is behind the buffer protocol
    ptr, readonly = data[0], bool(data[1])
    shape = tuple(iface["shape"])
    typestr = iface["typestr"]
    dtype, itemsize = _typestr_dtype(typestr)
    unusable = None
    if typestr[0] == ">" and itemsize > 1:
        unusable = "big-endian data (%s); reshard moves little-endian" % typestr
    # numpy arrays say their dtype by name (ml_dtypes' bfloat16 is '<V2')
    named = getattr(getattr(obj, "dtype", None), "name", None)
    if named is not None:
        dtype = _dt.to_c_or_none(named) if dtype is None else dtype
    n = 1
    for s in shape:
        n *= s
    contiguous = _c_contiguous(shape, iface.get("strides"), itemsize)
    return ArrayInfo(int(ptr), n * itemsize, device, dtype, contiguous,
                     readonly, (obj,), kind, unusable)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# dlpack.h: kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3, kDLCUDAManaged 13; codes
# kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
_DL_DEVICE = {1: False, 2: True, 3: True, 13: True}
_DL_DTYPES = {(2, 16): "f16", (2, 32): "f32", (2, 64): "f64", (4, 16): "bf16",
              (0, 8): "i8", (1, 8): "u8", (0, 32): "i32", (1, 32): "u32",
              (0, 64): "i64", (1, 64): "u64", (6, 8): "bool"}


def _dlpack(obj):
    # The legacy (unversioned) capsule: every producer gives it when no
    # max_version is asked. It stays unconsumed and referenced, so the
    # producer's memory lives until the binding drops it.
    capsule = obj.__dlpack__()
    t = _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))
    if t.device.device_type not in _DL_DEVICE:
        return None
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = max(t.dtype.bits // 8, 1) * max(t.dtype.lanes, 1)
    strides = (None if not t.strides else
               tuple(t.strides[i] * itemsize for i in range(t.ndim)))
    n = 1
    for s in shape:
        n *= s
    name = _DL_DTYPES.get((t.dtype.code, t.dtype.bits))
    return ArrayInfo(int(t.data or 0) + int(t.byte_offset), n * itemsize,
                     _DL_DEVICE[t.device.device_type],
                     _dt.to_c(name) if name else None,
                     _c_contiguous(shape, strides, itemsize), False,
                     (obj, capsule), "dlpack")


_NP_DTYPES = {}  # numpy dtype -> reshard dtype or None (dtype.name is slow)


def _numpy(obj):
    dt = obj.dtype
    try:
        rdt = _NP_DTYPES[dt]
    except KeyError:
        rdt = _NP_DTYPES[dt] = _dt.to_c_or_none(dt.name)
    flags = obj.flags
    return ArrayInfo(obj.__array_interface__["data"][0], obj.nbytes, False,
                     rdt, flags.c_contiguous, not flags.writeable, (obj,),
                     "numpy array")


def describe(obj):
    """ArrayInfo of an array-like; None when it is none of the accepted
    kinds."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy(obj)
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous") and \
            hasattr(obj, "element_size"):
        dev = getattr(getattr(obj, "device", None), "type", "cpu")
        keep = (obj,)
        storage = getattr(obj, "untyped_storage", None)
        if storage is not None:
            keep = (obj, storage())  # survives param.data = other
        return ArrayInfo(int(obj.data_ptr()), obj.numel() * obj.element_size(),
                         dev == "cuda", _dt.to_c_or_none(obj.dtype),
                         bool(obj.is_contiguous()), False, keep,
                         "torch tensor on %s" % dev,
                         None if dev in ("cpu", "cuda") else
                         "memory on a %s device (reshard moves host or CUDA "
                         "memory)" % dev)
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is not None:
        return _interface(obj, iface, True, "__cuda_array_interface__")
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        info = _interface(obj, iface, False, "__array_interface__")
        if info is not None:
            return info
    if hasattr(obj, "__dlpack__"):
        info = _dlpack(obj)
        if info is not None:
            return info
    try:
        mv = memoryview(obj)
    except TypeError:
        return None
    from ._reshard_cffi import ffi
    ro = mv.readonly
    if not mv.c_contiguous:  # cffi cannot point at it: report, not raise
        return ArrayInfo(0, mv.nbytes, False, None, False, ro, (obj, mv),
                         "buffer")
    cbuf = ffi.from_buffer(mv) if ro else ffi.from_buffer(mv, require_writable=True)
    return ArrayInfo(int(ffi.cast("uintptr_t", cbuf)), mv.nbytes, False,
                     None, True, ro, (obj, mv, cbuf), "buffer")
