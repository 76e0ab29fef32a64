"""reshard in a Ray-launched job, as verl, NeMo-RL and OpenRLHF launch
trainer and inference workers: Ray actors as ranks, no mpirun, meeting
over reshard.Comm.ucx: random layouts, and a replica of two actors
killed (ray.kill) and replaced by two new actors while the others keep
their communicator and plan. The real Ray from PyPI (scripts/test_real.sh
installs it with verl's requirements); skipped where Ray or reshard's UCX
transport is missing."""
import os
import sys

import pytest

ray = pytest.importorskip("ray", reason="the real Ray: bash scripts/test_real.sh")
import reshard  # noqa: E402

pytestmark = pytest.mark.skipif(not reshard.HAVE_UCX, reason="needs a reshard built with UCX")

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(TESTS), "support"))
from free_port import free_port  # noqa: E402


@ray.remote(num_cpus=0)
class Rank:
    """One rank: random layout cases of test_random_layouts.py (every
    destination byte and every byte outside fragments checked), over a UCX
    communicator made inside the actor; every second case with its numpy
    buffers registered (plan.register_buffers: one-sided reads)."""

    def run(self, rendezvous, rank, size, seeds):
        import sys
        sys.path.insert(0, TESTS)
        import reshard
        from test_random_layouts import make_case
        with reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=60000) as comm:
            for i, s in enumerate(seeds):
                make_case(s, size, register=i % 2 == 1)(rank, comm)
        return "rank %d: %d cases OK" % (rank, len(seeds))


def test_random_layouts_over_ray_actors(seed):
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             ignore_reinit_error=True)
    try:
        size = 4
        actors = [Rank.remote() for _ in range(size)]
        seeds = [seed + k for k in range(6)]
        refs = [a.run.remote("127.0.0.1:%d" % port, r, size, seeds) for r, a in enumerate(actors)]
        # never hang: a deadline on the whole job
        done = ray.get(refs, timeout=240)
        assert done == ["rank %d: 6 cases OK" % r for r in range(size)], done
    finally:
        ray.shutdown()


# ---- a replica of Ray actors killed and replaced (issue 46) ----
N, SIZE, VICTIMS, TIMEOUT_MS = 32, 6, (4, 5), 1000


