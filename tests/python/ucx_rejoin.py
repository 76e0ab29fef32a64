"""A destination replica replaced over UCX, from Python (run by
tests/python/test_ucx.py as plain processes):

    python ucx_rejoin.py HOST:PORT RANK SIZE member [keep]   (ranks 0 .. SIZE-1)
    python ucx_rejoin.py HOST:PORT RANK SIZE newcomer [keep] (after the victims were killed)

Ranks 0 and 1 train (the source: w [N, 8] f32 sharded by rows, b [8]
replicated). SIZE 4: ranks 2 and 3 are one tensor-parallel group (w
sharded by columns, b replicated), the victim rank 3. SIZE 6: two
replicas of two ranks each, (2, 3) and (4, 5) (w sharded by columns
inside a replica, replicated over them), the victims both ranks of the
second replica. Double-buffered plan, timeout 1000 ms. Every member
executes versions 1, 2, ...; each victim prints "RANK<r> AT 2" after
version 2 and waits, and the test SIGKILLs it there (between two
executes). The staying ranks' next execute fails within two deadlines +
1 s, and a staying destination rank's active copy still holds the last
committed version, every element checked. They close the plan, call
comm.rejoin(victims) (a list for two); the newcomers join with
Comm.ucx(..., joining=True); all make a new plan and execute version
NEXT: every element checked on every destination rank. Each process
prints "OK ..." (with its times) or "FAIL ...".

With "keep" the staying ranks keep their plan (plan.rejoin()) instead of
closing it: the newcomer first creates its plan over other layouts (more
rows): MismatchError on every rank, and the kept plan is unchanged (failed,
its active copy still whole); then the newcomer creates the plan over the
right layouts while the staying ranks call plan.rejoin(), version NEXT
arrives whole (the newcomer's other copy untouched), and a second
plan.rejoin() raises InvalidUsageError. With "retry" (SIZE 6) the test
starts one newcomer ("early": rank 4) only: the staying ranks' first
comm.rejoin([4, 5], timeout_ms=1500) raises TimeoutError with nothing
changed, the early newcomer's Comm.ucx raises TimeoutError (rank 0 gave
up), and the second call meets both newcomers. Also in keep mode, a plan with
registered buffers (not double-buffered; register_buffers on every rank,
versions 1 and 2 before the kill): kept too, version NEXT staged, every
rank registers again (the staying ranks keep their registrations and
trade keys with the newcomers alone: run with RESHARD_DEBUG=INFO, each
says so on stderr), version NEXT + 1 read one-sided; each checked.
"""
import sys
import time

import numpy as np

import reshard

rendezvous, rank, size, role = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keep = len(sys.argv) > 5 and sys.argv[5] == "keep"
retry = len(sys.argv) > 5 and sys.argv[5] == "retry"
VICTIMS = [3] if size == 4 else [4, 5]
NEXT, TIMEOUT_MS = 100, 1000
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
    if side == "src" or size == 4:
        m = L.add_mesh((2,), start=0 if side == "src" else 2)
        L.place(w, m, [reshard.Shard(0 if side == "src" else 1)])
        L.place(b, m, [reshard.Replicate()])
    else:  # two replicas of two tensor-parallel ranks
        m = L.add_mesh((2, 2), start=2)
        L.place(w, m, [reshard.Replicate(), reshard.Shard(1)])
        L.place(b, m, [reshard.Replicate(), reshard.Replicate()])
    return L


