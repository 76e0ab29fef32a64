"""The model front-end from Python: Megatron and vLLM layouts of a real
config, named as the frameworks name their parameters, synced byte for
byte on in-process ranks (reshard.SelfTest: values from global
coordinates, padding checked untouched)."""
import os

import numpy as np
import pytest

import reshard
from conftest import ROOT, run_ranks

QWEN = os.path.join(ROOT, "configs", "Qwen2.5-0.5B.json")
QWEN3_MOE = os.path.join(ROOT, "configs", "Qwen3-30B-A3B.json")


def test_model_info():
    m = reshard.models.Model(QWEN, layers=2)
    assert m.arch == "qwen2" and m.layers == 2 and m.dtype == "bf16"
    names = [t.name for t in m.tensors()]
    assert "model.layers.1.self_attn.q_proj.weight" in names
    assert names[0] == "model.embed_tokens.weight"
    # Qwen2.5-0.5B: hidden 896, 14 heads, 2 KV heads, head_dim 64
    q = m.tensors()[names.index("model.layers.0.self_attn.q_proj.weight")]
    assert q.shape == (896, 896) and q.dtype == "bf16" and q.scale == -1
    assert m.num_params == sum(int(np.prod(t.shape)) for t in m.tensors())
    with pytest.raises(reshard.InvalidArgumentError, match="nope"):
        reshard.models.Model(os.path.join(ROOT, "configs", "nope.json"))
    with pytest.raises(reshard.InvalidArgumentError, match="tpp"):
        reshard.models.ranks("tpp=2")


def test_framework_names_per_rank():
    src = reshard.models.megatron_layout(QWEN, "tp=2,pp=2", layers=4)
    dst = reshard.models.vllm_layout(QWEN, {"tp": 2, "dp": 2}, first_rank=4,
                                     layers=4)
    # Megatron numbers layers from 0 on every stage (stage 1 = ranks 2, 3)
    s2 = src.buffers(2)
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in s2
    assert "decoder.layers.2.self_attention.linear_qkv.weight" not in s2
    assert "output_layer.weight" in s2 and "embedding.word_embeddings.weight" not in s2
    # vLLM: global layer numbers, fused qkv_proj / gate_up_proj
    d5 = dst.buffers(5)
    assert "model.layers.3.self_attn.qkv_proj.weight" in d5
    assert "model.layers.3.mlp.gate_up_proj.weight" in d5
    b = d5["model.layers.3.self_attn.qkv_proj.weight"]
    assert reshard.models.parameter_name(dst, b, 5) == "model.layers.3.self_attn.qkv_proj.weight"
    # qkv_proj on TP rank 1 (rank 5): q rows 448 (7 heads x 64), k and v
    # 64 each (2 KV heads over tp 2), hidden 896, bf16
    assert dst.buffer_bytes(b, 5) == (448 + 64 + 64) * 896 * 2
    names = [f.name for f in dst.fragments(5) if f.buffer == b]
    assert names == ["model.layers.3.self_attn.%s_proj.weight" % p for p in "qkv"]
    with pytest.raises(reshard.InvalidArgumentError, match="rank 0"):
        reshard.models.parameter_name(dst, b, 0)


def test_after_load_flags():
    m = reshard.models.Model(QWEN3_MOE, layers=2)
    dst = reshard.models.vllm_layout(m, "tp=2,ep=2")
    flagged = {n: m.after_load("vllm", dst, b) for n, b in dst.buffers(0).items()}
    assert any(v and "w13" in n for n, v in flagged.items())
    assert flagged["model.embed_tokens.weight"] is None
    src = reshard.models.megatron_layout(m, "tp=2")
    assert all(m.after_load("megatron", src, b) is None
               for b in src.buffers(0).values())
    with pytest.raises(reshard.InvalidArgumentError):
        m.after_load("tensorrt", dst, 0)


def test_context_parallel():
    # Megatron's cp: a stage is tp x cp x dp ranks (RankGenerator order
    # "tp-cp-ep-dp-pp"); a CP rank holds its TP rank's weights
    assert reshard.models.ranks("tp=2,cp=2,pp=2") == 8
    src = reshard.models.megatron_layout(QWEN, "tp=2,cp=2,pp=2", layers=4)
    assert src.buffers(2).keys() == src.buffers(0).keys()  # (tp 0, cp 1)
    assert "output_layer.weight" in src.buffers(6)          # stage 1
    with pytest.raises(reshard.InvalidArgumentError, match="'cp' is Megatron's"):
        reshard.models.vllm_layout(QWEN, "tp=2,cp=2", layers=4)


@pytest.mark.parametrize("train,infer", [("tp=2,pp=2", "tp=2,dp=2"),
                                         ("tp=1,pp=2", "tp=2"),
                                         ("tp=2", "tp=1,pp=2,dp=2"),
                                         ("tp=2,cp=2", "tp=2")])