@ray.remote(num_cpus=0)
class Member:
    """One rank of the replaced-replica job. Ranks 0 and 1 train (w [N, 8]
    f32 sharded by rows, b [8] replicated); ranks 2..5 are two replicas of
    two tensor-parallel ranks (w sharded by columns inside a replica,
    replicated over them); every value a function of its global index and
    the version. A double-buffered plan over a UCX communicator made
    inside the actor; a newcomer joins instead (Comm.ucx(..., joining=True))
    and creates the plan the staying ranks keep (plan.rejoin()). (What the
    methods use is defined inside the class: Ray ships the class to its
    workers by value, where this test module cannot be imported.)"""

    N, SIZE, TIMEOUT_MS = N, SIZE, TIMEOUT_MS

    def values(self, name, version):
        import numpy as np
        if name == "w":
            return np.arange(self.N * 8, dtype=np.float32).reshape(self.N, 8) + 1000.0 * version
        return np.arange(8, dtype=np.float32) - 7.0 * version

    def layouts(self):
        import reshard
        out = []
        for side in ("src", "dst"):
            lay = reshard.Layout()
            w = lay.add_tensor("w", "f32", (self.N, 8))
            b = lay.add_tensor("b", "f32", (8,))
            if side == "src":
                m = lay.add_mesh((2,), start=0)
                lay.place(w, m, [reshard.Shard(0)])
                lay.place(b, m, [reshard.Replicate()])
            else:
                m = lay.add_mesh((2, 2), start=2)
                lay.place(w, m, [reshard.Replicate(), reshard.Shard(1)])
                lay.place(b, m, [reshard.Replicate(), reshard.Replicate()])
            out.append(lay)
        return out

    def _setup(self, comm, rank):
        import numpy as np
        import reshard
        n = self.N
        self.comm, self.rank = comm, rank
        src, dst = self.layouts()
        self.trainer = rank < 2
        tp = (rank - 2) % 2
        self.mine = (slice(rank * n // 2, (rank + 1) * n // 2), slice(None)) if self.trainer else \
            (slice(None), slice(tp * 4, tp * 4 + 4))
        self.copies = {} if self.trainer else {
            name: tuple(np.full(shape, -1.0, np.float32) for _ in range(2))
            for name, shape in (("w", (n, 4)), ("b", (8,)))}
        self.plan = reshard.Plan(comm, src, dst, timeout_ms=self.TIMEOUT_MS, double_buffer=True)
        return "rank %d ready" % rank

    def start(self, rendezvous, rank):
        import reshard
        return self._setup(reshard.Comm.ucx(rendezvous, rank, self.SIZE, timeout_ms=60000), rank)

    def join(self, rendezvous, rank):
        import reshard
        return self._setup(reshard.Comm.ucx(rendezvous, rank, self.SIZE, timeout_ms=60000, joining=True), rank)

    def sync(self, version):
        """Executes version `version`; says how it went and what the
        active copy holds."""
        import time
        import reshard
        src = {"w": self.values("w", version)[self.mine].copy(), "b": self.values("b", version)} \
            if self.trainer else {}
        t0 = time.monotonic()
        try:
            self.plan.execute(src, self.copies, version=version)
        except (reshard.TimeoutError, reshard.RemoteError, reshard.BackendError, reshard.InDoubtError) as e:
            return "failed after %.0f ms: %s; %s" % ((time.monotonic() - t0) * 1e3, type(e).__name__, self.whole())
        return "ok; " + self.whole()

    def whole(self):
        """Which version the active copy holds whole, element by element."""
        st = self.plan.status()
        if self.trainer:
            return "committed %d" % st.committed_version
        v = st.committed_version
        got = {k: c[st.active_copy] for k, c in self.copies.items()}
        ok = (got["w"] == self.values("w", v)[self.mine]).all() and (got["b"] == self.values("b", v)).all()
        return "committed %d %s" % (v, "whole" if ok else "NOT WHOLE")

    def rejoin(self, victims):
        import time
        t0 = time.monotonic()
        self.comm.rejoin(list(victims), timeout_ms=60000)
        self.plan.rejoin()
        return "rejoined in %.0f ms" % ((time.monotonic() - t0) * 1e3)


def test_replica_of_ray_actors_killed_and_replaced():
    """Six actors; after versions 1 and 2, ray.kill of both actors of the
    second replica (ranks 4 and 5): version 3 fails on the staying ranks
    within two deadlines + 1 s with version 2 whole in the active copy; two
    new actors join as ranks 4 and 5 while the staying ranks call
    comm.rejoin([4, 5]) and keep their plan (plan.rejoin()); version 4
    arrives whole on every destination rank, the newcomers included."""
    port = free_port()
    rendezvous = "127.0.0.1:%d" % port
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        actors = [Member.remote() for _ in range(SIZE)]
        assert ray.get([a.start.remote(rendezvous, r) for r, a in enumerate(actors)], timeout=120) == \
            ["rank %d ready" % r for r in range(SIZE)]
        for v in (1, 2):
            got = ray.get([a.sync.remote(v) for a in actors], timeout=60)
            assert all(g.startswith("ok; committed %d" % v) and "NOT" not in g for g in got), got
        for r in VICTIMS:
            ray.kill(actors[r], no_restart=True)
        staying = [a for r, a in enumerate(actors) if r not in VICTIMS]
        got = ray.get([a.sync.remote(3) for a in staying], timeout=60)
        for g in got:
            assert g.startswith("failed after") and "committed 2" in g and "NOT" not in g, got
            assert float(g.split("failed after ")[1].split(" ms")[0]) <= 2 * TIMEOUT_MS + 1000, got
        newcomers = [Member.remote() for _ in VICTIMS]
        refs = [a.rejoin.remote(VICTIMS) for a in staying] + \
            [n.join.remote(rendezvous, r) for n, r in zip(newcomers, VICTIMS)]
        got = ray.get(refs, timeout=120)
        assert all(g.startswith("rejoined in") for g in got[:len(staying)]), got
        members = staying[:4] + newcomers  # ranks 0..3, then 4 and 5
        got = ray.get([a.sync.remote(4) for a in members], timeout=60)
        assert all(g.startswith("ok; committed 4") and "NOT" not in g for g in got), got
        print(got)
    finally:
        ray.shutdown()


# ---- replicas of Ray actors that join and leave: comm.resize (issue 46) ----


@ray.remote(num_cpus=0)
class Elastic:
    """One rank of an inference fleet that grows and shrinks. Ranks 0 and
    1 train (w [N, 8] f32 sharded by rows, b [8] replicated); ranks 2 ..
    size-1 are replicas of two tensor-parallel ranks (w sharded by columns
    inside a replica, replicated over them). plan() makes the plan of the
    communicator's current size; every value a function of its global
    index and the version. (Defined inside the class: Ray ships it by
    value.)"""

    N = N

    def values(self, name, version):
        import numpy as np
        if name == "w":
            return np.arange(self.N * 8, dtype=np.float32).reshape(self.N, 8) + 1000.0 * version
        return np.arange(8, dtype=np.float32) - 7.0 * version

    def start(self, rendezvous, rank, size, joining=False):
        import reshard
        self.comm = reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=60000, joining=joining)
        self.plan = None
        return self.make_plan()

    def make_plan(self):
        import numpy as np
        import reshard
        n, rank, size = self.N, self.comm.rank, self.comm.size
        lays = []
        for side in ("src", "dst"):
            lay = reshard.Layout()
            w = lay.add_tensor("w", "f32", (n, 8))
            b = lay.add_tensor("b", "f32", (8,))
            m = lay.add_mesh((2,), start=0) if side == "src" else lay.add_mesh(((size - 2) // 2, 2), start=2)
            lay.place(w, m, [reshard.Shard(0)] if side == "src" else [reshard.Replicate(), reshard.Shard(1)])
            lay.place(b, m, [reshard.Replicate()] * (1 if side == "src" else 2))
            lays.append(lay)
        if self.plan is not None:
            self.plan.close()
        self.plan = reshard.Plan(self.comm, lays[0], lays[1], timeout_ms=10000)
        self.trainer = rank < 2
        tp = (rank - 2) % 2
        self.mine = (slice(rank * n // 2, (rank + 1) * n // 2), slice(None)) if self.trainer else \
            (slice(None), slice(tp * 4, tp * 4 + 4))
        self.dst = {} if self.trainer else {"w": np.full((n, 4), -1.0, np.float32),
                                           "b": np.full(8, -1.0, np.float32)}
        return "rank %d of %d" % (rank, size)

    def sync(self, version):
        src = {"w": self.values("w", version)[self.mine].copy(), "b": self.values("b", version)} \
            if self.trainer else {}
        self.plan.execute(src, self.dst)
        if self.trainer:
            return "ok"
        ok = (self.dst["w"] == self.values("w", version)[self.mine]).all() and \
            (self.dst["b"] == self.values("b", version)).all()
        return "ok" if ok else "rank %d: version %d NOT WHOLE" % (self.comm.rank, version)

    def resize(self, leave, join):
        import reshard
        self.comm.resize(leave=list(leave), join=join, timeout_ms=60000)
        src = {"w": self.values("w", 99)[self.mine].copy(), "b": self.values("b", 99)} if self.trainer else {}
        try:
            self.plan.execute(src, self.dst)
        except reshard.InvalidUsageError as e:
            if "resized" not in str(e):
                return "the plan of before refused for another reason: %s" % e
        else:
            return "the plan of before was not refused"
        return self.make_plan()


def test_replicas_of_ray_actors_join_and_leave():
    """Four actors (2 trainers, one replica of two) move version 1; two new
    actors join as ranks 4 and 5 of 6 while the others call
    comm.resize(join=2): version 2 whole on both replicas. Then the first
    replica's actors are ray.kill'ed and the others call
    comm.resize(leave=[2, 3]): the second replica's actors are ranks 2 and
    3 of 4, version 3 whole. The plans of before are refused after each
    resize (InvalidUsageError)."""
    rendezvous = "127.0.0.1:%d" % free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        first = [Elastic.remote() for _ in range(4)]
        assert ray.get([a.start.remote(rendezvous, r, 4) for r, a in enumerate(first)], timeout=120) == \
            ["rank %d of 4" % r for r in range(4)]
        assert ray.get([a.sync.remote(1) for a in first], timeout=60) == ["ok"] * 4
        second = [Elastic.remote() for _ in range(2)]
        got = ray.get([a.resize.remote([], 2) for a in first] +
                      [a.start.remote(rendezvous, r, 6, True) for a, r in zip(second, (4, 5))], timeout=120)
        assert got == ["rank %d of 6" % r for r in range(6)], got
        fleet = first + second
        assert ray.get([a.sync.remote(2) for a in fleet], timeout=60) == ["ok"] * 6
        for a in first[2:]:
            ray.kill(a, no_restart=True)
        staying = first[:2] + second
        got = ray.get([a.resize.remote([2, 3], 0) for a in staying], timeout=120)
        assert got == ["rank %d of 4" % r for r in range(4)], got
        assert ray.get([a.sync.remote(3) for a in staying], timeout=60) == ["ok"] * 4
    finally:
        ray.shutdown()
