"""Plans: create once, execute every step (reshard.h, "Plans").

Plan(comm, src, dst, ...) is reshard_plan_create; Plan.execute is
reshard_plan_execute_sized, so every buffer's size is checked in C too.
The binding's own checks (which buffers this rank must pass, their byte
size, dtype, device kind, contiguity, writability) run in Plan.bind before
anything moves; a Bound set of buffers is then executed step after step
with one C call and no Python work proportional to the model.
"""
import sys
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ._reshard_cffi import ffi, lib
from . import dtypes as _dt
from .buffers import describe
from .errors import (InvalidArgumentError, check,
                     error_for)
from ._life import Node
from .layout import Layout


@dataclass(frozen=True)
class _Held:
    id: int
    name: str
    nbytes: int
    dtype: Optional[int]  # reshard_dtype_t of its fragments; None: mixed


def _held(layout, rank):
    """The buffers ``rank`` holds on one side: {id: _Held} and {name: id}."""
    dtypes = {}
    for f in layout.fragments(rank):
        d = _dt.to_c(f.dtype)
        dtypes[f.buffer] = d if dtypes.get(f.buffer, d) == d else None
    held, names = {}, {}
    for name, b in layout.buffers(rank).items():
        held[b] = _Held(b, name, layout.buffer_bytes(b, rank), dtypes.get(b))
        names[name] = b
    return held, names


@dataclass(frozen=True)
class Stats:
    """reshard_plan_stats_t: this rank's share of the plan."""
    rank: int
    num_send_peers: int
    num_recv_peers: int
    num_chunks: int
    send_bytes: int
    recv_bytes: int
    send_messages: int
    recv_messages: int
    local_copy_bytes: int
    segments: int
    chunk_bytes: int
    staging_bytes: int
    phases: int
    wide_bytes: int
    pace_rounds: int


@dataclass(frozen=True)
class PeerStats:
    peer: int
    send_bytes: int
    recv_bytes: int
    send_messages: int
    recv_messages: int


@dataclass(frozen=True)
class Status:
    """reshard_plan_status_t. ``failure`` is the exception class of the
    first failure (None if none), ``failure_message`` its text."""
    failed: bool
    failure: Optional[type]
    failed_call: int
    failed_version: int
    failure_message: str
    executes_completed: int
    committed_version: int
    active_copy: int
    in_doubt_version: int = 0
    in_doubt_copy: int = -1


@dataclass(frozen=True)
class Estimate:
    """reshard_estimate_t: a predicted time (Plan.estimate) or the physical
    limit (reshard.lower_bound), what bounds it (``bound``, a name such as
    "nic-egress", and ``bound_where``), and each bound's seconds."""
    seconds: float
    bound: str
    bound_where: int
    bound_seconds: Dict[str, float]
    latency_seconds: float
    num_rounds: int
    bytes: int


def _estimate(e):
    return Estimate(
        seconds=e.seconds,
        bound=ffi.string(lib.reshard_bound_name(e.bound)).decode(),
        bound_where=e.bound_where,
        bound_seconds={ffi.string(lib.reshard_bound_name(b)).decode():
                       e.bound_seconds[b]
                       for b in range(1, lib.RESHARD_NUM_BOUNDS)
                       if e.bound_seconds[b]},
        latency_seconds=e.latency_seconds, num_rounds=e.num_rounds,
        bytes=int(e.bytes))


def lower_bound(src, dst, nranks, topology):
    """T_lower of a reshard between two layouts on ``nranks`` ranks of a
    topology preset ("h100-8x400g", "gb200-nvl72", "flat", "cpu"): no plan can be
    faster on that machine. Not collective."""
    e = ffi.new("reshard_estimate_t *")
    lib.rs_py_estimate_init(e)
    check(lib.reshard_lower_bound(src.handle, dst.handle, int(nranks),
                                  topology.encode(), e))
    return _estimate(e[0])


