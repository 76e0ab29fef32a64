"""Single-process scenarios of reshard's SGLang adapter against the real
SGLang 0.5.23 (its model classes, its model-runner WeightUpdater; torch's
CPU device, a gloo world of 1: SGLang's tp 1). Each runs in a fresh
process, as SGLang's parallel state is per process:

    python sglang_single.py NAME        # prints "ok NAME" or raises

The trainer ranks are threads of the same process over an in-process
world ("inproc:" transport); the stand-in is the engine's IPC (Engine
below calls the WeightUpdater directly, as a scheduler does).
"""
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import sglang_world  # noqa: E402
from vllm_world import (SENTINEL, check, esize, positions, torch_dtype,  # noqa: E402
                        want, write_configs)

import re  # noqa: E402

import numpy as np  # noqa: E402


def _setup():
    from sglang.srt.distributed.parallel_state import \
        init_distributed_environment
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo",
        distributed_init_method="tcp://127.0.0.1:%d" % (
            29800 + os.getpid() % 150))
    sglang_world.topology(0, "tp=1")
    return write_configs("/tmp/reshard-sglang-single-%d" % os.getpid())


class Engine:
    """sglang.Engine's weight-update methods calling one worker's SGLang
    WeightUpdater directly (a scheduler's part), with the session rule of
    SchedulerWeightUpdaterManager (end after a load: run_post_load=False).
    An exception of the loader propagates (SGLang's does not catch it)."""

    def __init__(self, model, on_end=None):
        from reshard.integrations import sglang as rsgl
        from sglang.srt.model_executor.model_runner_components.weight_updater \
            import WeightUpdater
        self.updater = WeightUpdater(
            tp_rank=0, device="cpu", gpu_id=0, model_config=None,
            custom_weight_loaders=[rsgl.LOADER], get_model=lambda: model,
            update_model_fields=None, recapture_cuda_graph=None,
            get_model_runner=None)
        self.calls, self.on_end, self.updates = [], on_end, 0

    def begin_weight_update(self):
        self.calls.append("begin")
        self.updater.begin_weight_update()
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None,
                                   flush_cache=True):
        self.calls.append("update")
        self.updates += 1
        return self.updater.update_weights_from_tensor(
            named_tensors=named_tensors, load_format=load_format)

    def end_weight_update(self):
        self.calls.append("end")
        self.updater.end_weight_update(run_post_load=False)
        if self.on_end is not None:
            self.on_end(self.updates)
        return True, "Success"


def _trainers(path, train, infer, world_key, engine, steps, timeout_ms=30000,
              **info_kw):
    """Runs the trainer ranks of ``train`` as threads for ``steps`` steps
    (values of step s from global coordinates); returns their exceptions."""
    import torch
    import reshard
    from reshard.integrations.sglang import (ReshardSGLangInitInfo,
                                             SGLangTrainer)
    T = reshard.models.ranks(train)
    src = reshard.models.megatron_layout(path, train)
    errors = [None] * T

    def rank_fn(r):
        try:
            bufs, tensors = {}, {}
            dt = {src.buffer_name(f.buffer): f.dtype for f in src.fragments(r)}
            for n, b in src.buffers(r).items():
                bufs[n] = np.full(src.buffer_bytes(b, r), SENTINEL, np.uint8)
                tensors[n] = torch.from_numpy(bufs[n]).view(torch_dtype(dt[n]))
            info = ReshardSGLangInitInfo(
                model_config_path=path, train=train, infer=infer,
                world_size=T + 1, transport="inproc:" + world_key,
                timeout_ms=timeout_ms, **info_kw)
            tr = SGLangTrainer(info, r, lambda: [("module." + n, t) for n, t
                                                 in tensors.items()],
                               engines=[engine] if r == 0 else None)
            try:
                for step in range(1, steps + 1):
                    for f in src.fragments(r):
                        es = esize(f.dtype)
                        bufs[src.buffer_name(f.buffer)][positions(f, es)] = \
                            want(f.tensor, src.tensor(f.tensor).shape, f.box,
                                 es, step)
                    tr.send_weights()
            finally:
                tr.shutdown()
        except BaseException as e:
            errors[r] = e
    threads = [threading.Thread(target=rank_fn, args=(r,), daemon=True)
               for r in range(T)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_ms / 1000 * 4 + 60)
        assert not t.is_alive(), "a trainer thread ran past its deadline"
    return errors


def _world(key, n):
    import reshard
    from reshard.integrations import WORLDS
    WORLDS[key] = reshard.InprocWorld(n)
    return WORLDS[key]


def end_to_end():
    """Qwen3-MoE and DeepSeek-V3 (MLA: w_kc / w_vc re-derived): trainer
    tp=2 / ep=2 to SGLang tp=1, two steps, every byte of every parameter
    checked against global coordinates and SGLang's own load_weights, the
    rest untouched, the session's calls in order, the worker's plan built
    once; then a new trainer with the same init info: a new plan."""
    import reshard
    from reshard.integrations import sglang as rsgl
    paths = _setup()
    for cfg, train in (("qwen3_moe", "tp=2"), ("deepseek_v3", "dp=2,ep=2")):
        path = os.path.join(paths[cfg], "config.json")
        model, ref = sglang_world.build(path), sglang_world.build(path)
        dst = reshard.models.sglang_layout(path, "tp=1", first_rank=2)
        failures, plans = [], []

        def on_end(step):
            check(step, dst, 2, model, ref, path, cfg, failures.append,
                  engine="SGLang")
            sglang_world.check_mla(step, model, ref, cfg, failures.append)
            plans.append(rsgl._WORKERS[model])
        engine = Engine(model, on_end)
        world = _world(cfg, 3)
        errs = _trainers(path, train, "tp=1", cfg, engine, 2)
        assert errs == [None, None], errs
        assert not failures, failures[:5]
        assert engine.calls == ["begin", "update", "end"] * 2, engine.calls
        assert len(plans) == 2 and plans[0] is plans[1]  # built once
        if cfg == "qwen3_moe":
            # a new trainer (a restarted job, versions from 1 again) with
            # the same init info: its plan id makes the worker build anew
            old = world
            world = _world(cfg, 3)
            engine.updates = 0  # the new trainer's steps: 1, 2 again
            errs = _trainers(path, train, "tp=1", cfg, engine, 2)
            assert errs == [None, None], errs
            assert not failures, failures[:5]
            assert len(plans) == 4 and plans[2] is not plans[1] and \
                plans[2] is plans[3]
            old.close()
        rsgl.close(model)
        world.close()


