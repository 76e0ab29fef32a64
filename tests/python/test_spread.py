"""Source-side spreading (src/plan/spread.h) through the binding: a
pipeline stage's experts held by two of eight source ranks in one NVLink
domain; with a topology the plan copies their excess to the other six
over NVLink first (spread=True: when the cost model predicts it faster),
every element still checked by the self-test; spread=False turns it off."""
import pytest

import reshard
from conftest import run_ranks


def layouts():
    src, dst = reshard.Layout(), reshard.Layout()
    for L in (src, dst):
        L.add_tensor("experts", "bf16", (4, 1024, 512))
        L.add_tensor("dense", "f32", (256, 256))
    two = src.add_mesh(2, ranks=[0, 1])
    eight = src.add_mesh(8, ranks=list(range(8)))
    src.place("experts", two, [reshard.Shard(0)])
    src.place("dense", eight, [reshard.Replicate()])
    m = dst.add_mesh(8, ranks=list(range(8, 16)))
    dst.place("experts", m, [reshard.Shard(1)])
    dst.place("dense", m, [reshard.Shard(0)])
    return src, dst


def test_spread_is_exact_and_faster():
    src, dst = layouts()
    seconds = {}
    for spread in (False, True):
        def rank_fn(rank, comm):
            s, d = reshard.SelfTest(src, rank, 3), reshard.SelfTest(dst, rank, -1)
            with reshard.Plan(comm, src, dst, topology="h100-8x400g", relay=0, spread=spread,
                              timeout_ms=30000) as plan:
                est = plan.estimate()
                plan.execute(s.arrays, d.arrays)
            return d.check(3, "spread"), est.seconds

        res = run_ranks(16, rank_fn)
        assert all(wrong == 0 for wrong, _ in res), spread
        seconds[spread] = res[0][1]
    assert seconds[True] < seconds[False]


def test_spread_argument_checked():
    src, dst = layouts()
    with pytest.raises(reshard.InvalidArgumentError, match="spread"):
        reshard.Plan(None, src, dst, spread="sometimes")
