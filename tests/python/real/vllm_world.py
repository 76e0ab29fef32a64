"""One MPI job against the real vLLM (0.33, CPU platform): Megatron trainer
ranks and vLLM worker processes, reshard's vLLM engine between them.

    VLLM_TARGET_DEVICE=cpu mpirun -n 6 python vllm_world.py \
        --trainers 2 --port 29600 --out DIR

Ranks 0 .. T-1 are trainer ranks; ranks T .. are vLLM workers, which
also form their own torch.distributed world (gloo) as vLLM's workers do.
For every case (a model config, the inference tp x pp, the trainer's
Megatron spec), every worker:

  1. builds vLLM's own model class for the config (vLLM's
     initialize_model, bf16, random-free: every byte set to a sentinel),
     under vLLM's model-parallel groups for tp x pp (the workers beyond
     one tp x pp replica are further replicas);
  2. checks reshard's layout of its rank against the real
     named_parameters(): the same names, and each parameter's bytes;
  3. gets its engine from vLLM's real WeightTransferEngineFactory with
     backend "reshard", found through vLLM's own plugin loading
     (load_general_plugins: the vllm.general_plugins entry point of the
     installed reshard), and the trainer gets its engine from the real
     WeightTransferTrainerFactory; the trainer's sender drives the
     workers through a control-plane client over MPI messages (the part
     of a real job that is HTTP or Ray: the only stand-in here);
  4. after each of two steps (the trainer's weights change in between),
     checks every byte of every parameter: inside reshard's fragments
     against values from global coordinates (an independent
     expectation) AND against a second instance of the same vLLM model
     class loaded by vLLM's own load_weights with the same HF tensors;
     outside the fragments, the sentinel untouched.

Checks print "FAIL ..." lines; the last line is "N passed, M failed".
Every wait has a deadline (the control messages; reshard's own
timeouts). vLLM's CPU platform cannot run most of
process_weights_after_loading with the PyPI (CUDA) build here
(torch.ops._C is absent), so the bf16 models are compared in the format
vLLM's loaders write, before post-processing: exactly the format
reshard's layouts describe. The fp8 block models (*_fp8) are served the
way a Hopper GPU serves them (deepgemm_standin, gpu_fp8_backends: the
stand-ins there, each with its reason) and processed by vLLM's own code;
the engine re-processes their layers, and every byte of every parameter
is compared with a second instance that vLLM loads and processes
(check_processed). Each update prints the re-processing's cost.
"""
import argparse
import json
import os
import re
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/python: conftest helpers

SENTINEL = 0xA5
CTL_DEADLINE_S = 300

# name -> HF config: small shapes, every architecture family the engine
# serves (dense GQA, attention bias, q/k norms, MoE, MLA with and without
# q_lora_rank). Layer counts give each pp stage >= 1 layer.
CONFIGS = {
    "llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
        "vocab_size": 200, "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False},
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 200,
        "tie_word_embeddings": True, "rms_norm_eps": 1e-6},
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
        "vocab_size": 200, "tie_word_embeddings": False, "rms_norm_eps": 1e-6},
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 2, "vocab_size": 200, "num_experts": 4,
        "num_experts_per_tok": 2, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-6},
    "mixtral": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 200,
        "num_local_experts": 4, "num_experts_per_tok": 2,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-5},
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 200, "n_routed_experts": 4,
        "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 2,
        "topk_group": 1, "routed_scaling_factor": 2.5,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "q_lora_rank": 48, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-6},
}
# DeepSeek-V2-Lite-style MLA (no q_lora_rank: q_proj, not q_a/q_b)
# under DeepSeek-V3's router: reshard's front-end reads deepseek_v3
# configs only (DeepseekV2ForCausalLM is not listed)
CONFIGS["deepseek_v3_nolora"] = dict(CONFIGS["deepseek_v3"], q_lora_rank=None,
                                     n_group=1, routed_scaling_factor=1.0)
# An fp8 block checkpoint (quantization_config as DeepSeek-V3's and the
# Qwen3 -FP8 releases write it; 16 x 16 blocks fit these small shapes):
# vLLM serves its linears fp8 with weight_scale_inv, the trainer holds
# bf16, reshard quantizes on the way and vLLM's processing is re-run
CONFIGS["llama_fp8"] = dict(CONFIGS["llama"], quantization_config={
    "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
    "weight_block_size": [16, 16]})
