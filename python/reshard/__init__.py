"""reshard: move sharded model weights from one parallel layout to another
(RL weight sync: Megatron training ranks -> vLLM inference ranks).

A thin binding of the C library (include/reshard.h): the same objects,
errors as exceptions, the GIL released in every C call (threads can be
ranks). See python/README.md, "Python in five minutes".

    import reshard
    src, dst = reshard.Layout(), reshard.Layout()
    ...                                   # describe both sides
    with reshard.Plan(comm, src, dst) as plan:
        bound = plan.bind(src_arrays, dst_arrays)   # checked once
        for step in range(steps):
            plan.execute(bound, version=step + 1)
"""
from ._reshard_cffi import ffi as _ffi, lib as _lib
from .errors import (Error, InvalidArgumentError, InvalidUsageError,
                     OutOfMemoryError, MismatchError, BackendError,
                     RemoteError, TimeoutError, UnsupportedError,
                     InternalError, InDoubtError)
from .layout import Layout, Shard, Replicate, Part, Fragment, TensorInfo
from .comm import Comm, InprocWorld
from .plan import Plan, Bound, Stats, PeerStats, Status, Estimate, lower_bound
from .selftest import SelfTest
from . import dtypes, models, dtensor

def library_version():
    """The linked libreshard's version code (major * 10000 + minor * 100 +
    patch)."""
    return _lib.reshard_version()


#: The package's version: the library's (written once, in reshard.h).
__version__ = "%d.%d.%d" % (library_version() // 10000, library_version() // 100 % 100, library_version() % 100)


#: Which transports this build has.
HAVE_MPI = bool(_lib.RS_PY_HAVE_MPI)
HAVE_CUDA = bool(_lib.RS_PY_HAVE_CUDA)
HAVE_UCX = bool(_lib.RS_PY_HAVE_UCX)

__all__ = [
    "Error", "InvalidArgumentError", "InvalidUsageError", "OutOfMemoryError",
    "MismatchError", "BackendError", "RemoteError", "TimeoutError",
    "UnsupportedError", "InternalError", "InDoubtError", "Layout", "Shard", "Replicate",
    "Part", "Fragment", "TensorInfo", "Comm", "InprocWorld", "Plan", "Bound",
    "Stats", "PeerStats", "Status", "Estimate", "lower_bound", "SelfTest",
    "dtypes", "models", "dtensor", "library_version", "HAVE_MPI", "HAVE_CUDA", "HAVE_UCX",
]
