"""Every error class, raised by real failures where a host machine can
produce one, with messages naming the tensor, rank and field; and the
binding's buffer checks, which raise before any byte moves."""
import shutil
import threading

import numpy as np
import pytest

import reshard
from reshard import _ffi as ffi, _lib as lib
from conftest import run_ranks


def simple(shape=(8, 4), dtype="f32", src_pl=None, dst_pl=None, n=1):
    src, dst = reshard.Layout(), reshard.Layout()
    for L, pl in ((src, src_pl), (dst, dst_pl)):
        t = L.add_tensor("w", dtype, shape)
        m = L.add_mesh(n)
        L.place(t, m, pl or [reshard.Shard(0)])
    return src, dst


def test_result_codes_map_to_classes():
    want = {
        lib.RESHARD_ERROR_INVALID_ARGUMENT: (reshard.InvalidArgumentError, ValueError),
        lib.RESHARD_ERROR_INVALID_USAGE: (reshard.InvalidUsageError, RuntimeError),
        lib.RESHARD_ERROR_OUT_OF_MEMORY: (reshard.OutOfMemoryError, MemoryError),
        lib.RESHARD_ERROR_MISMATCH: (reshard.MismatchError, RuntimeError),
        lib.RESHARD_ERROR_BACKEND: (reshard.BackendError, RuntimeError),
        lib.RESHARD_ERROR_REMOTE: (reshard.RemoteError, RuntimeError),
        lib.RESHARD_ERROR_TIMEOUT: (reshard.TimeoutError, TimeoutError),
        lib.RESHARD_ERROR_UNSUPPORTED: (reshard.UnsupportedError, NotImplementedError),
        lib.RESHARD_ERROR_INTERNAL: (reshard.InternalError, RuntimeError),
        lib.RESHARD_ERROR_IN_DOUBT: (reshard.InDoubtError, RuntimeError),
    }
    assert len(want) == lib.RESHARD_NUM_RESULTS - 1
    for code, (cls, builtin) in want.items():
        e = reshard.errors.error_for(code, "msg")
        assert type(e) is cls and isinstance(e, reshard.Error)
        assert isinstance(e, builtin) and e.code == code and str(e) == "msg"
        assert e.result == ffi.string(lib.reshard_result_string(code)).decode()


def test_invalid_argument_names_tensor_and_field():
    L = reshard.Layout()
    with pytest.raises(reshard.InvalidArgumentError, match="bogus"):
        L.add_tensor("w", "bogus", (4,))
    with pytest.raises(reshard.InvalidArgumentError, match="w"):
        L.add_tensor("w", "f32", (4, -1))
    t = L.add_tensor("w", "f32", (4,))
    with pytest.raises(reshard.InvalidArgumentError, match="w"):
        L.add_tensor("w", "f32", (4,))  # duplicate name
    m = L.add_mesh(2)
    with pytest.raises(reshard.InvalidArgumentError, match="dim"):
        L.place(t, m, [reshard.Shard(3)])
    with pytest.raises(reshard.InvalidArgumentError, match="Partial"):
        L.place(t, m, [object()])
    with pytest.raises(reshard.InvalidArgumentError):
        L.tensor_id("nope")
    with pytest.raises(reshard.InvalidArgumentError):
        L.add_mesh((2,), ranks=[0, 1, 2])


def test_dtensor_placements_accepted():
    # torch.distributed.tensor's Shard(dim) / Replicate(), matched by name
    Shard = type("Shard", (), {"__init__": lambda s, d: setattr(s, "dim", d)})
    Replicate = type("Replicate", (), {})
    L = reshard.Layout()
    t = L.add_tensor("w", "f32", (4, 6))
    m = L.add_mesh((2, 2))
    b = L.place(t, m, [Shard(1), Replicate()])
    assert L.fragments(2)[0].box == ((0, 4), (3, 6))
    assert L.buffer_bytes(b, 1) == 4 * 3 * 4


def test_usage_error_estimate_without_topology():
    src, dst = simple()
    (r,) = run_ranks(1, lambda rank, comm: _estimate(comm, src, dst))
    assert r is reshard.InvalidUsageError


def _estimate(comm, src, dst):
    with reshard.Plan(comm, src, dst) as plan:
        try:
            plan.estimate()
        except reshard.Error as e:
            return type(e)