class Bound:
    """A plan's buffers on this rank, checked once: execute it as many
    times as needed (Plan.execute(bound)). It keeps every array alive.
    Bind again after reallocating parameters (vLLM sleep/wake)."""

    def __init__(self, plan, src, nsrc, dst, ndst, keep, device):
        self._plan = weakref.ref(plan)  # no cycle through caches of plans
        self._src, self._nsrc = src, nsrc
        self._dst, self._ndst = dst, ndst
        self._keep = keep
        self.device = device
        # torch tensors among the arrays: then torch's current stream is
        # the default one (keep holds (array, ...) tuples)
        self.torch = any(type(k[0]).__module__.startswith("torch")
                         for k in keep)

    @property
    def plan(self):
        """The plan it was bound for (None once that plan is gone)."""
        return self._plan()


def _stream_pointer(stream, device, bound):
    if not device:
        if stream not in (None, 0):
            raise InvalidArgumentError("execute: stream %r given on a host "
                                       "communicator (no streams there)"
                                       % (stream,))
        return ffi.NULL
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and bound.torch:
            stream = torch.cuda.current_stream().cuda_stream
        else:
            stream = 0  # the legacy default stream
    elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        stream = stream.cuda_stream
    elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
        stream = stream.ptr
    elif hasattr(stream, "value"):  # ctypes.c_void_p
        stream = stream.value or 0
    return ffi.cast("void *", int(stream))


def _problem(info, v, side, held, device):
    """What is wrong with an array for a buffer (None: nothing); its
    device kind is checked against the communicator's."""
    if info is None:
        return ("%r is not an array (numpy, torch, __array_interface__, "
                "__cuda_array_interface__, __dlpack__ or a buffer)"
                % type(v).__name__)
    if info.unusable:
        return info.unusable
    if info.device != device:
        return ("%s memory (%s) on a communicator that moves %s memory"
                % ("CUDA" if info.device else "host", info.kind,
                   "CUDA" if device else "host"))
    if not info.contiguous:
        return ("not contiguous (pass a C-contiguous array; reshard writes "
                "the bytes the layout names)")
    if side == "dst" and info.readonly:
        return "read-only"
    if info.nbytes != held.nbytes:
        return "%d bytes, the layout has %d" % (info.nbytes, held.nbytes)
    if (info.dtype is not None and info.dtype in _dt.FLOATS
            and held.dtype is not None and info.dtype != held.dtype):
        return ("dtype %s, the layout's is %s (a raw view as uint8 or an "
                "integer type of the same bytes is accepted)"
                % (_dt.name(info.dtype), _dt.name(held.dtype)))
    return None


