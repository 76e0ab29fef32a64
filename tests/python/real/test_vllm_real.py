"""reshard's vLLM engine against the real vLLM 0.33 (PyPI's wheel, on the
CPU platform: VLLM_TARGET_DEVICE=cpu). Nothing of vLLM is stood in for
here except where named: vLLM's own model classes, factories, plugin
loading and fused-MoE oracle. Run by scripts/test_real.sh, which builds
the environment; skipped where vLLM is not installed (the default test
environment, scripts/test_python.sh, has no vLLM: 9.5 GB)."""
import os
import subprocess
import sys
import types

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import pytest  # noqa: E402

pytest.importorskip("vllm", reason="the real vLLM: bash scripts/test_real.sh")
torch = pytest.importorskip("torch")

import reshard  # noqa: E402
from reshard.integrations import vllm as rvllm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_world  # noqa: E402  (model configs and builder, shared)

from vllm.model_executor.layers.fused_moe.oracle import unquantized  # noqa: E402
from vllm.model_executor.layers.fused_moe.oracle.unquantized import \
    UnquantizedMoeBackend  # noqa: E402

WORLD_DEADLINE_S = 1500


def test_plugin_found_by_vllm_in_a_fresh_process():
    """A worker process of a real vLLM runs load_general_plugins() at start
    (vllm/plugins/__init__.py); the installed reshard's vllm.general_plugins
    entry point must register backend "reshard" there, with no code in the
    user's driver."""
    code = (
        "from vllm.distributed.weight_transfer.factory import "
        "WeightTransferEngineFactory as W, WeightTransferTrainerFactory as T\n"
        "assert 'reshard' not in W._registry\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "print(sorted(W._registry), sorted(T._registry))\n"
        "assert W._registry['reshard']().__name__ == 'ReshardWeightTransferEngine'\n"
        "assert T._registry['reshard']().__name__ == "
        "'ReshardTrainerWeightTransferEngine'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


def test_every_unquantized_moe_backend_is_classified():
    """Every fused-MoE backend of vLLM 0.33 is written directly (its kernel
    format is the loaded one, or FlashInfer CUTLASS's [up; gate] under
    w31=1) or re-processed (received as loaded, vLLM's processing re-run);
    w31=1 against any backend but FlashInfer CUTLASS is refused with the
    way out. A vLLM that adds a backend fails here until it is
    classified."""
    assert {b.name for b in UnquantizedMoeBackend} == {
        "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "AITER", "TRITON",
        "BATCHED_TRITON", "MOONEP", "CPU", "XPU", "TPU", "OOT"}
    for b in UnquantizedMoeBackend:
        m = types.SimpleNamespace(
            quant_method=types.SimpleNamespace(unquantized_backend=b))
        how, how31 = rvllm._moe_format(m), rvllm._moe_format(m, w31=1)
        if b.name in ("TRITON", "BATCHED_TRITON"):
            assert how == "direct", b
            assert "drop w31=1" in how31, b  # the spec contradicts the kernels
        elif b.name == "FLASHINFER_CUTLASS":
            assert how31 == "direct", b  # [up; gate]: the layout's w31=1
            assert how == "reprocess", b  # swap_w13_to_w31 re-run
        else:
            assert how == "reprocess", b
            assert b.value in how31 and "drop w31=1" in how31, b
    # fp8 experts: written directly under Triton (Hopper's choice without
    # EP: as loaded) and under FlashInfer CUTLASS with w31=1 (with EP),
    # re-processed from the checkpoint's [gate; up] otherwise
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend
    for b in Fp8MoeBackend:
        q = types.SimpleNamespace(quant_method=types.SimpleNamespace(
            fp8_backend=b))
        how = rvllm._moe_format(q)
        assert how == ("direct" if b.name in ("TRITON", "BATCHED_TRITON")
                       else "reprocess"), b
        assert "drop w31=1" in rvllm._moe_format(q, w31=1), b
        # block scales, gated: FlashInfer CUTLASS's [up; gate] is w31=1
        q.quant_method.block_quant = True
        if b.name == "FLASHINFER_CUTLASS":
            assert rvllm._moe_format(q, w31=1) == "direct", b
        else:
            assert "drop w31=1" in rvllm._moe_format(q, w31=1), b


class _Platform:
    """current_platform as a CUDA device of one capability family (the
    only stand-in: there is no GPU here)."""

    def __init__(self, family):
        self.family = family

    def is_rocm(self):
        return False

    def is_cuda(self):
        return True

    def is_device_capability_family(self, family):
        return family == self.family


@pytest.mark.parametrize("family,first", [(90, "TRITON"),
                                          (100, "FLASHINFER_TRTLLM")])
def test_vllm_oracle_default_backend(monkeypatch, family, first):
    """The premise of writing w13/w2 directly on Hopper: vLLM's own
    _get_priority_backends (fused_moe/oracle/unquantized.py) puts Triton
    first for bf16 on SM90; on Blackwell it puts FlashInfer TRT-LLM first,
    whose allocation-time padding (maybe_roundup_sizes) makes its
    checkpoint-format w13/w2 larger than reshard's, which
    Reprocess.check refuses (test_reprocess_check_refusals)."""
    monkeypatch.setattr(unquantized, "current_platform", _Platform(family))
    cfg = types.SimpleNamespace(
        moe_parallel_config=types.SimpleNamespace(dp_size=1),
        activation=unquantized.MoEActivation.SILU)
    assert unquantized._get_priority_backends(cfg)[0].name == first


# ------------------------------------------- real models in this process
@pytest.fixture(scope="module")
def vllm_dist(tmp_path_factory):
    from vllm.distributed import (cleanup_dist_env_and_memory,
                                  init_distributed_environment)
    port = 29700 + os.getpid() % 200
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method="tcp://127.0.0.1:%d" % port,
                                 backend="gloo")
    yield vllm_world.write_configs(str(tmp_path_factory.mktemp("cfg")))
    cleanup_dist_env_and_memory()


