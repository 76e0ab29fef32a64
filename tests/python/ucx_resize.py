"""An inference fleet that grows and shrinks over UCX, from Python (run by
tests/python/test_ucx.py as plain processes; reshard.Comm.resize):

    python ucx_resize.py HOST:PORT PROC first    (PROC 0 .. 3: the job of 4)
    python ucx_resize.py HOST:PORT PROC second   (PROC 4, 5: a replica that joins)

Ranks 0 and 1 train (the source: w [N, 8] f32 sharded by rows, b [8]
replicated); every replica is two tensor-parallel ranks (w sharded by
columns inside it, replicated over replicas; b replicated). The job
starts with one replica (processes 2, 3: ranks 2, 3 of 4) and moves
version 1. Then a second replica joins (processes 4, 5, started by the
test at once: Comm.ucx(..., rank 4 or 5, size 6, joining=True)) while
the others call comm.resize(join=2): the plan of before raises
InvalidUsageError, every rank makes the plan of 6 ranks, version 2.
Then the first replica dies (processes 2 and 3 SIGKILL themselves after
version 2) and the others call comm.resize(leave=[2, 3]): processes 4
and 5 are ranks 2 and 3 of 4 now, and version 3 moves over the new
plan. Every destination element of every version is checked against
values of its global index, on every destination rank; the arrays of a
refused plan are untouched. Each process prints "OK ..." with its times
(a newcomer's: its Comm.ucx call to its first version whole) or
"FAIL ...".
"""
import os
import signal
import sys
import time

import numpy as np

import reshard

rendezvous, proc, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
N, TIMEOUT_MS = 32, 10000


def fail(msg):
    print("FAIL process %d: %s" % (proc, msg), flush=True)
    sys.exit(1)


def values(name, version):
    """Version v of a tensor: a function of its global index."""
    if name == "w":
        return np.arange(N * 8, dtype=np.float32).reshape(N, 8) + 1000.0 * version
    return np.arange(8, dtype=np.float32) - 7.0 * version


def layout(side, size):
    L = reshard.Layout()
    w = L.add_tensor("w", "f32", (N, 8))
    b = L.add_tensor("b", "f32", (8,))
    if side == "src":
        m = L.add_mesh((2,), start=0)
        L.place(w, m, [reshard.Shard(0)])
        L.place(b, m, [reshard.Replicate()])
    else:  # (size - 2) / 2 replicas of two tensor-parallel ranks
        m = L.add_mesh(((size - 2) // 2, 2), start=2)
        L.place(w, m, [reshard.Replicate(), reshard.Shard(1)])
        L.place(b, m, [reshard.Replicate(), reshard.Replicate()])
    return L


class Job:
    """A plan over the communicator as it is now, and its arrays."""

    def __init__(self, comm):
        self.rank, self.size = comm.rank, comm.size
        self.plan = reshard.Plan(comm, layout("src", self.size), layout("dst", self.size), timeout_ms=TIMEOUT_MS)
        self.trainer = self.rank < 2
        tp = (self.rank - 2) % 2
        self.mine_w = (slice(self.rank * N // 2, (self.rank + 1) * N // 2), slice(None)) if self.trainer else \
            (slice(None), slice(tp * 4, (tp + 1) * 4))
        self.dst = {} if self.trainer else {"w": np.full((N, 4), -1.0, np.float32),
                                           "b": np.full(8, -1.0, np.float32)}
        self.version = None

    def src(self, version):
        if not self.trainer:
            return {}
        return {"w": np.ascontiguousarray(values("w", version)[self.mine_w]), "b": values("b", version)}

    def check(self, version, what):
        if self.trainer:
            return
        if not (self.dst["w"] == values("w", version)[self.mine_w]).all() or \
                not (self.dst["b"] == values("b", version)).all():
            fail("%s: rank %d of %d does not hold version %d element by element" % (what, self.rank, self.size,
                                                                                    version))

    def sync(self, version, what):
        self.plan.execute(self.src(version), self.dst)
        self.check(version, what)
        self.version = version

    def refused(self, what):
        """After a resize: the plan of before refuses, its arrays untouched."""
        try:
            self.plan.execute(self.src(99), self.dst)
        except reshard.InvalidUsageError as e:
            if "resized" not in str(e):
                fail("%s: the refusal does not say the communicator was resized: %s" % (what, e))
        else:
            fail("%s: the plan of before was not refused" % what)
        self.check(self.version, what + " (refused plan's arrays)")
        self.plan.close()


def expect(comm, rank, size, what):
    if (comm.rank, comm.size) != (rank, size):
        fail("%s: rank %d of %d, expected %d of %d" % (what, comm.rank, comm.size, rank, size))


times = []
if role == "second":
    t0 = time.monotonic()
    comm = reshard.Comm.ucx(rendezvous, proc, 6, timeout_ms=30000, joining=True)
    job = Job(comm)
    job.sync(2, "the grown job")
    times.append("Comm.ucx(joining=True) to version 2 whole %.1f ms" % ((time.monotonic() - t0) * 1e3))
else:
    comm = reshard.Comm.ucx(rendezvous, proc, 4, timeout_ms=30000)
    job = Job(comm)
    job.sync(1, "the first job")
    t0 = time.monotonic()
    comm.resize(join=2)
    expect(comm, proc, 6, "grown")
    job.refused("grown")
    job = Job(comm)
    job.sync(2, "the grown job")
    times.append("resize(join=2) to version 2 whole %.1f ms" % ((time.monotonic() - t0) * 1e3))
if proc in (2, 3):
    print("PROCESS %d DIES (rank %d)" % (proc, comm.rank), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
comm.resize(leave=[2, 3])
expect(comm, {0: 0, 1: 1, 4: 2, 5: 3}[proc], 4, "shrunk")
job.refused("shrunk")
job = Job(comm)
job.sync(3, "the shrunk job")
times.append("resize(leave=[2, 3]) to version 3 whole %.1f ms" % ((time.monotonic() - t0) * 1e3))
job.plan.close()
comm.close()
print("OK process %d (rank %d of 4 now): %s" % (proc, {0: 0, 1: 1, 4: 2, 5: 3}[proc], "; ".join(times)), flush=True)
