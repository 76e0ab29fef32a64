"""A destination replica replaced over UCX, from Python (run by
tests/python/test_ucx.py as plain processes):

    python ucx_rejoin.py HOST:PORT RANK 4 member [keep]   (ranks 0 .. 3)
    python ucx_rejoin.py HOST:PORT 3 4 newcomer [keep]    (after rank 3 was killed)

Ranks 0 and 1 train (the source: w [N, 8] f32 sharded by rows, b [8]
replicated); ranks 2 and 3 are the replicas (w sharded by columns, b
replicated). Double-buffered plan, timeout 1000 ms. Every member
executes versions 1, 2, ...; rank 3 prints "RANK3 AT 2" after version 2 and
waits, and the test SIGKILLs it there (between two executes). The staying
ranks' next execute fails within two deadlines + 1 s, and the replica's
(rank 2's) active copy still holds the last committed version, every
element checked. They close the plan, call comm.rejoin(3); the newcomer
joins with Comm.ucx(..., joining=True); all four make a new plan and
execute version NEXT: every element checked on both replicas. Each process
prints "OK ..." (with its times) or "FAIL ...".

With "keep" the staying ranks keep their plan (plan.rejoin()) instead of
closing it: the newcomer first creates its plan over other layouts (more
rows): MismatchError on every rank, and the kept plan is unchanged (failed,
its active copy still whole); then the newcomer creates the plan over the
right layouts while the staying ranks call plan.rejoin(), version NEXT
arrives whole (the newcomer's other copy untouched), and a second
plan.rejoin() raises InvalidUsageError.
"""
import sys
import time

import numpy as np

import reshard

rendezvous, rank, size, role = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keep = len(sys.argv) > 5 and sys.argv[5] == "keep"
VICTIM, NEXT, TIMEOUT_MS = 3, 100, 1000
N = 32


def fail(msg):
    print("FAIL rank %d: %s" % (rank, msg), flush=True)
    sys.exit(1)


def values(name, version):
    """Version v of a tensor: a function of its global index."""
    if name == "w":
        return np.arange(N * 8, dtype=np.float32).reshape(N, 8) + 1000.0 * version
    return np.arange(8, dtype=np.float32) - 7.0 * version


def layout(side, rows=N):
    L = reshard.Layout()
    w = L.add_tensor("w", "f32", (rows, 8))
    b = L.add_tensor("b", "f32", (8,))
    m = L.add_mesh((2,), start=0 if side == "src" else 2)
    L.place(w, m, [reshard.Shard(0 if side == "src" else 1)])
    L.place(b, m, [reshard.Replicate()])
    return L


