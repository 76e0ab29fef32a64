"""reshard in a Ray-launched job, as verl, NeMo-RL and OpenRLHF launch
trainer and inference workers: Ray actors as ranks, no mpirun, meeting
over reshard.Comm.ucx. The real Ray from PyPI (scripts/test_real.sh
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