def _real_model(path):
    from vllm.config import (ModelConfig, ParallelConfig, VllmConfig,
                             set_current_vllm_config)
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed import (destroy_model_parallel,
                                  initialize_model_parallel)
    vc = VllmConfig(
        model_config=ModelConfig(model=path, skip_tokenizer_init=True,
                                 dtype="bfloat16", enforce_eager=True),
        parallel_config=ParallelConfig(),
        weight_transfer_config=WeightTransferConfig(backend="reshard"))
    with set_current_vllm_config(vc):
        destroy_model_parallel()
        initialize_model_parallel(1, 1)
    return vc, vllm_world.build(vc)


def _engine(vc, model):
    from vllm.distributed.weight_transfer.factory import \
        WeightTransferEngineFactory
    rvllm.register()
    return WeightTransferEngineFactory.create_engine(
        vc.weight_transfer_config, vc, torch.device("cpu"), model)


def test_cpu_moe_backend_reprocessed(vllm_dist):
    """vLLM's CPU platform prepacks w13/w2 (UnquantizedMoeBackend.CPU): a
    real transform, so the worker receives them as loaded and re-runs
    vLLM's processing for the MoE layers only; nothing is refused. (The
    prepack itself is a CPU-build op this CUDA wheel lacks, so the sync
    is run by vllm_world.py with fp8 block linears instead.)"""
    path = vllm_dist["qwen3_moe"]
    vc, model = _real_model(path)
    moe = [m for m in model.modules() if hasattr(
        getattr(m, "quant_method", None), "unquantized_backend")]
    assert {m.quant_method.unquantized_backend for m in moe} == {
        UnquantizedMoeBackend.CPU}  # vLLM's own choice here
    dmodel, _, dst = rvllm._layouts(types.SimpleNamespace(
        model_config_path=os.path.join(path, "config.json"), layers=0,
        dtype="bf16", train="tp=1", infer="tp=1"), 1)
    reprocess, rerun, refused = rvllm._sync_modes(model, dmodel, dst, 1)
    assert refused == {} and rerun == []
    assert set(reprocess) == set(moe)
    assert all(sorted(v) == ["w13_weight", "w2_weight"]
               for v in reprocess.values())


def test_reprocess_check_refusals(vllm_dist):
    """What cannot be re-processed is refused, naming the tensor, the rank
    and what differs: a loadable tensor of the layer reshard does not
    write, a checkpoint-format size that is not reshard's (FlashInfer
    TRT-LLM pads experts at allocation), a layer vLLM recorded no
    checkpoint format for."""
    from vllm.model_executor.model_loader.reload.layerwise import \
        LAYERWISE_INFO
    path = vllm_dist["qwen3_moe"]
    vc, model = _real_model(path)
    dmodel, _, dst = rvllm._layouts(types.SimpleNamespace(
        model_config_path=os.path.join(path, "config.json"), layers=0,
        dtype="bf16", train="tp=1", infer="tp=1"), 1)
    reprocess, _, _ = rvllm._classify(model, dmodel, dst, 1)
    prefix = {m: n + "." for n, m in model.named_modules() if m in reprocess}
    layer = next(iter(reprocess))
    written = rvllm._written(dst, 1)
    p = prefix[layer]
    assert rvllm._Reprocess.check(reprocess, written, prefix, 1) == {}
    short = dict(written)
    del short[p + "w2_weight"]
    why = rvllm._Reprocess.check({layer: ["w13_weight"]}, short, prefix, 1)
    assert list(why) == [p + "w2_weight"] and "rank 1" in why[p + "w2_weight"]
    padded = dict(written)
    nb, dt = padded[p + "w13_weight"]
    padded[p + "w13_weight"] = (nb - 2, dt)
    why = rvllm._Reprocess.check(reprocess, padded, prefix, 1)
    assert list(why) == [p + "w13_weight"]
    assert "bytes" in why[p + "w13_weight"] and "rank 1" in why[p + "w13_weight"]
    info = LAYERWISE_INFO.pop(layer)
    try:
        why = rvllm._Reprocess.check({layer: ["w13_weight"]}, written, prefix, 1)
        assert "record_metadata_for_reloading" in why[p + "w13_weight"]
    finally:
        LAYERWISE_INFO[layer] = info


