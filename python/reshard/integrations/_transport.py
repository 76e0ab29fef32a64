"""How the framework adapters make their communicator, by name:

  "nccl"          a PyNcclCommunicator (vLLM's) over vLLM's
                  StatelessProcessGroup at master_address:master_port, as
                  vLLM's own nccl weight-transfer engine builds its group
                  (SGLang's classes of the same names where vLLM is not
                  installed; a GPU per process)
  "mpi"           mpi4py's COMM_WORLD (every process of the job in one MPI
                  launch)
  "ucx"           reshard.Comm.ucx at master_address:master_port (host
                  memory; processes launched any way, e.g. Ray actors:
                  the rank at 0 listens there)
  "ucx_cuda"      reshard.Comm.ucx_cuda over such a communicator (GPU
                  memory over UCX: moved by a CUDA-enabled UCX, through
                  pinned host memory by another); closing it closes both
  "inproc:<key>"  the InprocWorld registered as WORLDS[key]: ranks as
                  threads of one process (tests, single-process tools)
"""
import reshard
from ..errors import InvalidArgumentError

#: "inproc:<key>" transports: key -> reshard.InprocWorld.
WORLDS = {}


def comm(transport, rank, world_size, master_address, master_port, device):
    """The communicator of ``transport`` at ``rank`` of ``world_size``
    (collective over its ranks); InvalidArgumentError when the transport
    places this process elsewhere than the adapter computed."""
    if transport == "mpi":
        from mpi4py import MPI
        c = reshard.Comm.mpi(MPI.COMM_WORLD)
    elif transport in ("ucx", "ucx_cuda"):
        if master_address is None or master_port is None:
            raise InvalidArgumentError("reshard integration: transport %s "
                                       "needs master_address and master_port"
                                       % transport)
        c = reshard.Comm.ucx("%s:%d" % (master_address, int(master_port)),
                             rank, world_size)
        if transport == "ucx_cuda":
            try:
                c = reshard.Comm.ucx_cuda(c, own_host=True)
            except BaseException:
                c.close()  # (frees the rendezvous port on rank 0)
                raise
    elif transport.startswith("inproc:"):
        world = WORLDS.get(transport[len("inproc:"):])
        if world is None:
            raise InvalidArgumentError("reshard integration: transport %r: no "
                                       "world registered under that key in "
                                       "reshard.integrations.WORLDS"
                                       % transport)
        c = world.comm(rank)
    elif transport == "nccl":
        PyNcclCommunicator, StatelessProcessGroup, unpinned = _pynccl()
        if master_address is None or master_port is None:
            raise InvalidArgumentError("reshard integration: transport nccl "
                                       "needs master_address and master_port")
        if device is None:  # PyNcclCommunicator wants a torch.device
            import torch
            device = torch.device("cuda", torch.cuda.current_device())
        pg = StatelessProcessGroup.create(host=master_address,
                                          port=master_port, rank=rank,
                                          world_size=world_size)
        # vLLM builds its weight-transfer communicators without the NCCL_*
        # settings batch-invariant mode pins (nccl_common.py,
        # stateless_init_process_group: unpinned_nccl_env): a communicator
        # shared by processes with different NCCL_* settings can hang.
        with unpinned():
            c = reshard.Comm.nccl(PyNcclCommunicator(pg, device=device))
    else:
        raise InvalidArgumentError("reshard integration: transport %r: "
                                   "'nccl', 'mpi', 'ucx', 'ucx_cuda' or "
                                   "'inproc:<key>'"
                                   % (transport,))
    if c.rank != rank or c.size != world_size:
        got = (c.rank, c.size)
        c.close()
        raise InvalidArgumentError(
            "reshard integration: the %s communicator has this process at "
            "rank %d of %d, the engine computed rank %d of %d"
            % ((transport,) + got + (rank, world_size)))
    return c


def leave(transport):
    """Takes part in creating the communicator of ``transport`` and closes
    it again, for a process that refuses before knowing its rank: where
    that creation is collective and has no deadline (MPI's Comm_dup over
    COMM_WORLD, which needs no rank), its peers would otherwise wait in it
    forever; they go on to plan creation instead, whose deadline ends it.
    Creating a "ucx" or "inproc:" communicator has a deadline (nothing to
    do); "nccl" needs this process's rank and has none (docs/LIMITS.md)."""
    if transport == "mpi":
        from mpi4py import MPI
        reshard.Comm.mpi(MPI.COMM_WORLD).close()


def _pynccl():
    """(PyNcclCommunicator, StatelessProcessGroup, env context) of vLLM
    (vllm/distributed/device_communicators/pynccl.py, distributed/utils.py;
    vllm/utils/nccl.py unpinned_nccl_env), or of SGLang where vLLM is not
    installed (sglang/srt/distributed/device_communicators/pynccl.py and
    distributed/utils.py, the same classes and signatures; SGLang pins no
    NCCL_* settings)."""
    try:
        from vllm.distributed.device_communicators.pynccl import \
            PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup
        from vllm.utils.nccl import unpinned_nccl_env
        return PyNcclCommunicator, StatelessProcessGroup, unpinned_nccl_env
    except ImportError:
        import contextlib
        from sglang.srt.distributed.device_communicators.pynccl import \
            PyNcclCommunicator
        from sglang.srt.distributed.utils import StatelessProcessGroup
        return PyNcclCommunicator, StatelessProcessGroup, contextlib.nullcontext


def in_thread(fn, *args, deadline_s):
    """Runs fn(*args) in a thread (a control-plane call that must overlap
    this rank's collective); returns join(), which re-raises its exception
    and gives up with reshard.TimeoutError after deadline_s."""
    import threading
    out = {}

    def body():
        try:
            fn(*args)
        except BaseException as e:
            out["e"] = e
    t = threading.Thread(target=body, daemon=True)
    t.start()

    def join():
        t.join(deadline_s)
        if t.is_alive():
            raise reshard.TimeoutError(
                "reshard integration: %s did not return within %.0f s"
                % (getattr(fn, "__name__", fn), deadline_s))
        if "e" in out:
            raise out["e"]
    return join


def deadline_s(timeout_ms):
    """How long a control-plane call may take: the plan's deadline
    (default 60 s) and 30 s for the framework's own work."""
    return (timeout_ms if timeout_ms and timeout_ms > 0 else 60000) / 1e3 + 30
