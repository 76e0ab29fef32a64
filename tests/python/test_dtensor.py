"""reshard.dtensor.layout from ParamSpecs, torch-free (the side of a sync
that has no model builds the trainer's layout this way; the specs' reading
from live DTensors is tested with the real torch FSDP2 in
tests/python/real/fsdp_world.py)."""
import pickle

import pytest

import reshard
from reshard.dtensor import ParamSpec


def test_layout_from_specs():
    """FSDP2 over TP as describe() gives it: the mesh in reshard's axis
    order (tp first, then dp, each splitting the previous piece), torch
    ranks mapped through first_rank; a plain parameter replicated. Every
    rank's box is the shard of a shard torch.chunk gives: 7 rows over tp
    2 are 4 + 3, then over dp 3 are (2, 2, 0) and (1, 1, 1)."""
    specs = [
        ParamSpec("w", "bf16", (7, 4), (2, 3), (0, 2, 4, 1, 3, 5),
                  (reshard.Shard(0), reshard.Shard(0)), (2, 4)),
        ParamSpec("norm", "f32", (4,), (6,), tuple(range(6)),
                  (reshard.Replicate(),), (4,)),
    ]
    specs = pickle.loads(pickle.dumps(specs))
    L = reshard.dtensor.layout(specs, first_rank=10)
    assert [t.name for t in L.tensors()] == ["w", "norm"]
    rows = {}
    for r in range(10, 16):
        for f in L.fragments(r):
            if f.name == "w":
                rows[r - 10] = f.box[0]
            else:
                assert f.box == ((0, 4),)
    # torch rank (dp a, tp b) = 2a + b
    assert rows == {0: (0, 2), 2: (2, 4), 1: (4, 5), 3: (5, 6), 5: (6, 7)}
    assert L.fragments(0) == []


def test_layout_rank_map_refused_when_short():
    spec = ParamSpec("w", "bf16", (4,), (2,), (0, 1), (reshard.Shard(0),))
    with pytest.raises(reshard.InvalidArgumentError, match=r"'w'.*torch rank 1"):
        reshard.dtensor.layout([spec], ranks=[5])


def test_fsdp_layout_of_config(tmp_path):
    """reshard.models.fsdp_layout (rm_fsdp_layout) against the layout of
    the ParamSpecs FSDP2 gives each parameter (Shard(0) over dp_shard,
    (Replicate(), Shard(0)) over [dp_replicate, dp_shard]): the same box on
    every rank; the real FSDP2's are compared in fsdp_world.py."""
    from frameworks import tiny_config
    cfg = tiny_config(tmp_path)
    model = reshard.models.Model(cfg)
    for spec, mesh, pls in (
            ("dp_shard=3", (3,), (reshard.Shard(0),)),
            ("dp_shard=3,dp_replicate=2", (2, 3),
             (reshard.Replicate(), reshard.Shard(0)))):
        n = 1
        for s in mesh:
            n *= s
        assert reshard.models.ranks(spec) == n
        twin = reshard.models.fsdp_layout(cfg, spec, first_rank=2)
        specs = [ParamSpec(t.name, t.dtype, t.shape, mesh, tuple(range(n)),
                           pls) for t in model.tensors()]
        L = reshard.dtensor.layout(specs, first_rank=2)
        for r in range(n + 3):
            assert sorted((f.name, f.box) for f in twin.fragments(r)) == \
                sorted((f.name, f.box) for f in L.fragments(r)), (spec, r)
    with pytest.raises(reshard.InvalidArgumentError, match="'tp' is not FSDP2's"):
        reshard.models.fsdp_layout(cfg, "dp_shard=2,tp=2")
