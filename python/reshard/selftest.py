"""reshard_selftest.h: a rank's buffers for a layout, filled with values
that are a function of (tensor name, step, global element index) only, and
checked element by element, with every byte outside the fragments
sentinel-filled and checked to stay so. The memory is the C library's;
``arrays`` exposes it as numpy uint8 arrays (no copy) to pass to execute.
"""
from ._reshard_cffi import ffi, lib
from .errors import InvalidUsageError, check


_ARRAY = []


def _owned(buf, owner):
    """A numpy uint8 array over buf that keeps ``owner`` alive (an ndarray
    subclass, so it can carry the reference; its views keep it)."""
    import numpy as np
    if not _ARRAY:
        _ARRAY.append(type("SelfTestArray", (np.ndarray,), {}))
    a = np.frombuffer(buf, dtype=np.uint8).view(_ARRAY[0])
    a._reshard_owner = owner
    return a


class SelfTest:
    """SelfTest(layout, rank, fill_step): this rank's buffers of ``layout``
    (fill_step >= 0: filled with that step's values; -1: sentinel only)."""

    def __init__(self, layout, rank, fill_step=-1):
        self._s = ffi.new("reshard_selftest_t *")
        self._layout = layout  # fill and check walk its fragments
        self.rank = int(rank)
        check(lib.reshard_selftest_alloc(self._s, layout.handle, self.rank,
                                         int(fill_step)))
        s = self._s
        #: {buffer id: numpy uint8 array} of the buffers the rank holds;
        #: each keeps this object (so the C memory) alive, so a Bound made
        #: of them stays valid after close()
        self.arrays = {
            b: _owned(ffi.buffer(s.ptr[b], s.bytes[b]), self)
            for b in range(s.nbuf) if s.ptr[b] != ffi.NULL and s.bytes[b]}
        self._closed = False

    def _live(self):
        if getattr(self, "_closed", True) or self._s is None:
            raise InvalidUsageError("reshard.SelfTest: used after close()")
        return self._s

    def fill(self, step):
        """Writes step's values into every fragment (a training update)."""
        lib.reshard_selftest_fill(self._live(), self._layout.handle, int(step))

    def check(self, step, label="check", src=None):
        """Wrong fragment elements plus modified bytes outside fragments
        (0: all correct); the first few are printed to stderr. ``src``: the
        source Layout, for destinations whose tensors change dtype or are
        quantized to fp8 blocks on the way (checked against the self-test's
        reference casts and quantizer)."""
        if src is None:
            return int(lib.reshard_selftest_check(self._live(), self._layout.handle,
                                                  self.rank, int(step),
                                                  label.encode()))
        return int(lib.reshard_selftest_check_from(self._live(), self._layout.handle,
                                                   src.handle, self.rank, int(step),
                                                   label.encode()))

    def close(self):
        """Drops this object's arrays; the memory is freed once no array
        of it (nor a Bound holding one) is left."""
        self._closed = True
        self.arrays = {}

    def __del__(self):
        s, self._s = getattr(self, "_s", None), None
        if s is not None:
            lib.reshard_selftest_free(s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def expected(name, step, linear, esize):
    """The bytes of element ``linear`` (global row-major index) of tensor
    ``name`` at ``step`` (reshard_selftest_expected)."""
    out = ffi.new("unsigned char[]", int(esize))
    lib.reshard_selftest_expected(name.encode(), int(step), int(linear),
                                  int(esize), out)
    return bytes(ffi.buffer(out, int(esize)))


_VALUES = {"bits": 0, "finite": 1}


def set_values(mode):
    """What the self-test writes into float tensors, process-wide
    (reshard_selftest_set_values): ``"bits"`` (default: every bit pattern,
    NaNs included) or ``"finite"`` (weight-like finite values, for timing
    converting or quantizing syncs)."""
    if mode not in _VALUES:
        raise ValueError("set_values: mode %r: expected 'bits' or 'finite'" % (mode,))
    lib.reshard_selftest_set_values(_VALUES[mode])


def get_values():
    """The self-test's current values mode, ``"bits"`` or ``"finite"``."""
    return "finite" if lib.reshard_selftest_get_values() else "bits"
