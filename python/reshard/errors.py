"""reshard's result codes as exceptions.

Every failing C call raises the subclass of :class:`Error` for its
``reshard_result_t``, with ``reshard_last_error()`` (which names the
tensor, rank and field at fault) as the message. Checks the binding does
itself before calling C (buffer sizes, dtypes, devices) raise the same
classes. Each class also derives from the closest built-in exception, so
``except ValueError`` catches a bad argument and ``except TimeoutError``
a deadline.
"""
import builtins

from ._reshard_cffi import ffi, lib

__all__ = [
    "Error", "InvalidArgumentError", "InvalidUsageError", "OutOfMemoryError",
    "MismatchError", "BackendError", "RemoteError", "TimeoutError",
    "UnsupportedError", "InternalError", "InDoubtError", "check",
]


class Error(Exception):
    """A reshard call failed. ``code`` is the C result (reshard_result_t),
    ``result`` its fixed description (reshard_result_string)."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def result(self):
        return ffi.string(lib.reshard_result_string(self.code)).decode()


class InvalidArgumentError(Error, ValueError):
    """RESHARD_ERROR_INVALID_ARGUMENT: a malformed argument or description."""
    code = lib.RESHARD_ERROR_INVALID_ARGUMENT


class InvalidUsageError(Error, RuntimeError):
    """RESHARD_ERROR_INVALID_USAGE: not allowed in this state (a failed
    plan, a closed object, a plan without a topology asked to estimate)."""
    code = lib.RESHARD_ERROR_INVALID_USAGE


class OutOfMemoryError(Error, MemoryError):
    """RESHARD_ERROR_OUT_OF_MEMORY."""
    code = lib.RESHARD_ERROR_OUT_OF_MEMORY


class MismatchError(Error, RuntimeError):
    """RESHARD_ERROR_MISMATCH: ranks disagree (descriptions, plans, versions,
    or a checksum under verify)."""
    code = lib.RESHARD_ERROR_MISMATCH


class BackendError(Error, RuntimeError):
    """RESHARD_ERROR_BACKEND: MPI, NCCL or CUDA failed on this rank."""
    code = lib.RESHARD_ERROR_BACKEND


class RemoteError(Error, RuntimeError):
    """RESHARD_ERROR_REMOTE: another rank failed; this one stopped."""
    code = lib.RESHARD_ERROR_REMOTE


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (reshard.TimeoutError)
    """RESHARD_ERROR_TIMEOUT: a wait passed the plan's deadline."""
    code = lib.RESHARD_ERROR_TIMEOUT


class UnsupportedError(Error, NotImplementedError):
    """RESHARD_ERROR_UNSUPPORTED: valid, but not in this build or version."""
    code = lib.RESHARD_ERROR_UNSUPPORTED


class InternalError(Error, RuntimeError):
    """RESHARD_ERROR_INTERNAL: a bug in reshard; please report the message."""
    code = lib.RESHARD_ERROR_INTERNAL


class InDoubtError(Error, RuntimeError):
    """RESHARD_ERROR_IN_DOUBT: with double buffering, this rank voted to
    commit and did not learn before the deadline whether every rank did
    (MPI). Nothing flipped; ``Plan.resolve()`` (or the next execute)
    settles the version from the same vote. See docs/RELIABILITY.md, "The
    commit protocol"."""
    code = lib.RESHARD_ERROR_IN_DOUBT


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, InvalidUsageError, OutOfMemoryError, MismatchError,
    BackendError, RemoteError, TimeoutError, UnsupportedError, InternalError,
    InDoubtError)}


def error_for(code, message=None):
    """The exception for result ``code``; message defaults to
    reshard_last_error() (of this thread, so call right after the C call)."""
    if message is None:
        message = ffi.string(lib.reshard_last_error()).decode(errors="replace")
        if not message:
            message = ffi.string(lib.reshard_result_string(code)).decode()
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error("%s (result %d)" % (message, code), code)
    return cls(message)


def check(code):
    """Raises the exception of a failed C result; returns None on success."""
    if code != lib.RESHARD_SUCCESS:
        raise error_for(code)