# (each expert's 64 rows split 4 ways over tp x dp: whole 16-row blocks)
CONFIGS["deepseek_v3_fp8"] = dict(CONFIGS["deepseek_v3"],
                                  moe_intermediate_size=64,
                                  quantization_config=CONFIGS["llama_fp8"][
                                      "quantization_config"])
# Qwen3-MoE's router (GateLinear, qwen3_moe.py Qwen3MoeSparseMoeBlock)
# takes the quant config: a checkpoint that keeps it bf16 lists it in
# ignored_layers (quantization/fp8.py Fp8Config, exact names), as reshard's
# model keeps routers bf16
CONFIGS["qwen3_moe_fp8"] = dict(CONFIGS["qwen3_moe"], moe_intermediate_size=64,
                                quantization_config=dict(
                                    CONFIGS["llama_fp8"]["quantization_config"],
                                    ignored_layers=["model.layers.%d.mlp.gate" % i
                                                    for i in range(2)]))
# ... and a checkpoint that does not list them: vLLM serves the routers
# fp8 too, as reshard's model does then (src/models/tensors.c
# quant_skipped), with layer 0's attention kept bf16 through its shards'
# names and layer 1's experts through <block>.experts
CONFIGS["qwen3_moe_fp8_routers"] = dict(
    CONFIGS["qwen3_moe_fp8"], quantization_config=dict(
        CONFIGS["llama_fp8"]["quantization_config"], modules_to_not_convert=[
            "model.layers.0.self_attn.%s_proj" % p for p in "qkv"] + [
            "model.layers.1.mlp.experts"]))
for _c in CONFIGS.values():
    _c.update(torch_dtype="bfloat16", max_position_embeddings=256)

# (config, inference spec, trainer spec over 2 ranks)
CASES = [
    ("llama", "tp=1", "tp=2"), ("llama", "tp=2", "pp=2"),
    ("llama", "tp=4", "tp=2"), ("llama", "tp=2,pp=2", "tp=2"),
    ("qwen2", "tp=2", "tp=2"), ("qwen2", "tp=4", "pp=2"),
    ("qwen3", "tp=2", "tp=2"), ("qwen3", "tp=1,pp=2", "tp=2"),
    ("qwen3_moe", "tp=1", "tp=2"), ("qwen3_moe", "tp=2", "dp=2,ep=2"),
    ("qwen3_moe", "tp=4", "tp=2"), ("qwen3_moe", "tp=2,pp=2", "tp=2"),
    ("mixtral", "tp=2", "tp=2"), ("mixtral", "tp=4", "dp=2,ep=2"),
    # FlashInfer CUTLASS's live w13, [up; gate] (the workers' MoE layers
    # get that backend; their expectation is vLLM's own swap_w13_to_w31
    # of what its load_weights wrote)
    ("qwen3_moe", "tp=2,w31=1", "tp=2"), ("mixtral", "tp=1,w31=1", "dp=2,ep=2"),
    ("deepseek_v3_nolora", "tp=1", "tp=2"), ("deepseek_v3_nolora", "tp=2", "tp=2"),
    ("deepseek_v3_nolora", "tp=4", "dp=2,ep=2"),
    ("deepseek_v3", "tp=2", "tp=2"), ("deepseek_v3", "tp=4", "pp=2"),
    # re-processed: DeepGEMM's UE8M0 requantization of fp8 block linears
    ("llama_fp8", "tp=2", "tp=2"), ("llama_fp8", "tp=1,pp=2", "pp=2"),
    # ... and of fp8 experts (DeepGEMM's MoE format), fp8 MLA (kv_b_proj
    # requantized, W_UK_T / W_UV dequantized copies re-derived); Qwen3-MoE's
    # fp8 experts under Triton are written directly
    ("deepseek_v3_fp8", "tp=2", "tp=2"), ("deepseek_v3_fp8", "tp=1", "dp=2,ep=2"),
    ("qwen3_moe_fp8", "tp=2", "tp=2"), ("qwen3_moe_fp8_routers", "tp=2", "tp=2"),
    # fp8 experts under FlashInfer CUTLASS (Hopper's choice with expert
    # parallelism), w13 and its scales as [up; gate]: written directly
    ("deepseek_v3_fp8", "tp=2,w31=1", "tp=2"),
]