def test_model_sync_inproc(train, infer):
    nt, ni = reshard.models.ranks(train), reshard.models.ranks(infer)

    def fn(rank, comm):
        src = reshard.models.megatron_layout(QWEN, train, layers=2)
        dst = reshard.models.vllm_layout(QWEN, infer, first_rank=nt, layers=2)
        with reshard.Plan(comm, src, dst, staging_bytes=4 << 20) as plan, \
                reshard.SelfTest(src, rank, -1) as s, \
                reshard.SelfTest(dst, rank, -1) as d:
            # bound by the frameworks' parameter names, as a trainer's
            # and an engine's named_parameters() would give them
            bound = plan.bind({src.buffer_name(b): a for b, a in s.arrays.items()},
                              {dst.buffer_name(b): a for b, a in d.arrays.items()})
            wrong = 0
            for step in range(2):
                s.fill(step)
                plan.execute(bound, version=step + 1)
                wrong += d.check(step, "test_model_sync_inproc")
            assert plan.status().committed_version == 2
            return wrong
    assert run_ranks(nt + ni, fn) == [0] * (nt + ni)


def test_selftest_detects_a_wrong_byte():
    dst = reshard.models.vllm_layout(QWEN, "tp=2", layers=1)
    with reshard.SelfTest(dst, 0, 0) as d:
        assert d.check(0, "clean") == 0
        b = dst.buffers(0)["model.norm.weight"]
        d.arrays[b][3] ^= 1
        assert d.check(0, "expected one wrong element") == 1


TINY_QWEN3_MOE = os.path.join(ROOT, "tests", "data", "tiny-qwen3-moe.json")
TINY_DEEPSEEK = os.path.join(ROOT, "tests", "data", "tiny-deepseek-v3.json")


def test_sglang_layout_names_and_bytes():
    # SGLang 0.5.23: experts.w13_weight (no routed_experts level), EP inside
    # the TP group (runtime_context.py derive_spawn_ranks: moe_tp fastest)
    dst = reshard.models.sglang_layout(QWEN3_MOE, "tp=4,ep=2", layers=2)
    d1 = dst.buffers(1)
    assert "model.layers.0.mlp.experts.w13_weight" in d1
    assert not any("routed_experts" in n for n in d1)
    # Qwen3-30B-A3B: 128 experts, moe_intermediate 768, hidden 2048; rank 1
    # is ep rank 0, moe_tp rank 1: 64 experts x [384 gate; 384 up] x 2048
    b = d1["model.layers.0.mlp.experts.w13_weight"]
    assert dst.buffer_bytes(b, 1) == 64 * 768 * 2048 * 2
    # attention DP: qkv_proj over attn_tp = tp / attn_dp = 2 (32 heads of
    # 128, 4 KV heads: 16 + 2 + 2 heads per rank)
    dst = reshard.models.sglang_layout(QWEN3_MOE, "tp=4,ep=4,attn_dp=2", layers=1)
    b = dst.buffers(3)["model.layers.0.self_attn.qkv_proj.weight"]
    assert dst.buffer_bytes(b, 3) == (16 + 2 + 2) * 128 * 2048 * 2
    # DeepSeek MLA: SGLang's fused_qkv_a_proj_with_mqa, replicated
    dst = reshard.models.sglang_layout(TINY_DEEPSEEK, "tp=2,ep=2")
    assert "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight" in dst.buffers(1)
    m = reshard.models.Model(TINY_DEEPSEEK)
    kvb = dst.buffers(0)["model.layers.0.self_attn.kv_b_proj.weight"]
    assert "post_load_weights" in m.after_load("sglang", dst, kvb)


def test_sglang_layout_refusals():
    bad = [
        (QWEN, "tp=2,attn_dp=2", "attn_dp"),           # Qwen2: attention on the whole TP group
        (QWEN, "tp=2,dp_lm_head=1", "dp_lm_head"),     # needs attention DP
        (QWEN3_MOE, "tp=4,ep=8", "ep 8"),              # EP lies inside the TP group
        (QWEN3_MOE, "tp=2,dp=2,attn_dp=2", "dp > 1"),  # --dp-size with --attn-dp-size
        (QWEN3_MOE, "tp=2,moe_dense_tp=1", "moe_dense_tp"),
        (QWEN3_MOE, "tp=2,sp_moe=1", "sp_moe"),
        (QWEN3_MOE, "tp=2,vocab=1024", "vocab"),
    ]
    for cfg, spec, says in bad:
        with pytest.raises(reshard.InvalidArgumentError, match=says):
            reshard.models.sglang_layout(cfg, spec, layers=1)
    for fn in (reshard.models.vllm_layout, reshard.models.megatron_layout):
        with pytest.raises(reshard.InvalidArgumentError, match="SGLang"):
            fn(QWEN3_MOE, "tp=2,attn_dp=2", layers=1)


def test_parallel_binding_reads_every_key():
    """reshard.models.parallel returns the C struct through the binding's
    own declaration of rm_parallel (_ffi_build.py): every key the C parser
    accepts must read back as set. The declaration once stopped at
    dp_replicate, so .cp and the SGLang keys raised AttributeError."""
    spec = {"tp": 2, "pp": 3, "dp": 5, "ep": 7, "etp": 11, "vocab": 1013,
            "first": 13, "last": 17, "grouped_gemm": 0, "sp_moe": 1, "w31": 1,
            "dp_shard": 19, "dp_replicate": 23, "cp": 29, "attn_dp": 31,
            "dp_lm_head": 1, "moe_dense_tp": 1, "shared_fusion": 0}
    p = reshard.models.parallel(spec)
    assert {k: getattr(p, k) for k in spec} == spec
