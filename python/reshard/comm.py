"""Communicators (reshard.h, "Communicators"; reshard_mpi.h,
reshard_nccl.h, reshard_cuda_ipc.h).

A Comm holds both sides' ranks. Host transports (in-process threads,
MPI) move host memory; device transports (NCCL, CUDA IPC) move device
memory on a CUDA stream. Close a communicator after its plans.
"""
import atexit
import weakref

from ._reshard_cffi import ffi, lib
from ._life import Node
from .errors import InvalidArgumentError, UnsupportedError, check


def _mpi_handle_address(mpi_comm):
    """The address of an mpi4py communicator's MPI_Comm handle."""
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise UnsupportedError("reshard.Comm.mpi needs mpi4py (pip install "
                               "mpi4py, built for the same MPI)") from e
    if not isinstance(mpi_comm, MPI.Comm):
        raise InvalidArgumentError("reshard.Comm.mpi: %r is not an mpi4py "
                                   "communicator" % (mpi_comm,))
    if mpi_comm == MPI.COMM_NULL:
        raise InvalidArgumentError("reshard.Comm.mpi: MPI.COMM_NULL")
    return MPI._addressof(mpi_comm)


def _nccl_handle(comm):
    """ncclComm_t as an int, from: an int; a ctypes c_void_p; vLLM's
    PyNcclCommunicator (its .comm is a ctypes ncclComm_t); an nccl4py
    Communicator (its .ptr)."""
    if isinstance(comm, int) and not isinstance(comm, bool):
        value = comm
    elif hasattr(comm, "value") and not hasattr(comm, "comm"):
        value = comm.value  # ctypes.c_void_p
    elif hasattr(comm, "comm") and hasattr(getattr(comm, "comm"), "value"):
        value = comm.comm.value  # vLLM's PyNcclCommunicator (ctypes comm)
    elif hasattr(comm, "comm") and isinstance(getattr(comm.comm, "ptr", None), int):
        value = comm.comm.ptr  # newer vLLM: .comm is an nccl4py Communicator
    elif isinstance(getattr(comm, "ptr", None), int):
        value = comm.ptr  # nccl4py
    else:
        raise InvalidArgumentError(
            "reshard.Comm.nccl: %r is not an NCCL communicator (an ncclComm_t "
            "as an int or ctypes pointer, vLLM's PyNcclCommunicator, or an "
            "nccl4py Communicator)" % (comm,))
    if not value:
        raise InvalidArgumentError("reshard.Comm.nccl: the ncclComm_t is NULL "
                                   "(a disabled PyNcclCommunicator?)")
    return value


# Communicators over MPI (and device ones, which may bootstrap over it)
# still open at exit are closed by an atexit handler registered when the
# first is made, hence after mpi4py's own (which calls MPI_Finalize):
# atexit runs handlers last-in first-out, so ours runs before it, while
# MPI_Comm_free is still allowed.
_LIVE = weakref.WeakSet()
_ATEXIT = []


def _close_live():
    for c in list(_LIVE):
        c.close()


def _register_atexit():
    if not _ATEXIT:
        atexit.register(_close_live)
        _ATEXIT.append(True)


def _closing_also(destroy, other):
    """destroy, then other.close(): other is destroyed once its dependent
    (the object destroy destroys) has gone (_life.py)."""
    def fn(h):
        destroy(h)
        other.close()
    return fn