SRC, DST = layout("src"), layout("dst")
trainer = rank < 2
mine_w = (slice(rank * N // 2, (rank + 1) * N // 2), slice(None)) if trainer else \
    (slice(None), slice((rank - 2) * 4, (rank - 1) * 4))
copies = {name: tuple(np.full(shape, -1.0, np.float32) for _ in range(2))
          for name, shape in (("w", (N, 4)), ("b", (8,)))} if not trainer else {}


def make_plan(comm, src=SRC, dst=DST):
    t0 = time.monotonic()
    plan = reshard.Plan(comm, src, dst, timeout_ms=TIMEOUT_MS, double_buffer=True)
    return plan, (time.monotonic() - t0) * 1e3


def sync(plan, version):
    src = {"w": np.ascontiguousarray(values("w", version)[mine_w]), "b": values("b", version)} if trainer else {}
    plan.execute(src, copies, version=version)


def check(plan, version, what):
    st = plan.status()
    if st.committed_version != version:
        fail("%s: committed version %d, expected %d (%s)" % (what, st.committed_version, version, st))
    if trainer:
        return
    got_w, got_b = copies["w"][st.active_copy], copies["b"][st.active_copy]
    if not (got_w == values("w", version)[mine_w]).all() or not (got_b == values("b", version)).all():
        fail("%s: the active copy %d does not hold version %d element by element" % (what, st.active_copy, version))


def refused(call, error, what):
    try:
        call()
    except error as e:
        return str(e)
    fail("%s was not refused with %s" % (what, error.__name__))


def rejoin_plan(comm, plan):
    """keep: the kept plan (staying) or the newcomer's creation of it, a
    newcomer of other layouts refused first; returns the plan and the ms
    of its successful rejoin or creation."""
    if plan is None:
        msg = refused(lambda: make_plan(comm, layout("src", N + 8), layout("dst", N + 8)), reshard.MismatchError,
                      "the newcomer's plan over other layouts")
    else:
        msg = refused(plan.rejoin, reshard.MismatchError, "plan.rejoin() with a newcomer of other layouts")
        st = plan.status()
        if not (st.failed or st.in_doubt_version == 3) or st.committed_version != 2:
            fail("the kept plan changed after a refused rejoin: %s" % (st,))
        check(plan, 2, "after the refused rejoin")
    if "ranks 0 and 3" not in msg:
        fail("the mismatch does not name ranks 0 and 3: %s" % msg)
    if plan is None:
        return make_plan(comm)
    t0 = time.monotonic()
    plan.rejoin()
    return plan, (time.monotonic() - t0) * 1e3


def after_rejoin(comm, t_join, who, kept=None):
    plan, ms_plan = rejoin_plan(comm, kept) if keep else make_plan(comm)
    sync(plan, NEXT)
    check(plan, NEXT, "after the rejoin")
    took = (time.monotonic() - t_join) * 1e3
    if keep and not trainer and who == "newcomer":
        other = 1 - plan.status().active_copy
        if not all((c[other] == -1.0).all() for c in copies.values()):
            fail("the newcomer's first version wrote its other copy")
    if keep:
        refused(plan.rejoin, reshard.InvalidUsageError, "a second plan.rejoin()")
    plan.close()
    comm.close()
    print("OK rank %d (%s): version %d whole after the rejoin; %s to it %.1f ms, plan %s %.1f ms"
          % (rank, who, NEXT, "comm.rejoin" if who == "staying" else "Comm.ucx(joining=True)", took,
             "rejoin" if keep and who == "staying" else "creation", ms_plan), flush=True)


if role == "newcomer":
    t0 = time.monotonic()
    comm = reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=30000, joining=True)
    after_rejoin(comm, t0, "newcomer")
    sys.exit(0)

comm = reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=30000)
plan, _ = make_plan(comm)
version = 0
while True:
    version += 1
    if rank == VICTIM and version == 3:
        print("RANK3 AT 2", flush=True)
        time.sleep(60)  # killed here
        fail("not killed")
    t0 = time.monotonic()
    try:
        sync(plan, version)
    except (reshard.TimeoutError, reshard.RemoteError, reshard.BackendError, reshard.InDoubtError) as e:
        ms = (time.monotonic() - t0) * 1e3
        if version != 3 or ms > 2 * TIMEOUT_MS + 1000:
            fail("version %d failed after %.0f ms: %s" % (version, ms, e))
        st = plan.status()
        if not (st.failed or st.in_doubt_version == version) or st.committed_version != version - 1:
            fail("after the failed version %d: %s" % (version, st))
        check(plan, version - 1, "after the kill")
        print("rank %d: version %d failed after %.0f ms (%s); version %d whole" % (rank, version, ms,
              type(e).__name__, version - 1), flush=True)
        break
    check(plan, version, "before the kill")
    if version > 3:
        fail("version %d succeeded with rank %d killed" % (version, VICTIM))
if not keep:
    plan.close()
try:
    comm.rejoin(0)
    fail("rejoin(0) was not refused")
except reshard.InvalidArgumentError as e:
    if "rank 0 holds the rendezvous" not in str(e):
        fail("rejoin(0): %s" % e)
t0 = time.monotonic()
comm.rejoin(VICTIM, timeout_ms=30000)
after_rejoin(comm, t0, "staying", plan if keep else None)
