"""reshard_selftest.h: a rank's buffers for a layout, filled with values
that are a function of (tensor name, step, global element index) only, and
checked element by element, with every byte outside the fragments
sentinel-filled and checked to stay so. The memory is the C library's;
``arrays`` exposes it as numpy uint8 arrays (no copy) to pass to execute.
"""
from ._reshard_cffi import ffi, lib
from .errors import InvalidUsageError, check


class SelfTest:
    """SelfTest(layout, rank, fill_step): this rank's buffers of ``layout``
    (fill_step >= 0: filled with that step's values; -1: sentinel only)."""

    def __init__(self, layout, rank, fill_step=-1):
        self._s = ffi.new("reshard_selftest_t *")
        self._layout = layout  # fill and check walk its fragments
        self.rank = int(rank)
        check(lib.reshard_selftest_alloc(self._s, layout.handle, self.rank,
                                         int(fill_step)))
        import numpy as np
        s = self._s
        #: {buffer id: numpy uint8 array} of the buffers the rank holds
        self.arrays = {
            b: np.frombuffer(ffi.buffer(s.ptr[b], s.bytes[b]), dtype=np.uint8)
            for b in range(s.nbuf) if s.ptr[b] != ffi.NULL and s.bytes[b]}

    def _live(self):
        if self._s is None:
            raise InvalidUsageError("reshard.SelfTest: used after close()")
        return self._s

    def fill(self, step):
        """Writes step's values into every fragment (a training update)."""
        lib.reshard_selftest_fill(self._live(), self._layout.handle, int(step))

    def check(self, step, label="check"):
        """Wrong fragment elements plus modified bytes outside fragments
        (0: all correct); the first few are printed to stderr."""
        return int(lib.reshard_selftest_check(self._live(), self._layout.handle,
                                              self.rank, int(step),
                                              label.encode()))

    def close(self):
        s, self._s = getattr(self, "_s", None), None
        self.arrays = {}
        if s is not None:
            lib.reshard_selftest_free(s)

    __del__ = close

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