def _raises(exc, pattern, fn, *args):
    import re
    try:
        fn(*args)
    except exc as e:
        assert re.search(pattern, str(e)), (pattern, str(e))
        return e
    raise AssertionError("no %s matching %r" % (exc.__name__, pattern))


def refusals():
    """A worker refuses before any plan, naming the parameter or setting:
    an inference spec other than SGLang's own parallel state; each live
    format reshard does not write, set as SGLang sets it (the triton_kernels
    MoE backend's flag, AMX packing's flag, a kv_b_proj in a model whose
    post_load_weights is gone); a dtype the model does not hold, which
    reaches the trainer's sender as the worker's error while the other
    trainer rank fails at its plan deadline."""
    import reshard
    from reshard.integrations import sglang as rsgl
    paths = _setup()
    moe = os.path.join(paths["qwen3_moe"], "config.json")
    model = sglang_world.build(moe)
    world = _world("refuse", 2)

    def info(**kw):
        base = dict(model_config_path=moe, train="tp=1", infer="tp=1",
                    world_size=2, transport="inproc:refuse", rank_offset=1,
                    timeout_ms=3000)
        base.update(kw)
        return rsgl.ReshardSGLangInitInfo(**base)
    # SGLang runs tp 1 here
    _raises(reshard.InvalidArgumentError,
            r"runs tp_size=1, the inference spec 'tp=2' says 2",
            rsgl.load, model, rsgl.payload(info(infer="tp=2", world_size=3), 1))
    _raises(reshard.InvalidArgumentError, r"replica 1 is not one of the 1",
            rsgl.load, model, rsgl.payload(info(replica=1), 1))
    _raises(reshard.InvalidArgumentError, r"payload must be exactly",
            rsgl.load, model, [("model.norm.weight", model.model.norm.weight)])
    experts = model.model.layers[1].mlp.experts
    experts.quant_method.use_triton_kernels = True
    _raises(reshard.UnsupportedError,
            r"rank 1: 2 parameters .*model\.layers\.1\.mlp\.experts\.w13_weight: "
            r"SGLang's triton_kernels MoE backend.*also model\.layers\.1\.mlp"
            r"\.experts\.w2_weight", rsgl.load, model, rsgl.payload(info(), 1))
    experts.quant_method.use_triton_kernels = False
    model.model.layers[0].self_attn.qkv_proj.use_intel_amx_backend = True
    _raises(reshard.UnsupportedError,
            r"model\.layers\.0\.self_attn\.qkv_proj\.weight: SGLang packed it "
            r"for Intel AMX", rsgl.load, model, rsgl.payload(info(), 1))
    model.model.layers[0].self_attn.qkv_proj.use_intel_amx_backend = False
    assert rsgl._WORKERS.get(model) is None  # no plan kept
    world.close()

    ds = os.path.join(paths["deepseek_v3"], "config.json")
    dmodel = sglang_world.build(ds)
    dmodel.post_load_weights = None
    world = _world("refuse2", 2)
    _raises(reshard.UnsupportedError,
            r"model\.layers\.0\.self_attn\.kv_b_proj\.weight: SGLang's "
            r"DeepseekV2WeightLoaderMixin\.post_load_weights.*no "
            r"post_load_weights to re-run", rsgl.load, dmodel,
            rsgl.payload(info(model_config_path=ds,
                              transport="inproc:refuse2"), 1))
    world.close()

    # the served model is bf16, the trainer's spec says f32: the worker's
    # refusal reaches the trainer's sender; the other rank times out
    engine = Engine(model)
    world = _world("dtype", 3)
    errs = _trainers(moe, "tp=2", "tp=1", "dtype", engine, 1,
                     timeout_ms=3000, dtype="f32")
    assert isinstance(errs[0], reshard.UnsupportedError), errs
    assert re.search(r"reshard SGLang engine, rank 2: \d+ parameters .*"
                     r"lm_head\.weight: SGLang holds it as \(256, 64\) "
                     r"torch\.bfloat16 \(32768 bytes\), reshard's layout says "
                     r"torch\.float32 \(65536 bytes\) on rank 2",
                     str(errs[0])), str(errs[0])
    assert isinstance(errs[1], reshard.TimeoutError), errs
    assert engine.calls == ["begin", "update", "end"], engine.calls
    assert rsgl._WORKERS.get(model) is None
    # nothing was written: every byte still the sentinel
    import torch
    for n, p in model.named_parameters():
        assert bool((p.data.view(torch.uint8) == SENTINEL).all()), n
    world.close()


def main():
    name = sys.argv[1]
    globals()[name]()
    print("ok", name)


if __name__ == "__main__":
    main()