SRC, DST = layout("src"), layout("dst")
trainer = rank < 2
tp = (rank - 2) % 2  # a destination rank's column half
mine_w = (slice(rank * N // 2, (rank + 1) * N // 2), slice(None)) if trainer else \
    (slice(None), slice(tp * 4, (tp + 1) * 4))


def fresh():
    return {name: tuple(np.full(shape, -1.0, np.float32) for _ in range(2))
            for name, shape in (("w", (N, 4)), ("b", (8,)))} if not trainer else {}


copies = fresh()
reg_copies = fresh()  # the registered plan's (its copy 0)


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


# the registered plan (keep mode): its own source arrays, filled in place
# before each version, and destination copy 0; registered once
reg_src = {"w": np.zeros((N // 2, 8), np.float32), "b": np.zeros(8, np.float32)} if trainer else {}
reg_dst = {name: c[0] for name, c in reg_copies.items()}


def make_reg_plan(comm):
    return reshard.Plan(comm, SRC, DST, timeout_ms=TIMEOUT_MS)


def reg_version(plan, version, what):
    if trainer:
        reg_src["w"][...] = values("w", version)[mine_w]
        reg_src["b"][...] = values("b", version)
    plan.execute(reg_src, reg_dst, version=version)
    if not trainer and (not (reg_dst["w"] == values("w", version)[mine_w]).all()
                        or not (reg_dst["b"] == values("b", version)).all()):
        fail("%s: the registered plan's version %d is not whole element by element" % (what, version))


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
    if not any("ranks 0 and %d" % v in msg for v in VICTIMS):
        fail("the mismatch does not name rank 0 and a newcomer: %s" % msg)
    if plan is None:
        return make_plan(comm)
    t0 = time.monotonic()
    plan.rejoin()
    return plan, (time.monotonic() - t0) * 1e3


def after_rejoin(comm, t_join, who, kept=None, reg=None):
    plan, ms_plan = rejoin_plan(comm, kept) if keep else make_plan(comm)
    if keep:
        if reg is None:
            reg = make_reg_plan(comm)
        else:
            reg.rejoin()
    sync(plan, NEXT)
    check(plan, NEXT, "after the rejoin")
    if keep:
        reg_version(reg, NEXT, "staged after the rejoin")
        reg.register_buffers(reg_src, reg_dst)
        reg_version(reg, NEXT + 1, "registered again after the rejoin")
        reg.close()
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


if role == "early":  # retry: a newcomer whose partner does not come
    t0 = time.monotonic()
    try:
        reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=30000, joining=True)
    except reshard.TimeoutError as e:
        if "rank 0 gave up" not in str(e):
            fail("the early newcomer's TimeoutError does not say rank 0 gave up: %s" % e)
        print("EARLY NEWCOMER GAVE UP after %.0f ms: %s" % ((time.monotonic() - t0) * 1e3, e), flush=True)
        sys.exit(0)
    fail("the early newcomer joined though its partner never came")

if role == "newcomer":
    t0 = time.monotonic()
    comm = reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=30000, joining=True)
    after_rejoin(comm, t0, "newcomer")
    sys.exit(0)

comm = reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=30000)
plan, _ = make_plan(comm)
reg = None
if keep:
    reg = make_reg_plan(comm)
    reg.register_buffers(reg_src, reg_dst)
    for v in (1, 2):
        reg_version(reg, v, "registered before the kill")
version = 0
while True:
    version += 1
    if rank in VICTIMS and version == 3:
        print("RANK%d AT 2" % rank, flush=True)
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
        fail("version %d succeeded with ranks %s killed" % (version, VICTIMS))
if not keep:
    plan.close()
try:
    comm.rejoin(0)
    fail("rejoin(0) was not refused")
except reshard.InvalidArgumentError as e:
    if "rank 0 holds the rendezvous" not in str(e):
        fail("rejoin(0): %s" % e)
if retry:  # one newcomer only: TimeoutError with nothing changed, then again
    t1 = time.monotonic()
    try:
        comm.rejoin(VICTIMS, timeout_ms=1500)
        fail("the rejoin with one newcomer of two succeeded")
    except reshard.TimeoutError as e:
        ms = (time.monotonic() - t1) * 1e3
        if "nothing changed" not in str(e) or ms > 1500 + 2000 + 1000:
            fail("the first rejoin: %.0f ms: %s" % (ms, e))
        print("rank %d: the rejoin with one newcomer of two timed out after %.0f ms, nothing changed" % (rank, ms),
              flush=True)
t0 = time.monotonic()
comm.rejoin(VICTIMS if len(VICTIMS) > 1 else VICTIMS[0], timeout_ms=30000)
after_rejoin(comm, t0, "staying", plan if keep else None, reg)