# the fp8 fused-MoE backend each fp8 MoE config is served with
# (gpu_fp8_backends): re-processed under DeepGEMM, written directly under
# Triton; a w31=1 case gets FlashInfer CUTLASS
FP8_MOE_BACKEND = {"deepseek_v3_fp8": "DEEPGEMM", "qwen3_moe_fp8": "TRITON",
                   "qwen3_moe_fp8_routers": "TRITON"}


def spec_of(s):
    d = dict(kv.split("=") for kv in s.split(","))
    return {k: int(v) for k, v in d.items()}


def torch_dtype(name):
    import torch
    import reshard
    return getattr(torch, reshard.dtypes.torch_name(reshard.dtypes.to_c(name)))


def esize(name):
    import reshard
    return reshard.dtypes.size(reshard.dtypes.to_c(name))


def with_dp(infer, workers):
    """The inference spec over all workers: the replicas beyond one tp x
    pp group are data-parallel."""
    sp = spec_of(infer)
    return "%s,dp=%d" % (infer, workers // (sp.get("tp", 1) * sp.get("pp", 1)))


def finite(b):
    """Element bytes made finite floats (the exponent's top bit cleared:
    a loader that converts would otherwise canonicalise NaNs); the same
    rule on both sides, so still an independent expectation."""
    b = b.copy()
    b[:, -1] &= 0xBF
    return b


def want(tensor_id, shape, box, esize, step):
    from conftest import box_linear, values
    return finite(values(tensor_id + 1000 * step, box_linear(shape, box),
                         esize)).ravel()


def positions(f, esize):
    idx = np.meshgrid(*[np.arange(hi - lo) for lo, hi in f.box], indexing="ij")
    elem = sum(i.ravel() * s for i, s in zip(idx, f.strides)) + f.offset // esize
    return (elem[:, None] * esize + np.arange(esize)).ravel()


class Ctl:
    """The control plane between the trainer's sender (rank 0) and the
    workers: pickled messages over MPI with a deadline on every receive."""

    def __init__(self, comm):
        self.comm = comm

    def send(self, dest, msg):
        self.comm.send(msg, dest=dest, tag=7)

    def recv(self, source):
        req = self.comm.irecv(source=source, tag=7)
        end = time.time() + CTL_DEADLINE_S
        while True:
            done, msg = req.test()
            if done:
                return msg
            if time.time() > end:
                raise TimeoutError("control message from rank %d not in %d s"
                                   % (source, CTL_DEADLINE_S))
            time.sleep(0.002)


class Client:
    """VLLMWeightSyncClient (vllm/distributed/weight_transfer/base.py) over
    MPI: each call reaches every worker, as vLLM's collective_rpc does;
    the workers run the engine's methods when the message arrives."""

    def __init__(self, ctl, workers):
        self.ctl, self.workers, self.calls = ctl, workers, []

    def _all(self, *msg):
        self.calls.append(msg[0])
        for w in self.workers:
            self.ctl.send(w, msg)

    def init_weight_transfer_engine(self, init_info):
        json.dumps(init_info)  # the real control planes carry JSON
        self._all("init", init_info)

    def start_weight_update(self):
        self._all("start")

    def update_weights(self, update_info):
        self._all("update", update_info)

    def finish_weight_update(self, weight_version=None):
        self._all("finish", weight_version)


def write_configs(out):
    paths = {}
    for name, cfg in CONFIGS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(cfg, fh)
        paths[name] = d
    return paths


# ------------------------------------------------------------------ trainer
def trainer(rank, T, W, ctl, paths, port):
    import torch
    import reshard
    from vllm.distributed.weight_transfer.base import WeightSource, ParamMeta
    from vllm.distributed.weight_transfer.factory import \
        WeightTransferTrainerFactory
    from vllm.plugins import load_general_plugins
    from functools import cached_property
    from reshard.integrations.vllm import ReshardTrainerInitInfo
    load_general_plugins()  # the trainer side finds the engine the same way

    class Source(WeightSource):
        """This rank's Megatron parameters under DDP's double wrapping
        (module.module.<name>), the pieces held locally."""

        def __init__(self, tensors):
            self.tensors = tensors
            self.passes = 0

        @cached_property
        def metadata(self):
            return [ParamMeta("module.module." + n, t.dtype, tuple(t.shape))
                    for n, t in self.tensors.items()]

        def iter_local(self):
            self.passes += 1
            for n, t in self.tensors.items():
                yield "module.module." + n, t

    bad = 0
    for ci, (cfg, infer, train) in enumerate(CASES):
        model = reshard.models.Model(os.path.join(paths[cfg], "config.json"))
        src = reshard.models.megatron_layout(model, train)
        bufs, tensors = {}, {}
        dtype = {src.buffer_name(f.buffer): f.dtype for f in src.fragments(rank)}
        for n, b in src.buffers(rank).items():
            nb = src.buffer_bytes(b, rank)
            bufs[n] = np.full(nb, SENTINEL, np.uint8)
            tensors[n] = torch.from_numpy(bufs[n]).view(torch_dtype(dtype[n]))

        def fill(step):
            for f in src.fragments(rank):
                es = esize(f.dtype)
                buf = bufs[src.buffer_name(f.buffer)]
                buf[positions(f, es)] = want(f.tensor, src.tensor(f.tensor).shape,
                                             f.box, es, step)
        fill(1)
        source = Source(tensors)
        info = ReshardTrainerInitInfo(
            model_config_path=os.path.join(paths[cfg], "config.json"),
            train=train, infer=with_dp(infer, W), world_size=T + W,
            transport="mpi",
            timeout_ms=60000, rank=rank)
        client = Client(ctl, list(range(T, T + W))) if rank == 0 else None
        eng = WeightTransferTrainerFactory.trainer_init(info, client=client,
                                                        source=source)
        for step in (1, 2):
            if step == 2:
                fill(2)  # the optimizer step, in place
            eng.send_weights()
        if source.passes != 2:
            bad += 1
            print("FAIL case %d: the engine read the source %d times in 2 "
                  "steps (a fresh pass each step)" % (ci, source.passes))
        if rank == 0 and client.calls != ["init"] + ["start", "update",
                                                     "finish"] * 2:
            bad += 1
            print("FAIL case %d: control calls %s" % (ci, client.calls))
        eng.shutdown()
        if rank == 0:
            for w in range(T, T + W):
                ctl.send(w, ("next",))
    return bad, 0


# ------------------------------------------------------------------ worker
def build(vc):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    with set_current_vllm_config(vc), set_default_torch_dtype(torch.bfloat16), \
            torch.device("cpu"):
        m = initialize_model(vllm_config=vc)
    for p in m.parameters():
        p.data.reshape(-1).view(torch.uint8).fill_(SENTINEL)
    return m


def gpu_moe_backend(model, w31):
    """vLLM's CPU platform can only choose the CPU fused-MoE backend (it
    prepacks w13/w2, which reshard's engine refuses: test_vllm_real.py
    checks that refusal). On Hopper, bf16 MoE gets Triton
    (fused_moe/oracle/unquantized.py _get_priority_backends), whose kernel
    format is the loaded one; FlashInfer CUTLASS (w31 cases) keeps w13 as
    [up; gate]. The one stand-in here: each MoE layer's quant method is
    given the backend a GPU's oracle picks, so the engine's live
    classification (not a flag) accepts it. Returns how that backend's
    post-load processing changes w13 (vLLM's own function), for the
    expectation."""
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import \
        UnquantizedMoeBackend
    from vllm.model_executor.layers.quantization.utils.flashinfer_utils \
        import swap_w13_to_w31
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if getattr(qm, "unquantized_backend", None) is not None:
            assert qm.unquantized_backend == UnquantizedMoeBackend.CPU
            qm.unquantized_backend = (UnquantizedMoeBackend.FLASHINFER_CUTLASS
                                      if w31 else UnquantizedMoeBackend.TRITON)
    return swap_w13_to_w31 if w31 else None


_STANDIN = []


def deepgemm_standin():
    """vLLM's CPU platform cannot build fp8 block linears here (its CPU
    kernels need the CPU build's ops). On Hopper vLLM 0.33 picks DeepGEMM
    (DeepGemmFp8BlockScaledMMKernel, kernels/linear/scaled_mm/deep_gemm.py)
    with UE8M0 scales (utils/deep_gemm.py is_deep_gemm_e8m0_used): its
    process_weights_after_loading (deepgemm_post_process_fp8_weight_block,
    quantization/utils/fp8_utils.py) requantizes every fp8 weight and its
    scales in place (requant_weight_ue8m0_inplace: torch, runs here) and
    hands the scales to DeepGEMM's layout transform
    (transform_sf_into_required_layout: DeepGEMM's CUDA code). The
    stand-ins, only because no GPU is here: that kernel chosen, its two
    capability flags set, and the layout transform the identity. The
    processing reshard's engine re-runs is vLLM's own."""
    if _STANDIN:
        return
    import vllm.model_executor.kernels.linear as kl
    import vllm.model_executor.layers.quantization.utils.fp8_utils as fu
    from vllm.model_executor.kernels.linear.scaled_mm.deep_gemm import \
        DeepGemmFp8BlockScaledMMKernel as DG
    choose = kl.choose_scaled_mm_linear_kernel

    def hopper_choice(config, possible_kernels, quantization=None, **kw):
        if quantization == "fp8_block_w8a8":
            return DG
        return choose(config, possible_kernels, quantization=quantization, **kw)
    kl.choose_scaled_mm_linear_kernel = hopper_choice
    init = DG.__init__

    def on_hopper(self, config):
        init(self, config)
        self.is_deep_gemm_supported = self.use_deep_gemm_e8m0 = True
    DG.__init__ = on_hopper
    fu.transform_sf_into_required_layout = lambda sf, **kw: sf
    # fp8 experts under DeepGEMM's MoE backend (Fp8MoeBackend.DEEPGEMM,
    # --moe-backend deep_gemm on Hopper; oracle/fp8.py
    # convert_to_fp8_moe_kernel_format: prepare_fp8_moe_layer_for_deepgemm,
    # the same UE8M0 requantization per expert)
    fu.is_deep_gemm_e8m0_used = lambda: True
    _STANDIN.append(True)


def gpu_fp8_backends(model, moe_backend):
    """The rest of the GPU's choices, set on each layer (vLLM's CPU
    platform picks no fp8 MoE backend and AMX for MLA, whose packing is a
    CPU-build op): fp8 experts get DeepGEMM's backend, their kernel object
    (GPU code) is not built; MLA gets CUDA's default path
    (split_kv_b_proj: dequantized W_UK_T / W_UV copies of an fp8
    kv_b_proj), the backend impl's own packing left out. moe_backend:
    the Fp8MoeBackend name (TRITON: Hopper's choice without expert
    parallelism, fused_moe/oracle/fp8.py _get_priority_backends, written
    directly; DEEPGEMM: --moe-backend deep_gemm, re-processed)."""
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend
    from vllm.model_executor.layers.quantization.fp8 import Fp8MoEMethod
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if isinstance(qm, Fp8MoEMethod):
            qm.fp8_backend = Fp8MoeBackend[moe_backend]
            qm._init_moe_kernel = lambda layer: None
        if type(m).__name__ == "MLAAttention":
            m.impl.process_weights_after_loading = lambda act_dtype: None
            m.is_amx_bmm_enabled = False


def process_quantized(model):
    """What vLLM's loader runs after load_weights
    (model_loader/utils.py process_weights_after_loading): each quantized
    module's quant_method.process_weights_after_loading, then each MLA
    attention's process_weights_after_loading(model dtype)."""
    import torch
    from vllm.model_executor.layers.quantization.fp8 import (Fp8LinearMethod,
                                                             Fp8MoEMethod)
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if isinstance(qm, (Fp8LinearMethod, Fp8MoEMethod)):
            qm.process_weights_after_loading(m)
    for m in model.modules():
        if type(m).__name__ == "MLAAttention":
            m.process_weights_after_loading(torch.bfloat16)


def hf_tensors(path, step):
    """The HF checkpoint's tensors with values from global coordinates:
    one per expert, as checkpoints store them (the stacked logical
    tensor's slice e)."""
    import torch
    import reshard
    stacked = {t.name: t for t in reshard.models.Model(path).tensors()}
    for t in reshard.models.Model(path, per_expert=True).tensors():
        m = re.match(r"(.*\.experts\.)(\d+)\.(.*)$", t.name)
        if m and t.name not in stacked:
            s = stacked[m.group(1) + m.group(3)]
            e = int(m.group(2))
            box = [(e, e + 1)] + [(0, n) for n in s.shape[1:]]
        else:
            s = stacked[t.name]
            box = [(0, n) for n in s.shape]
        b = want(s.id, s.shape, box, esize(s.dtype), step)
        yield t.name, torch.from_numpy(b.copy()).view(
            torch_dtype(s.dtype)).reshape(t.shape)


def hf_tensors_fp8(path, step):
    """The fp8 checkpoint of hf_tensors' values: every weight vLLM serves
    fp8 quantized in the config's blocks by the reference quantizer of
    tests/python/test_quant.py (DeepSeek's per_block_cast_to_fp8, in
    numpy), with its weight_scale_inv."""
    import torch
    import reshard
    from test_quant import reference
    q = reshard.models.Model(path, block_scales=True, per_expert=True)
    blocked = {t.name for t in q.tensors() if t.scale >= 0}
    with open(path) as fh:
        block = tuple(json.load(fh)["quantization_config"]["weight_block_size"])
    for name, t in hf_tensors(path, step):
        if name not in blocked:
            yield name, t
            continue
        codes, scales = reference(t.float().numpy(), block)
        yield name, torch.from_numpy(codes).view(torch.float8_e4m3fn)
        yield name + "_scale_inv", torch.from_numpy(scales)


def worker(rank, T, W, ctl, paths, port):
    import torch
    import reshard
    from vllm.config import (ModelConfig, ParallelConfig, VllmConfig,
                             set_current_vllm_config)
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed import (destroy_model_parallel,
                                  init_distributed_environment,
                                  initialize_model_parallel)
    from vllm.distributed.weight_transfer.factory import \
        WeightTransferEngineFactory
    from vllm.plugins import load_general_plugins

    w = rank - T
    # WeightTransferEngine.update_weights ends with
    # torch.accelerator.synchronize(): the PyPI torch is CUDA's build,
    # which raises without a driver. There is nothing to synchronize on
    # the CPU.
    torch.accelerator.synchronize = lambda *a, **k: None
    load_general_plugins()  # as vLLM's worker processes do at start
    init_distributed_environment(world_size=W, rank=w, local_rank=w,
                                 distributed_init_method="tcp://127.0.0.1:%d" % port,
                                 backend="gloo")
    passed = bad = 0

    def fail(msg):
        nonlocal bad
        bad += 1
        print("FAIL rank %d: %s" % (rank, msg))

    for ci, (cfg, infer, train) in enumerate(CASES):
        what = "case %d (%s infer %s train %s)" % (ci, cfg, infer, train)
        sp = spec_of(infer)
        tp, pp = sp.get("tp", 1), sp.get("pp", 1)
        def config():
            vc = VllmConfig(
                model_config=ModelConfig(model=paths[cfg],
                                         skip_tokenizer_init=True,
                                         dtype="bfloat16", enforce_eager=True),
                parallel_config=ParallelConfig(
                    tensor_parallel_size=tp, pipeline_parallel_size=pp,
                    data_parallel_size=W // (tp * pp),
                    data_parallel_rank=w // (tp * pp)),
                weight_transfer_config=WeightTransferConfig(backend="reshard"))
            # vLLM's numbering of this worker: data-parallel rank and
            # rank inside it (tp fastest, then pp); the workers are one
            # vLLM instance with dp = W / (tp x pp) (MoE experts are
            # split over tp x dp: FusedMoEParallelConfig.make)
            vc.parallel_config.rank = w % (tp * pp)
            assert vc.parallel_config.data_parallel_index == w // (tp * pp)
            return vc
        fp8 = "quantization_config" in CONFIGS[cfg]
        if fp8:
            deepgemm_standin()
        vc = config()
        with set_current_vllm_config(vc):
            destroy_model_parallel()
            initialize_model_parallel(tp, pp)
        # two instances, each under its own config (a config registers
        # each attention layer's name once: static_forward_context)
        model, ref = build(vc), build(config())
        w13_live = gpu_moe_backend(model, sp.get("w31", 0))
        if fp8:
            moe_fp8 = "FLASHINFER_CUTLASS" if sp.get("w31") else \
                FP8_MOE_BACKEND.get(cfg, "TRITON")
            gpu_fp8_backends(model, moe_fp8)
            gpu_fp8_backends(ref, moe_fp8)
            process_quantized(model)  # live: the kernel format
        ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
        path = os.path.join(paths[cfg], "config.json")
        dst = reshard.models.vllm_layout(path, with_dp(infer, W), first_rank=T,
                                         block_scales=fp8)
        # (2) the layout against the real named_parameters()
        params = dict(model.named_parameters())
        if fp8:
            # the attention's fp8 KV-cache scales (Fp8KVCacheMethod:
            # not in the checkpoint, vLLM defaults them; nothing to sync),
            # MLA's derived W_UK_T / W_UV (compared after each step)
            params = {n: p for n, p in params.items() if not re.search(
                r"\.attn\.(q|k|v|prob)_scale$|\.(W_UK_T|W_UV)$", n)}
        mine = dst.buffers(rank)
        dtype = {dst.buffer_name(f.buffer): f.dtype for f in dst.fragments(rank)}
        if set(mine) != set(params):
            fail("%s: names differ: reshard only %s, vLLM only %s" % (
                what, sorted(set(mine) - set(params))[:4],
                sorted(set(params) - set(mine))[:4]))
        for n in set(mine) & set(params):
            nb = params[n].numel() * params[n].element_size()
            if dst.buffer_bytes(mine[n], rank) != nb or \
                    params[n].dtype != torch_dtype(dtype[n]):
                fail("%s: %s: reshard %d bytes %s, vLLM %d bytes %s" % (
                    what, n, dst.buffer_bytes(mine[n], rank), dtype[n], nb,
                    params[n].dtype))
        # (3) the engine, from vLLM's factory
        eng = WeightTransferEngineFactory.create_engine(
            vc.weight_transfer_config, vc, torch.device("cpu"), model)
        step = 0
        while True:
            msg = ctl.recv(0)
            if msg[0] == "next":
                break
            if msg[0] == "init":
                eng.init_transfer_engine(eng.parse_init_info(msg[1]))
            elif msg[0] == "start":
                eng.start_weight_update()
            elif msg[0] == "update":
                t0 = time.perf_counter()
                eng.update_weights(msg[1])
                step = msg[1]["version"]
                rp = eng.reprocess
                if rp is not None:  # the cost of re-processing, reported
                    print("reprocess rank %d %s step %d: %d layers, %d bytes "
                          "staged, stage + process %.1f ms of %.1f ms" % (
                              rank, what, step, len(rp.layers),
                              rp.staged_bytes, rp.last_s * 1e3,
                              (time.perf_counter() - t0) * 1e3))
            elif msg[0] == "finish":
                eng.finish_weight_update()
                bad_before = bad
                if fp8:
                    check_processed(step, model, ref, path, what, fail)
                    moved = [n for n, p in model.named_parameters()
                             if p.data_ptr() != ptrs.get(n)]
                    if moved:  # captured CUDA graphs would read stale memory
                        fail("%s step %d: %d parameters moved: %s" % (
                            what, step, len(moved), moved[:3]))
                else:
                    check(step, dst, rank, model, ref, path, what, fail,
                          w13_live)
                passed += bad == bad_before
        eng.shutdown()
        with set_current_vllm_config(vc):
            destroy_model_parallel()
    return bad, passed


def check(step, dst, rank, model, ref, path, what, fail, w13_live=None,
          engine="vLLM"):
    """Every byte of every parameter: fragments against the global
    coordinates' values and against the engine's own load_weights (of
    ``ref``, the same model class: vLLM's, or SGLang's in
    sglang_world.py); the rest untouched."""
    import torch
    ref.load_weights(hf_tensors(path, step))
    got = {n: p.data.view(torch.uint8).reshape(-1).numpy()
           for n, p in model.named_parameters()}
    exp = {n: (w13_live(p.data) if w13_live and n.endswith(".w13_weight")
               else p.data).contiguous().view(torch.uint8).reshape(-1).numpy()
           for n, p in ref.named_parameters()}
    inside = {n: np.zeros(a.size, bool) for n, a in got.items()}
    for f in dst.fragments(rank):
        n = dst.buffer_name(f.buffer)
        if n not in got:
            continue  # reported by the name check
        es = esize(f.dtype)
        pos = positions(f, es)
        w = want(f.tensor, dst.tensor(f.tensor).shape, f.box, es, step)
        k = int(np.count_nonzero(got[n][pos] != w))
        if k:
            fail("%s step %d: %s: %d bytes differ from the global "
                 "coordinates' values" % (what, step, n, k))
        k = int(np.count_nonzero(got[n][pos] != exp[n][pos]))
        if k:
            fail("%s step %d: %s: %d bytes differ from %s's load_weights"
                 % (what, step, n, k, engine))
        inside[n][pos] = True
    for n, a in got.items():
        k = int(np.count_nonzero(a[~inside[n]] != SENTINEL))
        if k:
            fail("%s step %d: %s: %d bytes outside the fragments changed"
                 % (what, step, n, k))
        # what vLLM's loader writes that reshard does not (padding it
        # zeroes) must be outside the fragments only: covered above; and
        # every byte vLLM loads must be inside one
        k = int(np.count_nonzero((exp[n] != SENTINEL) & ~inside[n]
                                 & (exp[n] != 0)))
        if k:
            fail("%s step %d: %s: %d bytes %s loads lie outside reshard's "
                 "fragments" % (what, step, n, k, engine))


def check_processed(step, model, ref, path, what, fail):
    """A re-processed model: every byte of every parameter against a
    second instance that vLLM loads (load_weights of the fp8 checkpoint
    of the same values, quantized by the reference quantizer) and
    processes (process_quantized); the processing must change bytes, or
    this check could not see a missing re-process."""
    import torch
    ref.load_weights(hf_tensors_fp8(path, step))
    loaded = {n: p.data.clone() for n, p in ref.named_parameters()}
    process_quantized(ref)
    changed = 0
    for n, p in ref.named_parameters():
        if n not in loaded:
            continue  # created by the processing (MLA's W_UK_T / W_UV)
        changed += int(torch.count_nonzero(
            loaded[n].reshape(-1).view(torch.uint8)
            != p.data.reshape(-1).view(torch.uint8)))
    if not changed:
        fail("%s step %d: vLLM's processing changed no byte" % (what, step))
    got = dict(model.named_parameters())
    missing = sorted(set(dict(ref.named_parameters())) - set(got))
    if missing:
        fail("%s step %d: the synced model lacks %s" % (what, step, missing[:3]))
    for n, p in ref.named_parameters():
        if n not in got:
            continue
        a = got[n].data.reshape(-1).view(torch.uint8)
        b = p.data.reshape(-1).view(torch.uint8)
        # vLLM's loader zeroes the padded vocabulary rows, which reshard
        # leaves alone (the sentinel): the one allowed difference
        pad = (b == 0) & (a == SENTINEL) & (n.endswith(
            ("embed_tokens.weight", "lm_head.weight")))
        k = int(torch.count_nonzero((a != b) & ~pad))
        if k:
            fail("%s step %d: %s: %d bytes differ from vLLM's load_weights "
                 "and processing" % (what, step, n, k))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="")
    a = ap.parse_args()
    if a.cases:
        keep = [int(i) for i in a.cases.split(",")]
        CASES[:] = [CASES[i] for i in keep]
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    T, W = a.trainers, comm.Get_size() - a.trainers
    if W < 4 or W % 4:
        sys.exit("vllm_world.py: the cases need a multiple of 4 workers "
                 "(tp=4 and tp=2,pp=2); got %d" % W)
    ctl = Ctl(comm.Dup())
    paths = write_configs(os.path.join(a.out, "r%d" % rank))
    t0 = time.time()
    try:
        fn = trainer if rank < T else worker
        bad, passed = fn(rank, T, W, ctl, paths, a.port)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        comm.Abort(3)
    tot = comm.allreduce(np.array([passed, bad]), op=MPI.SUM)
    if rank == 0:
        print("%d passed, %d failed" % (tot[0], tot[1]))
        print("# %.0f s" % (time.time() - t0))
    sys.stdout.flush()
    sys.exit(1 if tot[1] else 0)


if __name__ == "__main__":
    main()