class Plan(Node):
    """reshard_plan_create: collective over ``comm``; every rank passes the
    same layouts and options.

    Options (None: the C default): staging_bytes (per rank, default 256
    MiB), chunk_bytes (message bound; 0: derived), timeout_ms (every
    wait's deadline, default 60000), topology (a preset name, for replica
    choice, relays and estimate), relay (None/-1: decide with a topology,
    0 never, 1 always), and flags: verify (end-to-end checksums),
    double_buffer (destinations as (copy0, copy1) pairs, atomic commit),
    first_replica (the "replica 0" baseline), sync (device transports:
    execute waits for its work), spread (source-side spreading with a
    topology on host transports: True when the cost model predicts it
    faster, False never, "always" wherever a domain is imbalanced).
    """

    def __init__(self, comm, src, dst, staging_bytes=None, chunk_bytes=None,
                 timeout_ms=None, topology=None, relay=None, verify=False,
                 double_buffer=False, first_replica=False, sync=False,
                 spread=True):
        if spread not in (True, False, "always"):
            raise InvalidArgumentError("reshard.Plan: spread is True, False "
                                       "or \"always\", not %r" % (spread,))
        if not isinstance(src, Layout) or not isinstance(dst, Layout):
            raise InvalidArgumentError("reshard.Plan: src and dst must be "
                                       "reshard.Layout objects")
        o = ffi.new("reshard_options_t *")
        lib.rs_py_options_init(o)
        if staging_bytes is not None:
            o.staging_bytes = int(staging_bytes)
        if chunk_bytes is not None:
            o.chunk_bytes = int(chunk_bytes)
        if timeout_ms is not None:
            o.timeout_ms = int(timeout_ms)
        topo = None
        if topology is not None:
            topo = ffi.new("char[]", topology.encode())
            o.topology = topo
        if relay is not None:
            o.relay = int(relay)
        o.flags = ((lib.RESHARD_FLAG_VERIFY if verify else 0)
                   | (lib.RESHARD_FLAG_DOUBLE_BUFFER if double_buffer else 0)
                   | (lib.RESHARD_FLAG_FIRST_REPLICA if first_replica else 0)
                   | (lib.RESHARD_FLAG_SYNC if sync else 0)
                   | (lib.RESHARD_FLAG_NO_SPREAD if not spread else 0)
                   | (lib.RESHARD_FLAG_SPREAD_ALWAYS if spread == "always"
                      else 0))
        self.comm = comm  # the C plan uses it: keep it open
        self.rank = comm.rank
        self.double_buffer = bool(double_buffer)
        out = ffi.new("reshard_plan_t **")
        check(lib.reshard_plan_create(comm.handle, src.handle, dst.handle, o,
                                      out))
        try:
            self._live(out[0], lib.reshard_plan_destroy, comm, "reshard.Plan")
        except BaseException:
            lib.reshard_plan_destroy(out[0])  # the communicator was closing
            raise
        # What this rank must pass at execute: computed once, from the
        # layouts (which may be closed afterwards).
        self._nsrc, self._ndst = src.num_buffers, dst.num_buffers
        self._src_held, self._src_names = _held(src, self.rank)
        self._dst_held, self._dst_names = _held(dst, self.rank)
        self._bound = None

    # ----------------------------------------------------------- life
    def close(self):
        """reshard_plan_destroy (on device transports it waits for the
        last execute); idempotent. Not while another thread is inside an
        execute of this plan (nothing guards that: the C plan would be
        freed under the call)."""
        self._bound = None
        Node.close(self)

    # -------------------------------------------------------- buffers
    def buffers(self, side):
        """{name: buffer id} of what this rank must pass on ``side``
        ("src" or "dst")."""
        return dict(self._src_names if side == "src" else self._dst_names)

    def _side(self, side, given, held, names, nbuf, device, keep, what):
        copies = 2 if side == "dst" and self.double_buffer else 1
        arr = ffi.new("reshard_buffer_t[]", max(nbuf * copies, 1))
        seen = set()
        spans = []  # destination memory: (address, bytes, buffer, name, copy)
        items = given.items() if hasattr(given, "items") else enumerate(given or ())
        for key, value in items:
            if value is None:
                continue
            if isinstance(key, str):
                b = names.get(key)
                if b is None:
                    raise InvalidArgumentError(
                        what + ": %s buffer %r: rank %d holds no buffer of "
                        "that name (it holds %d: %s)" % (
                            side, key, self.rank, len(names),
                            ", ".join(sorted(names)[:5]) +
                            (", ..." if len(names) > 5 else "")))
            else:
                b = int(key)
                if b not in held:
                    raise InvalidArgumentError(
                        what + ": %s buffer %d: rank %d holds nothing of it "
                        "(%s)" % (side, b, self.rank,
                                  "ids are 0 .. %d" % (nbuf - 1)
                                  if not 0 <= b < nbuf else "0 bytes here"))
            h = held[b]
            if b in seen:
                raise InvalidArgumentError(
                    what + ": %s buffer %d (%r) given twice on rank %d"
                    % (side, b, h.name, self.rank))
            seen.add(b)
            if copies == 2:
                if not isinstance(value, (tuple, list)) or len(value) != 2:
                    raise InvalidArgumentError(
                        what + ": dst buffer %d (%r) on rank %d: a double-"
                        "buffered plan takes a pair (copy0, copy1)"
                        % (b, h.name, self.rank))
                values = value
            else:
                values = (value,)
            for c, v in enumerate(values):
                info = describe(v)
                problem = _problem(info, v, side, h, device)
                if problem:
                    raise InvalidArgumentError(what + ": %s buffer %d (%r)%s on "
                                               "rank %d: %s" % (
                                                   side, b, h.name,
                                                   " copy %d" % c if copies == 2 else "",
                                                   self.rank, problem))
                if c == 1 and info.ptr < first.ptr + first.nbytes and \
                        first.ptr < info.ptr + info.nbytes:
                    raise InvalidArgumentError(
                        what + ": dst buffer %d (%r) on rank %d: copy 0 and "
                        "copy 1 overlap (a double-buffered plan keeps the "
                        "active copy untouched while writing the other)"
                        % (b, h.name, self.rank))
                first = info
                if side == "dst" and info.nbytes:
                    spans.append((info.ptr, info.nbytes, b, h.name, c))
                slot = arr[c * nbuf + b]
                slot.ptr = ffi.cast("void *", info.ptr)
                slot.bytes = info.nbytes
                keep.append(info.keep)
        missing = [b for b in held if b not in seen]
        if missing:
            raise InvalidArgumentError(
                what + ": rank %d must pass %d %s buffer(s) it holds; "
                "missing %d: %s" % (
                    self.rank, len(held), side, len(missing),
                    ", ".join("%d (%r)" % (b, held[b].name)
                              for b in missing[:5]) +
                    (", ..." if len(missing) > 5 else "")))
        # two destination buffers (or copies) on one memory: each would
        # take the other's bytes, and the status would still say success
        spans.sort()
        for (p0, n0, b0, m0, c0), (p1, n1, b1, m1, c1) in zip(spans, spans[1:]):
            if p1 < p0 + n0:
                def name(b, m, c):
                    return "%d (%r)%s" % (b, m, " copy %d" % c if copies == 2 else "")
                raise InvalidArgumentError(
                    what + ": dst buffers %s and %s on rank %d share memory "
                    "(bytes %d .. %d of the first): each would overwrite the "
                    "other" % (name(b0, m0, c0), name(b1, m1, c1), self.rank,
                               p1 - p0, min(p0 + n0, p1 + n1) - p0))
        return arr, nbuf * copies

    def bind(self, src_buffers, dst_buffers, _what="bind"):
        """Checks this rank's buffers and returns a Bound set for execute.
        Each side is a dict keyed by buffer id or name (or a sequence
        indexed by id), with the arrays this rank holds; a side this rank
        holds nothing of may be None or empty. Values: numpy arrays, torch
        tensors, objects with __array_interface__, __cuda_array_interface__
        or __dlpack__, or writable buffers; with double_buffer, each
        destination value is a pair (copy0, copy1). Raises
        reshard.InvalidArgumentError naming the side, buffer, name and
        rank for a missing or unknown buffer, a wrong byte size, a float
        dtype other than the layout's, the wrong device kind, a
        non-contiguous or read-only destination."""
        self.handle
        device = self.comm.device
        keep = []
        src, ns = self._side("src", src_buffers or {}, self._src_held,
                             self._src_names, self._nsrc, device, keep, _what)
        dst, nd = self._side("dst", dst_buffers or {}, self._dst_held,
                             self._dst_names, self._ndst, device, keep, _what)
        return Bound(self, src, ns, dst, nd, keep, device)

    # -------------------------------------------------------- execute
    def execute(self, src_buffers=None, dst_buffers=None, version=None,
                stream=None):
        """Moves every destination fragment (reshard_plan_execute_sized).
        ``src_buffers`` is a Bound (from bind; dst_buffers then None) or
        the src dict with ``dst_buffers`` the dst dict (bound on the fly:
        O(buffers) of Python work per call). ``version`` (>= 1): the
        weight version every rank passes for this step, checked across
        ranks. ``stream`` (device communicators): a torch/cupy stream or a
        cudaStream_t as int; None: torch's current stream when the buffers
        are torch tensors, else the legacy default stream. Collective over
        the ranks that exchange data with this one; on a host
        communicator it returns when done, on a device one once enqueued.
        A call refused here (its buffers, its version) still takes its
        turn (reshard_plan_execute_refused): its partners fail at once
        with RemoteError naming this rank and the reason, as for a call
        the C library refuses, instead of waiting for their deadline."""
        try:
            if isinstance(src_buffers, Bound):
                if dst_buffers is not None:
                    raise InvalidArgumentError(
                        "execute(bound): dst_buffers must be None (the Bound "
                        "has both)")
                b = src_buffers
                if b.plan is not self:
                    raise InvalidArgumentError("execute: the Bound belongs to "
                                               "another plan")
            else:
                b = self.bind(src_buffers, dst_buffers, _what="execute")
            if version is not None and int(version) < 1:
                raise InvalidArgumentError("execute: version %r: versions are "
                                           ">= 1" % (version,))
        except InvalidArgumentError as e:
            self.refuse(e, version)
            raise
        s = _stream_pointer(stream, b.device, b)
        check(lib.reshard_plan_execute_sized(
            self.handle, 0 if version is None else int(version),
            b._src, b._nsrc, b._dst, b._ndst, s))

    def refuse(self, reason, version=None):
        """reshard_plan_execute_refused: this rank's execute call for
        ``version`` refused with ``reason`` (a message or an exception):
        the call takes its place, its partners fail with RemoteError
        naming this rank and the reason. For a binding of your own that
        found its arguments wrong (execute and sync_weights call it
        themselves). Returns nothing; the caller raises its own error."""
        v = 0
        try:
            v = int(version) if version is not None and int(version) >= 1 else 0
        except (TypeError, ValueError):
            pass
        lib.reshard_plan_execute_refused(
            self.handle, v, lib.RESHARD_ERROR_INVALID_ARGUMENT,
            ffi.new("char[]", str(reason).encode("utf-8", "replace")))

    def register_buffers(self, src_buffers=None, dst_buffers=None):
        """reshard_plan_register_buffers (CUDA IPC, and UCX with host
        arrays: executes then read each box straight from its sender's
        buffer, no staging). Collective. A Bound, or the two dicts as for
        bind; with nothing, unregisters. Later executes must pass exactly
        these buffers. On UCX after ``rejoin``, a staying rank passing the
        same buffers keeps their registrations and trades keys with the
        newcomer only. Other transports: reshard.UnsupportedError on every
        rank."""
        if src_buffers is None and dst_buffers is None:
            check(lib.reshard_plan_register_buffers(self.handle, ffi.NULL, 0,
                                                    ffi.NULL, 0))
            self._bound = None
            return None
        b = src_buffers if isinstance(src_buffers, Bound) else \
            self.bind(src_buffers, dst_buffers)
        if b.plan is not self:
            raise InvalidArgumentError("register_buffers: the Bound belongs "
                                       "to another plan")
        sp = ffi.new("void *[]", [b._src[i].ptr for i in range(b._nsrc)] or [ffi.NULL])
        dp = ffi.new("void *[]", [b._dst[i].ptr for i in range(b._ndst)] or [ffi.NULL])
        check(lib.reshard_plan_register_buffers(self.handle, sp, b._nsrc, dp,
                                                b._ndst))
        self._bound = b  # the registered memory stays referenced
        return b

    # --------------------------------------------------- introspection
    def status(self):
        """reshard_plan_get_status: never blocks; on device transports it
        also checks the last execute against its deadline."""
        s = ffi.new("reshard_plan_status_t *")
        lib.rs_py_status_init(s)
        check(lib.reshard_plan_get_status(self.handle, s))
        failure = None
        if s.failed:
            failure = type(error_for(s.failure, ""))
        msg = ffi.string(s.failure_message).decode(errors="replace") \
            if s.failure_message != ffi.NULL else ""
        return Status(bool(s.failed), failure, int(s.failed_call),
                      int(s.failed_version), msg, int(s.executes_completed),
                      int(s.committed_version), int(s.active_copy),
                      int(s.in_doubt_version), int(s.in_doubt_copy))

    def resolve(self, timeout_ms=None):
        """reshard_plan_resolve: settles a version this rank reported
        InDoubtError for, waiting up to ``timeout_ms`` (None: the plan's
        timeout) for every rank's vote. Rolled forward, the plan goes on;
        rolled back, the plan is failed as on the other ranks; ``status()``
        says which. Raises InDoubtError if the vote has not come. A no-op
        when nothing is in doubt. Not collective."""
        t = 0 if timeout_ms is None else int(timeout_ms)
        if timeout_ms is not None and t < 1:
            raise InvalidArgumentError("resolve: timeout_ms must be >= 1 ms (None: the plan's)")
        check(lib.reshard_plan_resolve(self.handle, t))

    def rejoin(self):
        """reshard_plan_rejoin: on a staying rank, after
        ``Comm.ucx_rejoin``, keeps this plan: it takes part in the
        newcomer's ``Plan.create`` of the same layouts and options (call
        it for the kept plans in the order the newcomer creates them) by
        replaying its own creation's collectives (any plan: a topology
        with relay -1, spreading and fp8 blocks included), clears the
        failure the replaced rank's death left and lines its execute
        count and version up with the newcomer's plan, without planning
        again. Collective. Raises MismatchError (the newcomer's layouts
        or options differ, or its plan would; nothing changed),
        InvalidUsageError (no rejoin since creation, or rejoined
        already), InvalidArgumentError (not a UCX communicator). Its
        registered buffers are held until every rank calls
        ``register_buffers`` again (then kept where unchanged)."""
        check(lib.reshard_plan_rejoin(self.handle))

    def stats(self):
        """reshard_plan_get_stats: this rank's bytes, messages and peers."""
        st = ffi.new("reshard_plan_stats_t *")
        check(lib.reshard_plan_get_stats(self.handle, st))
        return Stats(**{f: int(getattr(st, f)) for f in Stats.__dataclass_fields__})

    def peer_stats(self):
        """reshard_plan_get_peer_stats: per-peer traffic, sorted by peer."""
        n = ffi.new("size_t *")
        check(lib.reshard_plan_get_peer_stats(self.handle, ffi.NULL, 0, n))
        arr = ffi.new("reshard_peer_stats_t[]", max(n[0], 1))
        check(lib.reshard_plan_get_peer_stats(self.handle, arr, n[0], n))
        return [PeerStats(**{f: int(getattr(arr[i], f))
                             for f in PeerStats.__dataclass_fields__})
                for i in range(n[0])]

    def estimate(self):
        """reshard_plan_estimate: the predicted time of one execute on the
        plan's topology. Collective, like plan creation; needs a topology."""
        e = ffi.new("reshard_estimate_t *")
        lib.rs_py_estimate_init(e)
        check(lib.reshard_plan_estimate(self.handle, e))
        return _estimate(e[0])

    def dump(self, max_segments=-1):
        """reshard_plan_dump as a string."""
        out = ffi.new("char **")
        n = ffi.new("size_t *")
        r = lib.rs_py_plan_dump(self.handle, int(max_segments), out, n)
        try:
            text = ffi.unpack(out[0], n[0]).decode() if out[0] != ffi.NULL else ""
        finally:
            lib.free(out[0])
        check(r)
        return text
