"""The framework adapters against stand-ins of the frameworks' interfaces:
parameters found by name, every byte checked from global coordinates."""
import numpy as np
import pytest

import reshard
from reshard.integrations import named_tensors, sync_weights
from conftest import run_ranks
from frameworks import FakeModule, params_for, tiny_config, wrong_bytes


def test_sync_weights_named_parameters(tmp_path):
    cfg = tiny_config(tmp_path)
    train, infer = "tp=2,pp=2", "tp=2,dp=2"

    def fn(rank, comm):
        src = reshard.models.megatron_layout(cfg, train)
        dst = reshard.models.vllm_layout(cfg, infer, first_rank=4)
        trainer = infer_model = None
        if rank < 4:  # Megatron wraps its model in DDP: names get "module."
            trainer = FakeModule(params_for(src, rank, step=0),
                                 buffers={"unrelated": object()}, prefix="module.")
        else:
            infer_model = FakeModule(params_for(dst, rank))
        bad = 0
        with reshard.Plan(comm, src, dst, timeout_ms=30000) as plan:
            for step in range(3):
                if trainer is not None and step:  # the optimizer step
                    fresh = params_for(src, rank, step=step)
                    for n, t in trainer._p.items():
                        t.bytes[:] = fresh[n].bytes
                b = sync_weights(plan, trainer, infer_model, step,
                                 strip_prefix="module.")
                if infer_model is not None:
                    bad += wrong_bytes(dst, rank, dict(infer_model._p), step)
                if step == 0:
                    first = b
                else:
                    assert b is first  # bound once
            assert plan.status().committed_version == 3
        return bad
    assert run_ranks(8, fn) == [0] * 8


def test_sync_weights_reports_missing_parameters(tmp_path):
    cfg = tiny_config(tmp_path)

    def fn(rank, comm):
        src = reshard.models.megatron_layout(cfg, "tp=1")
        dst = reshard.models.vllm_layout(cfg, "tp=1")
        params = params_for(src, 0, step=0)
        del params["decoder.final_layernorm.weight"]
        out = params_for(dst, 0)
        with reshard.Plan(comm, src, dst) as plan:
            with pytest.raises(reshard.InvalidArgumentError,
                               match="decoder.final_layernorm.weight"):
                sync_weights(plan, FakeModule(params), FakeModule(out), 0)
        return True
    assert run_ranks(1, fn) == [True]


def test_named_tensors():
    m = FakeModule({"a": 1}, {"b": 2, "a": 3}, prefix="module.")
    assert named_tensors(m, "module.") == {"a": 1, "b": 2}
    assert named_tensors({"x": 1}) == {"x": 1} and named_tensors(None) == {}
    with pytest.raises(reshard.InvalidArgumentError):
        named_tensors(42)
