"""The framework adapters against stand-ins of the frameworks' interfaces:
parameters found by name, every byte checked from global coordinates."""
import numpy as np
import pytest

import reshard
from reshard.integrations import named_tensors, sync_weights
from conftest import run_ranks
from frameworks import FakeModule, FakeTensor, params_for, tiny_config, wrong_bytes


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


def test_sync_weights_follows_reallocated_parameters(tmp_path):
    """Parameters reallocated between steps (issue 42, item 6: vLLM
    sleep/wake or load_state_dict(assign=True) left 2,179,035 elements
    stale with a clean status): a replaced tensor object and a tensor
    whose storage moved under the same object are both written at the
    next step, every byte checked; the old storage is left alone."""
    cfg = tiny_config(tmp_path)

    def fn(rank, comm):
        src = reshard.models.megatron_layout(cfg, "tp=1")
        dst = reshard.models.vllm_layout(cfg, "tp=1")
        out = params_for(dst, 0)
        infer = FakeModule(out)
        with reshard.Plan(comm, src, dst) as plan:
            sync_weights(plan, FakeModule(params_for(src, 0, step=0)), infer, 0)
            assert wrong_bytes(dst, 0, out, 0) == 0
            trainer = FakeModule(params_for(src, 0, step=1))
            b1 = sync_weights(plan, trainer, infer, 1)
            assert wrong_bytes(dst, 0, out, 1) == 0
            # assign=True: new tensor objects under the same names
            old = dict(out)
            kept = {n: old[n].bytes.copy() for n in out}
            for n in list(out)[::2]:
                out[n] = FakeTensor(old[n].bytes.size)
            trainer._p.update(params_for(src, 0, step=2))
            b2 = sync_weights(plan, trainer, infer, 2)
            assert b2 is not b1
            assert wrong_bytes(dst, 0, out, 2) == 0
            assert all((old[n].bytes == kept[n]).all() for n in list(out)[::2])
            # the same objects, storage moved (sleep / wake)
            moved = list(out)[1::2]
            for n in moved:
                out[n].bytes = np.full(out[n].bytes.size, 0xA5, np.uint8)
            trainer._p.update(params_for(src, 0, step=3))
            b3 = sync_weights(plan, trainer, infer, 3)
            assert b3 is not b2
            assert wrong_bytes(dst, 0, out, 3) == 0
            # nothing moved: the cached binding
            assert sync_weights(plan, trainer, infer, 4) is b3
        return True
    assert run_ranks(1, fn) == [True]


def test_sync_weights_refuses_a_model_on_a_rank_the_layout_skips(tmp_path):
    """vllm_layout without first_rank= on the inference side puts the
    destination on the trainer's ranks: the real inference rank, given its
    model, raises naming first_rank instead of succeeding with nothing
    received (issue 42, item 6); the trainer rank is told it holds
    destination buffers it did not pass."""
    cfg = tiny_config(tmp_path)

    def fn(rank, comm):
        src = reshard.models.megatron_layout(cfg, "tp=1")
        dst = reshard.models.vllm_layout(cfg, "tp=1")  # first_rank missing
        with reshard.Plan(comm, src, dst) as plan:
            if rank == 0:  # holds the destination it was not given
                with pytest.raises(reshard.InvalidArgumentError,
                                   match="rank 0 must pass 15 dst buffer"):
                    sync_weights(plan, FakeModule(params_for(src, 0, step=0)),
                                 None, 0)
                return True
            with pytest.raises(reshard.InvalidArgumentError,
                               match="rank 1: an inference model.*first_rank"):
                sync_weights(plan, None, FakeModule(params_for(dst, 0)), 0)
            return True
    assert run_ranks(2, fn) == [True, True]


def test_named_tensors():
    m = FakeModule({"a": 1}, {"b": 2, "a": 3}, prefix="module.")
    assert named_tensors(m, "module.") == {"a": 1, "b": 2}
    assert named_tensors({"x": 1}) == {"x": 1} and named_tensors(None) == {}
    with pytest.raises(reshard.InvalidArgumentError):
        named_tensors(42)


def _sglang_snippet():
    import os
    import re
    from conftest import ROOT
    text = open(os.path.join(ROOT, "python", "README.md")).read()
    sec = text[text.index("\n## SGLang\n"):]
    m = re.search(r"```python\n(.*?)```", sec, re.S)
    assert m, "python/README.md's SGLang section has no python block"
    return m.group(1)


def test_sglang_readme_trainer_snippet_builds_a_trainer():
    """python/README.md's SGLang trainer snippet, run as written with the
    shipped Qwen3-30B-A3B config (no step: its send_weights needs the
    SGLang workers, tests/python/real/sglang_world.py): a real
    SGLangTrainer on rank 0 (two engines) and on rank 3 (none), whose
    layouts, world size and engine count the constructor checks."""
    import os
    from conftest import ROOT
    from reshard.integrations import sglang as rsgl
    code = _sglang_snippet().replace(
        '"Qwen3-30B-A3B/config.json"',
        repr(os.path.join(ROOT, "configs", "Qwen3-30B-A3B.json")))
    for rank in (0, 3):
        env = {"master_ip": "127.0.0.1", "trainer_rank": rank,
               "megatron_model": FakeModule({}), "engine0": object(),
               "engine1": object(), "steps": 0, "train_step": None}
        exec(compile(code, "python/README.md", "exec"), env)
        t = env["trainer"]
        assert isinstance(t, rsgl.SGLangTrainer)
        assert t.info.rank_offset == 4 and len(t.engines) == (2 if rank == 0 else 0)
        assert t.held  # this Megatron rank's parameters, from the layout


def test_sglang_trainer_refuses_a_wrong_world(tmp_path):
    """The SGLang trainer checks what it can before any collective: the
    world size against both specs, the sender's one engine per replica,
    the rank against the trainer spec; each error names the field."""
    from reshard.integrations.sglang import ReshardSGLangInitInfo, SGLangTrainer
    cfg = tiny_config(tmp_path)

    def info(**kw):
        base = dict(model_config_path=cfg, train="tp=2", infer="tp=2,dp=2",
                    world_size=6)
        base.update(kw)
        return ReshardSGLangInitInfo(**base)
    with pytest.raises(reshard.InvalidArgumentError,
                       match=r"world_size 5 is not the 2 trainer ranks .* "
                             r"plus the 4 inference ranks"):
        SGLangTrainer(info(world_size=5), 0, FakeModule({}), engines=[1, 2])
    with pytest.raises(reshard.InvalidArgumentError,
                       match=r"one engine per replica of 'tp=2,dp=2' \(2\), got 1"):
        SGLangTrainer(info(), 0, FakeModule({}), engines=[1])
    with pytest.raises(reshard.InvalidArgumentError,
                       match=r"rank 2 is not a trainer rank of 'tp=2' \(0 .. 1\)"):
        SGLangTrainer(info(), 2, FakeModule({}))
    t = SGLangTrainer(info(), 1, FakeModule({}))
    with pytest.raises(reshard.InvalidArgumentError,
                       match=r"rank 1: the source has no embedding\.word_embeddings"
                             r"\.weight .*and \d+ more"):
        t._local()
