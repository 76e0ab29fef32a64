"""The cost of re-processing in the vLLM engine, against writing directly.

    VLLM_TARGET_DEVICE=cpu python bench/python/vllm_reprocess_cost.py \
        [--iters 5] [--hidden 8192] [--inter 3584] [--heads 8] [--kv 1]

Needs vLLM 0.33 (scripts/test_real.sh's environment). One decoder layer
of vLLM's own fp8 block LlamaForCausalLM (128 x 128 blocks), by default
the per-rank shapes of one Llama-3.1-70B layer at tp=8 for q/k/v and
gate/up (o_proj and down_proj keep the full input width: the same
order of bytes). Its linears are live in DeepGEMM's format (the
stand-ins of tests/python/real/vllm_world.py deepgemm_standin: kernel
choice, capability flags, CUDA scale-layout transform; the UE8M0
requantization is vLLM's). In one process, alternating, it times:

  direct   copying the layer's fp8 weights and scales into the live
           parameters (what a direct write moves: the floor)
  reproc   the engine's re-process path (_vllm_reload.Reprocess):
           stage the checkpoint format, the same copy into it, vLLM's
           processing with its result copied into the live tensors

and prints medians, the ratio reproc / direct, and the bytes staged. On
this machine's CPU the requantization's float32 passes dominate; on a
GPU they are elementwise kernels (not measured here: vLLM is not on the
device machine).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python", "real"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--inter", type=int, default=3584)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv", type=int, default=1)
    a = ap.parse_args()

    import torch
    import vllm_world
    from vllm.config import (ModelConfig, ParallelConfig, VllmConfig,
                             set_current_vllm_config)
    from vllm.distributed import (init_distributed_environment,
                                  initialize_model_parallel)
    from reshard.integrations import vllm as rvllm

    torch.accelerator.synchronize = lambda *x, **k: None
    d = tempfile.mkdtemp()
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": a.hidden, "intermediate_size": a.inter,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv,
           "head_dim": 128, "num_hidden_layers": 1, "vocab_size": 256,
           "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
           "torch_dtype": "bfloat16", "max_position_embeddings": 256,
           "quantization_config": {"quant_method": "fp8",
                                   "activation_scheme": "dynamic",
                                   "weight_block_size": [128, 128]}}
    path = os.path.join(d, "config.json")
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method="tcp://127.0.0.1:%d"
                                 % (29500 + os.getpid() % 400), backend="gloo")
    vllm_world.deepgemm_standin()
    vc = VllmConfig(model_config=ModelConfig(model=d, skip_tokenizer_init=True,
                                             dtype="bfloat16",
                                             enforce_eager=True),
                    parallel_config=ParallelConfig())
    with set_current_vllm_config(vc):
        initialize_model_parallel(1, 1)
    model = vllm_world.build(vc)
    vllm_world.process_quantized(model)
    dmodel, _, dst = rvllm._layouts(types.SimpleNamespace(
        model_config_path=path, layers=0, dtype="bf16", train="tp=1",
        infer="tp=1"), 1)
    reprocess, rerun, refused = rvllm._sync_modes(model, dmodel, dst, 1)
    assert not refused, refused
    rp = rvllm._Reprocess(reprocess, rerun, torch.bfloat16)
    # checkpoint-format values (a sync's writes): the reference
    # quantizer's codes and scales of finite bf16 values
    names = {m: n + "." for n, m in model.named_modules() if m in reprocess}
    ckpt = {}
    g = torch.Generator().manual_seed(7)
    for m, local in reprocess.items():
        for n in local:
            p = getattr(m, n)
            if p.dtype == torch.float32:
                ckpt[names[m] + n] = torch.rand(p.shape, generator=g) * 1e-3
            else:
                ckpt[names[m] + n] = (torch.randn(p.shape, generator=g) * 100
                                      ).to(p.dtype)
    direct, reproc, write = [], [], []
    for _ in range(a.iters):
        live = dict(model.named_parameters())
        t0 = time.perf_counter()
        for n, t in ckpt.items():
            live[n].data.copy_(t)
        direct.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        staged = rp.stage()
        t1 = time.perf_counter()
        params = dict(model.named_parameters())
        for n, t in ckpt.items():
            params[n].data.copy_(t)
        t2 = time.perf_counter()
        rp.process(staged)
        reproc.append(time.perf_counter() - t0)
        write.append(t2 - t1)
    nbytes = sum(t.numel() * t.element_size() for t in ckpt.values())
    md, mr, mw = (statistics.median(x) for x in (direct, reproc, write))
    print("layers %d, %d bytes staged (%.1f MB written), %d iters, medians:"
          % (len(reprocess), rp.staged_bytes, nbytes / 1e6, a.iters))
    print("  direct  %.1f ms" % (md * 1e3))
    print("  reproc  %.1f ms (of which the same copy %.1f ms)" % (mr * 1e3, mw * 1e3))
    print("  reproc / direct = %.1f" % (mr / md))


if __name__ == "__main__":
    main()