def test_estimate_and_lower_bound_with_topology():
    src, dst = simple((1024, 256), "bf16", [reshard.Shard(0)], [reshard.Shard(1)], n=2)

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst, topology="h100-8x400g") as plan:
            return plan.estimate()
    e0, e1 = run_ranks(2, fn)
    assert e0 == e1 and e0.seconds > 0 and e0.bytes > 0 and e0.bound
    lb = reshard.lower_bound(src, dst, 2, "h100-8x400g")
    assert 0 < lb.seconds <= e0.seconds


def test_mismatch_between_ranks():
    def fn(rank, comm):
        src, dst = simple(shape=(8, 4 + rank), n=2)  # ranks disagree
        with pytest.raises(reshard.MismatchError, match="rank"):
            reshard.Plan(comm, src, dst, timeout_ms=20000)
        return True
    assert run_ranks(2, fn) == [True, True]


def test_timeout_when_a_partner_never_executes():
    src, dst = simple(n=2, dst_pl=[reshard.Shard(1)])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst, timeout_ms=500) as plan:
            s = {"w": np.zeros((4, 4), np.float32)}
            d = {"w": np.zeros((8, 2), np.float32)}
            if rank == 0:
                with pytest.raises(reshard.TimeoutError, match="rank 1"):
                    plan.execute(s, d)
                st = plan.status()
                assert st.failed and st.failure is reshard.TimeoutError
            return True
    assert run_ranks(2, fn) == [True, True]


def test_remote_error_names_the_refusing_rank():
    # Rank 1 hands C a short buffer (past the binding's checks, straight
    # through the C API): C refuses it there, and rank 0 learns why.
    src, dst = simple(n=2, dst_pl=[reshard.Shard(1)])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst, timeout_ms=20000) as plan:
            s = np.zeros((4, 4), np.float32)
            d = np.full((8, 2), 7, np.float32)
            if rank == 0:
                with pytest.raises(reshard.RemoteError, match="rank 1"):
                    plan.execute({"w": s}, {"w": d})
            else:
                b = plan.bind({"w": s}, {"w": d})
                b._src[0].bytes = 8  # short
                with pytest.raises(reshard.InvalidArgumentError, match="bytes"):
                    plan.execute(b)
            assert (d == 7).all()  # nothing written on either rank
            return True
    assert run_ranks(2, fn) == [True, True]


# The mistakes a user makes on one rank (issue 42, item 5), in the
# two-rank layout below: rank 1's source is (4, 4) f32, its destination
# (8, 2) f32.
PARTNER_CASES = [
    ("wrong size", lambda s, d: ({"w": s[:1]}, {"w": d}), "bytes"),
    ("wrong dtype", lambda s, d: ({"w": s.astype(np.float64)[:, :2].copy()}, {"w": d}), "dtype f64"),
    ("missing buffer", lambda s, d: ({}, {"w": d}), "missing"),
    ("name typo", lambda s, d: ({"W": s}, {"w": d}), "'W'"),
    ("non-contiguous dst", lambda s, d: ({"w": s}, {"w": np.zeros((8, 4), np.float32)[:, ::2]}), "contiguous"),
    ("read-only dst", lambda s, d: ({"w": s}, {"w": np.frombuffer(d.tobytes(), np.float32)}), "read-only"),
    ("bad version", None, "versions are >= 1"),
]


@pytest.mark.parametrize("case", PARTNER_CASES, ids=[c[0] for c in PARTNER_CASES])
def test_binding_refusals_tell_the_partners(case):
    """A call the binding refuses (issue 42, item 5) takes its turn like a
    call C refuses: the partner fails at once with RemoteError naming the
    refusing rank and its reason (not at its 20 s deadline, blaming the
    wrong rank), nothing is written, and both plans are failed (a retry
    cannot pair with the partner's next call). Each rank's time is
    printed (pytest -s shows them): the partner's is milliseconds."""
    import time
    name, make, match = case
    src, dst = simple(n=2, dst_pl=[reshard.Shard(1)])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst, timeout_ms=20000) as plan:
            s = np.zeros((4, 4), np.float32)
            d = np.full((8, 2), 7, np.float32)
            t0 = time.monotonic()
            if rank == 0:
                with pytest.raises(reshard.RemoteError) as ei:
                    plan.execute({"w": s}, {"w": d}, version=1)
                assert "rank 1" in str(ei.value) and match in str(ei.value), ei.value
            else:
                sb, db = make(s, d) if make else ({"w": s}, {"w": d})
                with pytest.raises(reshard.InvalidArgumentError, match=match):
                    plan.execute(sb, db, version=0 if make is None else 1)
            took = time.monotonic() - t0
            print("partner matrix: %s: rank %d returned after %.3f s" % (name, rank, took))
            assert took < 3  # at once, not at the 20 s deadline
            assert (d == 7).all()
            assert plan.status().failed
            return True
    assert run_ranks(2, fn) == [True, True]