class Comm(Node):
    """A reshard communicator. Make one with Comm.mpi, Comm.ucx,
    Comm.nccl, Comm.cuda_ipc, Comm.ucx_cuda or InprocWorld(n).comm(rank)."""

    def __init__(self, *_a, **_k):
        raise TypeError("make communicators with reshard.Comm.mpi(comm), "
                        "Comm.ucx(rendezvous, rank, size), "
                        "Comm.nccl(comm), Comm.cuda_ipc(host), "
                        "Comm.ucx_cuda(host) or "
                        "reshard.InprocWorld(n).comm(rank)")

    @classmethod
    def _wrap(cls, handle, kind, device, keep=(), parent=None):
        self = cls.__new__(cls)
        self.kind = kind          #: "inproc", "mpi", "ucx", "nccl", "cuda_ipc" or "ucx_cuda"
        self.device = device      #: True: buffers are CUDA memory
        self._keep = keep         # objects the C communicator refers to
        # plans depend on it; it depends on its world or host communicator
        self._live(handle, lib.reshard_comm_destroy, parent,
                   "reshard.Comm (%s)" % kind)
        if kind in ("mpi", "ucx", "nccl", "cuda_ipc", "ucx_cuda"):
            _LIVE.add(self)
        return self

    @staticmethod
    def _create(fn, *args):
        out = ffi.new("reshard_comm_t **")
        check(fn(*args, out))
        return out[0]

    @classmethod
    def mpi(cls, mpi_comm):
        """A host communicator over an mpi4py communicator holding both
        sides (collective over it; reshard duplicates it)."""
        if not lib.RS_PY_HAVE_MPI:
            raise UnsupportedError("reshard.Comm.mpi: this reshard was built "
                                   "without MPI (install libopenmpi-dev and "
                                   "reinstall)")
        addr = _mpi_handle_address(mpi_comm)
        _register_atexit()
        h = cls._create(lib.rs_py_comm_create_mpi, ffi.cast("void *", addr))
        return cls._wrap(h, "mpi", False)

    @classmethod
    def ucx(cls, rendezvous, rank, size, timeout_ms=None, joining=False):
        """A host communicator of ``size`` processes over UCX, without MPI
        (reshard_comm_create_ucx): processes launched any way (Ray actors,
        subprocesses) call it with the same ``rendezvous`` "host:port" and
        their own ``rank``; rank 0 listens there. Collective; it raises
        TimeoutError if not every rank arrives within ``timeout_ms``
        (None: RESHARD_TIMEOUT_MS, else 60 s).

        ``joining=True``: this process takes the slot ``rank`` (not 0) of
        a process that left an existing communicator, whose staying ranks
        call ``comm.rejoin(rank)``, or a new rank of a communicator grown
        to ``size`` by ``comm.resize(join=...)``
        (reshard_comm_create_ucx_joining)."""
        if not lib.RS_PY_HAVE_UCX:
            raise UnsupportedError("reshard.Comm.ucx: this reshard was built "
                                   "without UCX (install libucx-dev and "
                                   "reinstall)")
        if not isinstance(rendezvous, str):
            raise InvalidArgumentError("reshard.Comm.ucx: rendezvous must be "
                                       "a \"host:port\" string, not %r"
                                       % (rendezvous,))
        if timeout_ms is not None and int(timeout_ms) < 1:
            raise InvalidArgumentError("reshard.Comm.ucx: timeout_ms must be "
                                       ">= 1 ms (None: the default)")
        _register_atexit()
        h = cls._create(lib.rs_py_comm_create_ucx_joining if joining
                        else lib.rs_py_comm_create_ucx, rendezvous.encode(),
                        int(rank), int(size),
                        0 if timeout_ms is None else int(timeout_ms))
        return cls._wrap(h, "ucx", False)

    def rejoin(self, rank, timeout_ms=None):
        """UCX only: the process of ``rank`` left and a new one takes its
        slot (it calls ``Comm.ucx(..., joining=True)``); ``rank`` may be a
        list of ranks that left together (a replica's tensor-parallel
        ranks: reshard_comm_ucx_rejoin_ranks), each replaced by a newcomer.
        Collective over every rank not named (reshard_comm_ucx_rejoin): the
        staying ranks keep this communicator, connect to the newcomers, and
        then keep their plans (``Plan.rejoin``) or create them again. Rank
        0, a rank out of range, named twice or this rank itself:
        InvalidArgumentError, nothing changed. TimeoutError when a newcomer
        did not arrive within rank 0's ``timeout_ms``: nothing changed on
        any staying rank, call it again to wait longer. Any other failure
        (a staying rank that never calls: TimeoutError naming it) leaves
        the communicator failed: close it."""
        if self.kind != "ucx":
            raise InvalidArgumentError("reshard.Comm.rejoin: a %s "
                                       "communicator; only UCX replaces "
                                       "ranks" % self.kind)
        if timeout_ms is not None and int(timeout_ms) < 1:
            raise InvalidArgumentError("reshard.Comm.rejoin: timeout_ms must "
                                       "be >= 1 ms (None: the default)")
        ranks = [int(r) for r in rank] if isinstance(rank, (list, tuple)) \
            else [int(rank)]
        check(lib.rs_py_comm_ucx_rejoin(self.handle,
                                        ffi.new("int[]", ranks or [0]),
                                        len(ranks),
                                        0 if timeout_ms is None
                                        else int(timeout_ms)))

    def resize(self, leave=(), join=0, timeout_ms=None):
        """UCX only: the ranks in ``leave`` (processes that left or died:
        a replica scaled down) are dropped and ``join`` new processes
        added (a replica scaled up), without rebuilding this communicator
        (reshard_comm_ucx_resize). Collective over every staying rank,
        with the same arguments. The staying ranks close up in their order
        (rank 0 stays 0; ``comm.rank`` and ``comm.size`` say the new
        numbering on return) and the newcomers take the ranks after them,
        each calling ``Comm.ucx(rendezvous, rank, new_size,
        joining=True)``. Every plan made before is refused from then on
        (InvalidUsageError): close it, and every rank creates the plans of
        the new layouts. Rank 0 leaving, a rank out of range, named twice
        or this rank itself, a negative count or nothing to change:
        InvalidArgumentError, nothing changed. TimeoutError when a
        newcomer did not arrive within rank 0's ``timeout_ms``: the
        numbering is as before, call it again to wait longer. Any other
        failure leaves the communicator failed: close it."""
        if self.kind != "ucx":
            raise InvalidArgumentError("reshard.Comm.resize: a %s "
                                       "communicator; only UCX resizes"
                                       % self.kind)
        if timeout_ms is not None and int(timeout_ms) < 1:
            raise InvalidArgumentError("reshard.Comm.resize: timeout_ms must "
                                       "be >= 1 ms (None: the default)")
        ranks = [int(r) for r in leave]
        check(lib.rs_py_comm_ucx_resize(self.handle,
                                        ffi.new("int[]", ranks or [0]),
                                        len(ranks), int(join),
                                        0 if timeout_ms is None
                                        else int(timeout_ms)))

    @classmethod
    def nccl(cls, comm, mpi_comm=None):
        """A device communicator over the caller's NCCL communicator
        (reshard_comm_create_nccl; with ``mpi_comm``, an mpi4py
        communicator of the same ranks, plan agreement runs on the host
        over MPI: reshard_comm_create_nccl_with_mpi). ``comm``: an
        ncclComm_t as int or ctypes pointer, vLLM's PyNcclCommunicator, or
        an nccl4py Communicator. A torch ProcessGroup is not accepted: torch
        reaches its ncclComm_t only through private, version-specific
        members (no public API in torch 2.x), so build a vLLM
        PyNcclCommunicator over the same ranks (or use Comm.mpi +
        Comm.cuda_ipc) instead."""
        if not lib.RS_PY_HAVE_CUDA:
            raise UnsupportedError("reshard.Comm.nccl: this reshard was built "
                                   "without CUDA/NCCL (reinstall where nvcc "
                                   "and NCCL are found)")
        value = _nccl_handle(comm)
        _register_atexit()
        if mpi_comm is None:
            h = cls._create(lib.rs_py_comm_create_nccl, value)
        else:
            if not lib.RS_PY_HAVE_MPI:
                raise UnsupportedError("reshard.Comm.nccl(mpi_comm=...): this "
                                       "reshard was built without MPI")
            addr = _mpi_handle_address(mpi_comm)
            h = cls._create(lib.rs_py_comm_create_nccl_with_mpi, value,
                            ffi.cast("void *", addr))
        return cls._wrap(h, "nccl", True, keep=(comm,))

    @classmethod
    def cuda_ipc(cls, host):
        """A device communicator of CUDA IPC between processes (or threads)
        of one node, bootstrapped over the host communicator ``host``
        (Comm.mpi, typically), on the current CUDA device. ``host`` must
        stay open until this one is closed."""
        if not lib.RS_PY_HAVE_CUDA:
            raise UnsupportedError("reshard.Comm.cuda_ipc: this reshard was "
                                   "built without CUDA")
        if not isinstance(host, Comm) or host.device:
            raise InvalidArgumentError("reshard.Comm.cuda_ipc: host must be a "
                                       "host reshard.Comm (mpi or inproc)")
        h = cls._create(lib.rs_py_comm_create_cuda_ipc, host.handle)
        return cls._wrap(h, "cuda_ipc", True, keep=(host,), parent=host)

    @classmethod
    def ucx_cuda(cls, host, own_host=False):
        """A device communicator whose transfers are UCX messages of GPU
        memory (reshard_comm_create_ucx_cuda), over the UCX communicator
        ``host`` (Comm.ucx: Ray actors, subprocesses), on the current CUDA
        device. A CUDA-enabled UCX (such as the libucx-cu13 wheel's, first
        on LD_LIBRARY_PATH) moves the device memory itself; through
        another (Debian's) every message goes through pinned host memory.
        Collective over ``host``, which must stay open until this one is
        closed and keep its membership (after ``host.rejoin`` or
        ``host.resize`` this communicator and its plans refuse every call:
        make them again). ``own_host=True``: closing this communicator
        closes ``host`` too (after this one: a UCX rank 0 holds the
        rendezvous port while ``host`` lives)."""
        if not lib.RS_PY_HAVE_UCX:
            raise UnsupportedError("reshard.Comm.ucx_cuda: this reshard was "
                                   "built without UCX (install libucx-dev and "
                                   "reinstall)")
        if not isinstance(host, Comm) or host.kind != "ucx":
            raise InvalidArgumentError("reshard.Comm.ucx_cuda: host must be a "
                                       "reshard.Comm.ucx communicator")
        h = cls._create(lib.rs_py_comm_create_ucx_cuda, host.handle)
        c = cls._wrap(h, "ucx_cuda", True, keep=(host,), parent=host)
        if own_host:
            c._destroy_fn = _closing_also(c._destroy_fn, host)
        return c

    @property
    def rank(self):
        return lib.reshard_comm_rank(self.handle)

    @property
    def size(self):
        return lib.reshard_comm_size(self.handle)

    def __repr__(self):
        if self.closed:
            return "<reshard.Comm %s (closed)>" % self.kind
        return "<reshard.Comm %s rank %d of %d>" % (self.kind, self.rank,
                                                    self.size)


class InprocWorld(Node):
    """``n`` ranks as threads of this process (tests, single-process
    tools): ``world.comm(rank)`` in each thread. The GIL is released in
    every reshard call, so the threads run the collectives concurrently."""

    def __init__(self, nranks):
        out = ffi.new("reshard_inproc_world_t **")
        check(lib.reshard_inproc_world_create(int(nranks), out))
        self.size = int(nranks)
        # its communicators depend on it: close() closes them first
        self._live(out[0], lib.reshard_inproc_world_destroy, None,
                   "reshard.InprocWorld")

    def comm(self, rank):
        """Rank ``rank``'s communicator (once per rank)."""
        out = ffi.new("reshard_comm_t **")
        check(lib.reshard_comm_create_inproc(self.handle, int(rank), out))
        return Comm._wrap(out[0], "inproc", False, keep=(self,), parent=self)