def test_mla_views_written_directly_copies_reprocessed(vllm_dist):
    """MLA: after vLLM's processing, W_UK_T and W_UV are views of
    kv_b_proj.weight for bf16 (MLAAttention.process_weights_after_loading,
    layers/attention/mla_attention.py): writing kv_b_proj in place updates
    them, so it is written directly; derived copies (a dequantized or
    repacked kernel) would go stale, so that kv_b_proj's layer is
    re-processed and its MLAAttention re-derives them. The derived
    tensors are set here as processing leaves them (processing itself
    needs vLLM's CUDA ops)."""
    path = vllm_dist["deepseek_v3"]
    vc, model = _real_model(path)
    dmodel, _, dst = rvllm._layouts(types.SimpleNamespace(
        model_config_path=os.path.join(path, "config.json"), layers=0,
        dtype="bf16", train="tp=1", infer="tp=1"), 1)

    def mla():
        reprocess, rerun, refused = rvllm._sync_modes(model, dmodel, dst, 1)
        assert refused == {}
        return [m for m in reprocess if not hasattr(
            getattr(m, "quant_method", None), "unquantized_backend")], rerun
    assert mla() == ([], [])  # unprocessed: nothing derived yet
    attns = [m for m in model.modules() if hasattr(m, "kv_b_proj")
             and type(m).__name__ == "MLAAttention"]
    assert attns, "no MLAAttention in vLLM's DeepSeek-V3"
    for a in attns:
        w = a.kv_b_proj.weight
        a.W_UV, a.W_UK_T = w[: w.shape[0] // 2], w[w.shape[0] // 2:].t()
    assert mla() == ([], [])
    attns[0].W_UV = attns[0].W_UV.clone()
    assert mla() == ([attns[0].kv_b_proj], [attns[0]])


# quantization_config lists of the modules an fp8 block checkpoint keeps
# bf16, each spelt as checkpoints spell them: vLLM's Fp8Config reads
# ignored_layers, else modules_to_not_convert (quantization/fp8.py
# from_config), and quant_utils.py is_layer_skipped matches the layer vLLM
# builds (a fused layer by its name or all its shards' names, routed
# experts as <block>.experts)
IGNORED = [
    ("qwen3_moe_fp8", None),  # routers too: GateLinear takes the config
    ("qwen3_moe_fp8", {"ignored_layers": ["model.layers.%d.mlp.gate" % i
                                          for i in range(2)]}),
    ("qwen3_moe_fp8", {"modules_to_not_convert": [
        "lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.experts",
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj", "model.layers.1.mlp.experts.0.up_proj"]}),
    ("llama_fp8", {"ignored_layers": [
        "model.layers.1.self_attn.qkv_proj", "model.layers.0.mlp.gate_proj",
        "model.layers.0.mlp.up_proj", "model.layers.1.mlp.down_proj",
        "model.layers.0.self_attn.o"]}),
    ("deepseek_v3_fp8", {"ignored_layers": [], "modules_to_not_convert": [
        "model.layers.0.self_attn.q_a_proj",
        "model.layers.0.self_attn.kv_a_proj_with_mqa",
        "model.layers.1.self_attn.fused_qkv_a_proj",
        "model.layers.1.mlp.shared_experts.gate_up_proj",
        "model.layers.1.mlp.experts", "model.layers.0.self_attn.kv_b_proj"]}),
]


def _fp8_config(tmp_path, family, lists):
    """A directory with the family's fp8 config, its quantization_config's
    unquantized-module lists replaced by `lists` (None: none)."""
    import json
    cfg = dict(vllm_world.CONFIGS[family])
    q = {k: v for k, v in cfg["quantization_config"].items()
         if k not in ("ignored_layers", "modules_to_not_convert")}
    q.update(lists or {})
    d = tmp_path / ("%s_%d" % (family, len(list(tmp_path.iterdir()))))
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    return d


@pytest.mark.parametrize("family,lists", IGNORED)
def test_fp8_unquantized_modules_match_vllm(vllm_dist, tmp_path, family,
                                            lists):
    """Which weights an fp8 block checkpoint keeps bf16: reshard's layout
    gives every parameter of vLLM's own model (built from the same config,
    before processing) its dtype and size, fp8 weights with their
    weight_scale_inv and the others without; the worker then refuses
    nothing at init."""
    vllm_world.deepgemm_standin()  # fp8 block linears on this CPU
    d = _fp8_config(tmp_path, family, lists)
    vc, model = _real_model(str(d))
    dmodel, _, dst = rvllm._layouts(types.SimpleNamespace(
        model_config_path=str(d / "config.json"), layers=0, dtype="bf16",
        train="tp=1", infer="tp=1"), 1)
    written = rvllm._written(dst, 1)
    live = {n: p for n, p in model.named_parameters()
            if n in written or n.endswith("_scale_inv")}
    assert sorted(live) == sorted(written)
    kept = 0
    for n, p in live.items():
        nb, dt = written[n]
        assert (p.numel() * p.element_size(), p.dtype) == (nb, dt), n
        kept += p.dtype == torch.bfloat16 and p.dim() >= 2 and (
            n.replace("weight", "weight_scale_inv") not in live)
    assert kept > 0  # embedding at least
    fp8 = sum(p.dtype == torch.float8_e4m3fn for p in live.values())
    assert fp8 > 0
    _, _, refused = rvllm._sync_modes(model, dmodel, dst, 1)
    assert refused == {}, refused


def test_quantization_disagreement_refused_at_init(vllm_dist, tmp_path):
    """Where reshard's model and vLLM disagree on what is fp8 (here a
    layout made from a config whose ignored_layers differ from the one
    vLLM was built from), the worker refuses at init, naming the
    parameter, the rank and both formats, not at the first update."""
    vllm_world.deepgemm_standin()
    served = _fp8_config(tmp_path, "qwen3_moe_fp8", None)
    other = _fp8_config(tmp_path, "qwen3_moe_fp8", IGNORED[1][1])
    vc, model = _real_model(str(served))
    dmodel, _, dst = rvllm._layouts(types.SimpleNamespace(
        model_config_path=str(other / "config.json"), layers=0,
        dtype="bf16", train="tp=1", infer="tp=1"), 1)
    _, _, refused = rvllm._sync_modes(model, dmodel, dst, 1)
    gates = sorted(n for n in refused if n.endswith("mlp.gate.weight"))
    assert gates == ["model.layers.%d.mlp.gate.weight" % i
                     for i in range(2)], refused
    why = refused[gates[0]]
    assert "float8_e4m3fn" in why and "bfloat16" in why and "rank 1" in why


def test_world_size_must_cover_every_replica(tmp_path):
    """A world that leaves workers outside the inference layout (dp left
    out of infer) would leave them serving stale weights: refused on
    every rank before any collective."""
    cfg = vllm_world.write_configs(str(tmp_path))["llama"]
    info = rvllm.ReshardTrainerInitInfo(
        model_config_path=os.path.join(cfg, "config.json"), train="tp=2",
        infer="tp=1", world_size=6, transport="inproc:none", rank=0)
    from vllm.distributed.weight_transfer.factory import \
        WeightTransferTrainerFactory

    class Client:
        calls = []

        def __getattr__(self, name):
            self.calls.append(name)
            return lambda *a, **k: None
    rvllm.register()
    with pytest.raises(reshard.InvalidArgumentError,
                       match=r"world_size 6 .* 2 trainer ranks .* 1 inference"):
        WeightTransferTrainerFactory.trainer_init(
            info, client=Client(), source=types.SimpleNamespace())
    assert Client.calls == []


def test_real_vllm_world():
    """The MPI job of vllm_world.py: 2 Megatron trainer ranks, 4 vLLM
    worker processes, every panel architecture at tp 1/2/4 and pp 2, two
    steps, every byte checked (see its docstring)."""
    import shutil
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    out = os.environ.get("RESHARD_REAL_OUT", "/tmp/reshard-vllm-world")
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", OMP_NUM_THREADS="1")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "6",
           sys.executable, os.path.join(HERE, "vllm_world.py"),
           "--trainers", "2", "--out", out,
           "--port", str(29500 + os.getpid() % 100)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                           timeout=WORLD_DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail("vllm_world.py ran past %d s: %s" % (
            WORLD_DEADLINE_S, (e.stdout or b"")[-3000:]))
    lines = [ln for ln in r.stdout.splitlines()
             if ln.startswith(("FAIL", "#")) or " passed, " in ln]
    print("\n".join(lines[-60:]))
    assert r.returncode == 0, "\n".join(lines[-60:]) + r.stderr[-3000:]
    assert any(ln.endswith(" passed, 0 failed") for ln in lines)