def test_unsupported_register_on_host_transport():
    src, dst = simple()

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst) as plan:
            with pytest.raises(reshard.UnsupportedError):
                plan.register_buffers({"w": np.zeros((8, 4), np.float32)},
                                      {"w": np.zeros((8, 4), np.float32)})
            return True
    assert run_ranks(1, fn) == [True]


def test_out_of_memory():
    L = reshard.Layout()
    t = L.add_tensor("w", "f32", (1 << 22, 1 << 21))  # 32 TiB
    L.place(t, L.add_mesh(1), [reshard.Replicate()])
    with pytest.raises(reshard.OutOfMemoryError, match="rank 0"):
        reshard.SelfTest(L, 0)


@pytest.mark.skipif(not reshard.HAVE_CUDA or shutil.which("nvidia-smi") is not None,
                    reason="needs a CUDA build on a machine without a GPU")
def test_backend_error_without_gpu():
    w = reshard.InprocWorld(1)
    host = w.comm(0)
    with pytest.raises(reshard.BackendError, match="rank 0"):
        reshard.Comm.cuda_ipc(host)
    w.close()


def test_closed_objects_refuse():
    L = reshard.Layout()
    L.close()
    with pytest.raises(reshard.InvalidUsageError):
        L.add_tensor("w", "f32", (4,))
    w = reshard.InprocWorld(1)
    c = w.comm(0)
    w.close()
    with pytest.raises(reshard.InvalidUsageError):
        c.rank


# ------------------------------------------------------- buffer checks
class CudaLike:
    """Claims CUDA memory through __cuda_array_interface__."""

    def __init__(self, a):
        self.__cuda_array_interface__ = dict(a.__array_interface__, version=3)


