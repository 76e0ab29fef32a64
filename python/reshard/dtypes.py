"""reshard dtypes: the C library's names (those reshard_perf --dtype takes),
and their numpy / torch / ml_dtypes equivalents.

A dtype argument may be a name ("bf16", "f32", "fp8e4m3", ...; common
aliases such as "bfloat16" and "float32" too), a numpy dtype, a torch
dtype, or the C enum value as an int. The mapping is by name, never by
importing torch: torch is optional.
"""
from ._reshard_cffi import ffi, lib
from .errors import InvalidArgumentError

#: reshard_dtype_t value -> the library's name (reshard_dtype_name).
NAMES = {d: ffi.string(lib.reshard_dtype_name(d)).decode()
         for d in range(lib.RESHARD_NUM_DTYPES)}
_BY_NAME = {n: d for d, n in NAMES.items()}

#: The library's names -> torch's (torch.<name>); numpy spells the same
#: types the same way, except bfloat16 and the fp8 types it lacks.
TORCH_NAMES = {
    "bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64",
    "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2", "i8": "int8",
    "u8": "uint8", "i32": "int32", "u32": "uint32", "i64": "int64",
    "u64": "uint64", "bool": "bool",
}

# Other spellings of the same types: numpy's and torch's names (torch
# dtypes print as "torch.bfloat16"; numpy's as "float32"; ml_dtypes' as
# "bfloat16" / "float8_e4m3fn"), and a few short ones.
_ALIASES = {t: r for r, t in TORCH_NAMES.items()}
_ALIASES.update({"half": "f16", "float": "f32", "double": "f64",
                 "bool_": "bool", "int": "i32", "long": "i64"})

#: reshard_dtype_t values of floating-point types: an array of another
#: float type is the wrong data, not a raw view.
FLOATS = {lib.RESHARD_BF16, lib.RESHARD_FP16, lib.RESHARD_FP32,
          lib.RESHARD_FP64, lib.RESHARD_FP8_E4M3, lib.RESHARD_FP8_E5M2}


def _spelling(dtype):
    if isinstance(dtype, str):
        return dtype
    name = str(dtype)
    if name.startswith("torch."):
        return name[len("torch."):]
    # numpy dtypes and scalar types; ml_dtypes' types print their name too
    return getattr(dtype, "name", None) or getattr(dtype, "__name__", name)


def to_c(dtype, what="dtype"):
    """The reshard_dtype_t of ``dtype``; InvalidArgumentError naming
    ``what`` when there is none."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if 0 <= dtype < lib.RESHARD_NUM_DTYPES:
            return dtype
        raise InvalidArgumentError("%s: %d is not a reshard dtype (0 .. %d)"
                                   % (what, dtype, lib.RESHARD_NUM_DTYPES - 1))
    name = _spelling(dtype)
    name = _ALIASES.get(name, name)
    if name in _BY_NAME:
        return _BY_NAME[name]
    raise InvalidArgumentError("%s: unknown dtype %r (known: %s)"
                               % (what, dtype, ", ".join(_BY_NAME)))


def to_c_or_none(dtype):
    """reshard_dtype_t of an array's dtype, or None when reshard has no
    such type (complex, strings, numpy 'V' records)."""
    try:
        return to_c(dtype)
    except InvalidArgumentError:
        return None


def name(dtype):
    """The library's name of a reshard_dtype_t."""
    return NAMES[dtype]


def size(dtype):
    """Bytes per element."""
    return int(lib.reshard_dtype_size(dtype))


def torch_name(dtype):
    """torch's name of a reshard_dtype_t (getattr(torch, name))."""
    return TORCH_NAMES[NAMES[dtype]]


def numpy_storage(dtype):
    """A numpy dtype of the same element size to hold a reshard_dtype_t's
    bytes: the same type where numpy has it, else raw bits (uint16 for
    bf16, uint8 for the fp8 types)."""
    import numpy as np
    name = torch_name(dtype)
    if name == "bfloat16":
        return np.dtype(np.uint16)
    if name.startswith("float8"):
        return np.dtype(np.uint8)
    return np.dtype(name)