class DLPackOnly:
    """Only __dlpack__ (and the device query)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


BAD = [
    ("wrong size", lambda s, d: ({"w": s[:7]}, {"w": d}), "bytes"),
    ("wrong dtype", lambda s, d: ({"w": s.astype(np.float64)[:, :2].copy()}, {"w": d}), "dtype f64"),
    ("non-contiguous", lambda s, d: ({"w": s}, {"w": np.zeros((8, 8), np.float32)[:, ::2]}), "contiguous"),
    ("wrong device", lambda s, d: ({"w": CudaLike(s)}, {"w": d}), "CUDA memory"),
    ("read-only dst", lambda s, d: ({"w": s}, {"w": np.frombuffer(d.tobytes(), np.float32)}), "read-only"),
    ("missing", lambda s, d: ({}, {"w": d}), "missing"),
    ("unknown name", lambda s, d: ({"w": s, "x": s}, {"w": d}), "'x'"),
    ("unknown id", lambda s, d: ({0: s, 5: s}, {"w": d}), "buffer 5"),
    ("not an array", lambda s, d: ({"w": "abc"}, {"w": d}), "not an array"),
    ("twice", lambda s, d: ({"w": s, 0: s}, {"w": d}), "twice"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_buffer_checks_raise_before_anything_moves(case):
    _, make, match = case
    src, dst = simple(dst_pl=[reshard.Replicate()])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst) as plan:
            s = np.arange(32, dtype=np.float32).reshape(8, 4)
            d = np.full((8, 4), -1, np.float32)
            sb, db = make(s, d)
            with pytest.raises(reshard.InvalidArgumentError, match=match) as ei:
                plan.execute(sb, db)
            assert "rank 0" in str(ei.value)
            assert (d == -1).all()
            plan.execute({"w": s}, {"w": d})  # the plan is still usable
            assert (d == s).all()
            return True
    assert run_ranks(1, fn) == [True]


def test_other_array_kinds():
    src, dst = simple(shape=(16,), dtype="u8", dst_pl=[reshard.Replicate()])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst) as plan:
            s = np.arange(16, dtype=np.uint8)
            for d, view in ((bytearray(16), None), (np.zeros(16, np.uint8), DLPackOnly)):
                plan.execute({"w": s if view is None else view(s)},
                             {"w": d if view is None else view(d)})
                assert bytes(d) == s.tobytes()
            # a raw integer view of the same bytes is accepted
            d16 = np.zeros(8, np.uint16)
            plan.execute({"w": s}, {"w": d16})
            assert d16.tobytes() == s.tobytes()
            return True
    assert run_ranks(1, fn) == [True]


def test_gil_released_in_c_calls():
    # Two ranks as threads: plan creation and execute are collectives, so
    # they finish only if each rank's C call runs while the other thread
    # holds no GIL; a third thread keeps running Python meanwhile.
    src, dst = simple(shape=(4096, 64), n=2, dst_pl=[reshard.Shard(1)])
    stop = threading.Event()

    def spin():  # a Python thread competing for the GIL throughout
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin, daemon=True)
    t.start()

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst, timeout_ms=10000) as plan:
            s = np.ones((2048, 64), np.float32)
            d = np.zeros((4096, 32), np.float32)
            for _ in range(20):
                plan.execute({"w": s}, {"w": d})
            assert (d == 1).all()  # every element of this rank's columns
            return True
    try:
        # with the GIL held in C, the first rank's collective would wait
        # for a partner that cannot run, and time out (10 s)
        assert run_ranks(2, fn) == [True, True]
    finally:
        stop.set()
        t.join(10)


def test_description_lengths_checked_before_c():
    # C reads one placement per mesh axis, one size per rank of the axis,
    # one coordinate per tensor dim: short lists are refused here.
    L = reshard.Layout()
    t = L.add_tensor("w", "f32", (8, 4))
    m2 = L.add_mesh((2, 2))
    with pytest.raises(reshard.InvalidArgumentError, match="1 placements for a mesh of 2 axes"):
        L.place(t, m2, [reshard.Shard(0)])
    with pytest.raises(reshard.InvalidArgumentError, match="has 1 sizes"):
        L.place(t, m2, [reshard.Shard(0, sizes=[8]), reshard.Replicate()])
    with pytest.raises(reshard.InvalidArgumentError, match="padded_shape"):
        L.add_fused("f", [reshard.Part(t, m2, [reshard.Replicate()] * 2, padded_shape=[8])])
    with pytest.raises(reshard.InvalidArgumentError, match="origin"):
        L.add_fused("f", [reshard.Part(t, m2, [reshard.Replicate()] * 2, origin=[0])])
    b = L.add_buffer("raw", 0, 1024)
    for kw in ({"start": [0]}, {"extent": [8, 4, 1]}, {"strides": [1]}):
        args = dict(start=[0, 0], extent=[8, 4])
        args.update(kw)
        with pytest.raises(reshard.InvalidArgumentError, match=list(kw)[0]):
            L.add_fragment(t, b, **args)
    assert L.num_buffers == 1


def test_double_buffer_copies_must_not_overlap():
    src, dst = simple(dst_pl=[reshard.Replicate()])

    def fn(rank, comm):
        s = np.ones((8, 4), np.float32)
        d = np.zeros((8, 4), np.float32)
        # a refused call of a double-buffered plan takes its turn and its
        # commit, as in C: the plan is failed (every rank calls every
        # execute of such a plan), nothing written
        for dst_buffers, match in (({"w": (d, d)}, "overlap"), ({"w": d}, "pair")):
            with reshard.Plan(comm, src, dst, double_buffer=True) as plan:
                with pytest.raises(reshard.InvalidArgumentError, match=match):
                    plan.execute({"w": s}, dst_buffers)
                assert plan.status().failed and (d == 0).all()
        with reshard.Plan(comm, src, dst, double_buffer=True) as plan:
            d1 = np.zeros((8, 4), np.float32)
            plan.execute({"w": s}, {"w": (d, d1)})
            assert (d == 1).all() and (d1 == 0).all()
            st = plan.status()
            assert st.active_copy == 0 and st.in_doubt_version == 0 and st.in_doubt_copy == -1
            # nothing in doubt: resolve is a no-op (the in-doubt path needs
            # MPI: tests/mpi/test_mpi_faults.c split, and test_mpi_python)
            plan.resolve()
            plan.resolve(timeout_ms=5)
            with pytest.raises(reshard.InvalidArgumentError, match="timeout_ms"):
                plan.resolve(timeout_ms=0)
            assert plan.status().committed_version == 1
            return True
    assert run_ranks(1, fn) == [True]


def test_destination_buffers_sharing_memory_refused():
    """Two destination buffers bound to one array (or overlapping views)
    would each take the other's bytes with a clean status (issue 42,
    item 6: 896 elements wrong): refused, naming both, nothing written;
    disjoint views of one array are fine, every element checked."""
    src, dst = reshard.Layout(), reshard.Layout()
    for L in (src, dst):
        m = L.add_mesh(1)
        for name in ("a", "b"):
            L.place(L.add_tensor(name, "f32", (16,)), m, [reshard.Replicate()])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst) as plan:
            sa = np.arange(16, dtype=np.float32)
            sb = sa + 100
            d = np.full(40, -1, np.float32)
            for da, db, what in ((d[:16], d[:16], "bytes 0 .. 64"),
                                 (d[:16], d[8:24], "bytes 32 .. 64"),
                                 (d[8:24], d[:16], "bytes 32 .. 64")):
                with pytest.raises(reshard.InvalidArgumentError,
                                   match="share memory") as ei:
                    plan.execute({"a": sa, "b": sb}, {"a": da, "b": db})
                assert "0 ('a')" in str(ei.value) and "1 ('b')" in str(ei.value)
                assert what in str(ei.value) and "rank 0" in str(ei.value)
                assert (d == -1).all()
            plan.execute({"a": sa, "b": sb}, {"a": d[:16], "b": d[16:32]})
            assert (d[:16] == sa).all() and (d[16:32] == sb).all()
            assert (d[32:] == -1).all()
            return True
    assert run_ranks(1, fn) == [True]


def test_bind_errors_name_bind():
    """An error of plan.bind says bind, one of execute's own binding says
    execute (issue 42, item 8)."""
    src, dst = simple(dst_pl=[reshard.Replicate()])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst) as plan:
            s = np.zeros((8, 4), np.float32)
            d = np.zeros((8, 4), np.float32)
            with pytest.raises(reshard.InvalidArgumentError,
                               match=r"^bind: src buffer 'x'"):
                plan.bind({"w": s, "x": s}, {"w": d})
            with pytest.raises(reshard.InvalidArgumentError,
                               match=r"^execute: src buffer 'x'"):
                plan.execute({"w": s, "x": s}, {"w": d})
            return True
    assert run_ranks(1, fn) == [True]


class BigEndian:
    def __init__(self, a):
        self.__array_interface__ = dict(a.__array_interface__, typestr=">f4")


class Xpu:  # a torch tensor on another device kind
    device = type("D", (), {"type": "xpu"})()
    dtype = "torch.float32"

    def __init__(self, a):
        self._a = a

    def data_ptr(self):
        return self._a.__array_interface__["data"][0]

    def is_contiguous(self):
        return True

    def element_size(self):
        return 4

    def numel(self):
        return self._a.size


def test_unusable_arrays_and_foreign_bounds():
    src, dst = simple(dst_pl=[reshard.Replicate()])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst) as plan, reshard.Plan(comm, src, dst) as other:
            s = np.ones((8, 4), np.float32)
            d = np.zeros((8, 4), np.float32)
            for bad, match in ((BigEndian(s), "big-endian"), (Xpu(s), "xpu"),
                               (memoryview(bytearray(256))[::2], "contiguous")):
                with pytest.raises(reshard.InvalidArgumentError, match=match):
                    plan.execute({"w": bad}, {"w": d})
            b = other.bind({"w": s}, {"w": d})
            with pytest.raises(reshard.InvalidArgumentError, match="another plan"):
                plan.execute(b)
            with pytest.raises(reshard.InvalidArgumentError, match="another plan"):
                plan.register_buffers(b)
            assert (d == 0).all()
            return True
    assert run_ranks(1, fn) == [True]


def test_selftest_arrays_outlive_close():
    # A Bound made of SelfTest arrays keeps their memory: executing it
    # after the SelfTest was closed and dropped writes live memory.
    src, dst = simple(dst_pl=[reshard.Replicate()])

    def fn(rank, comm):
        with reshard.Plan(comm, src, dst) as plan:
            s, d = reshard.SelfTest(src, 0, 3), reshard.SelfTest(dst, 0, -1)
            b = plan.bind(s.arrays, d.arrays)
            view = d.arrays[0][4:]
            s.close()
            d.close()
            del s, d
            import gc
            gc.collect()
            plan.execute(b)
            want = reshard.selftest.expected("w", 3, 1, 4)
            assert bytes(view[:4]) == want
            st = reshard.SelfTest(src, 0, 3)
            st.close()
            with pytest.raises(reshard.InvalidUsageError):
                st.fill(0)
            return True
    assert run_ranks(1, fn) == [True]
