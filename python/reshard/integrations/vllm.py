"""A vLLM weight-transfer engine ("reshard"): the trainer's Megatron shards
go straight into vLLM's fused parameters, each inference rank receiving
only the bytes it holds, in one plan for the whole model.

Written against vLLM's weight-transfer interface as of vLLM 0.33
(vllm/distributed/weight_transfer/base.py: WeightTransferEngine,
TrainerWeightTransferEngine, TrainerInitInfo; factory.py:
WeightTransferEngineFactory and WeightTransferTrainerFactory
.register_engine). Importing this module needs vLLM. Register once per
process, on both sides:

    from reshard.integrations.vllm import register
    register()       # backend name "reshard"

Worker side (vLLM): WeightTransferConfig(backend="reshard"); the engine
receives ReshardInitInfo through init_weight_transfer_engine and writes
every update in place into self.model's parameters (no load_weights;
re-processed layers below). Trainer side: every trainer rank calls

    engine = WeightTransferTrainerFactory.trainer_init(
        ReshardTrainerInitInfo(model_config_path=..., train="tp=2,pp=2",
                               infer="tp=2,dp=2", world_size=8,
                               master_address=..., master_port=..., rank=r),
        client=client, source=ModuleSource(megatron_model))
    engine.send_weights()                     # every step

Ranks: trainer ranks 0 .. T-1 (Megatron's order, reshard_models.h), then
the workers at rank_offset = T + dp_index * (tp * pp) + parallel_config.rank
(vLLM's own formula, nccl_common.py _worker_group_rank). Transports:
"nccl" (default: a PyNcclCommunicator over vLLM's StatelessProcessGroup at
master_address:master_port, as vLLM's nccl engine builds it), "mpi" (all
trainer and worker processes in one MPI job: mpi4py's COMM_WORLD), "ucx"
(host memory over UCX, rendezvous at master_address:master_port: processes
launched any way, e.g. by Ray), "ucx_cuda" (GPU memory over UCX, the same
rendezvous), or
"inproc:<key>" (threads of one process, reshard.integrations.WORLDS;
tests).

Parameters whose live format is not the checkpoint's: vLLM rewrites some
parameters after loading (reshard.models.Model.after_load lists them:
MLA's kv_b_proj, fused-MoE w13/w2, fp8 block weights). Each worker reads,
at init, the format its live modules actually use (_classify): the
fused-MoE backend vLLM chose for the layer, whether MLA's W_UK_T / W_UV
are views of kv_b_proj, fp8 kernels. Where the live format is the loaded
one (Triton MoE, Hopper's default for bf16; MLA views on CUDA's default
backends) or a relayout the layout expresses (w31=1: FlashInfer
CUTLASS's [up; gate]) reshard writes straight into the parameter. Where
it is a real transform (DeepGEMM's UE8M0 requantization, a backend's
shuffle or prepack, MLA's dequantized copies) the layer is re-processed
(_vllm_reload.Reprocess: staged in the checkpoint format, written, then
vLLM's own processing into the live tensors). What neither covers is
refused at the worker's init with reshard.UnsupportedError naming the
parameter and the way out; the trainer then fails within its plan
deadline and the sender re-raises the worker's error from the control
plane. An fp8 block checkpoint (quantization_config) is served fp8: the
plan quantizes the trainer's weights on the way.
"""
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from vllm.distributed.weight_transfer.base import (  # noqa: F401 (needs vLLM)
    TrainerInitInfo, TrainerWeightTransferEngine, WeightTransferEngine,
    WeightTransferInitInfo, WeightTransferUpdateInfo)

import reshard
from ..errors import InvalidArgumentError, UnsupportedError
from ._transport import WORLDS, comm as _comm, deadline_s, in_thread  # noqa: F401
from ._vllm_reload import Reprocess as _Reprocess
from . import _engine
from ._engine import make_plan as _plan, owner as _owner, stream as _stream, \
    strip as _strip, written as _written


def _check_world(info, ntrain, rank):
    _engine.check_world(info, ntrain, rank, "vLLM")


def _refuse(flagged, rank):
    _engine.refuse(flagged, rank, "vLLM")

@dataclass
class ReshardInitInfo(WeightTransferInitInfo):
    """What every worker needs to build the same plan as the trainer."""
    model_config_path: str
    train: str
    infer: str
    rank_offset: int
    world_size: int
    transport: str = "nccl"
    master_address: Optional[str] = None
    master_port: Optional[int] = None
    layers: int = 0
    dtype: str = "bf16"
    staging_bytes: Optional[int] = None
    timeout_ms: Optional[int] = None
    topology: Optional[str] = None


@dataclass
class ReshardUpdateInfo(WeightTransferUpdateInfo):
    """One update: the weight version (the training step, >= 1), which
    every rank passes and the plan checks."""
    version: int


def _fp8_block(path):
    """Whether the served checkpoint is fp8 with block scales: the config's
    quantization_config says quant_method "fp8" with a weight_block_size
    (DeepSeek-V3's, Kimi-K2's, Qwen3's -FP8 releases). vLLM then builds its
    linear and expert weights fp8 with weight_scale_inv
    (quantization/fp8.py, Fp8LinearMethod.create_weights)."""
    import json
    try:
        with open(path) as f:
            q = json.load(f).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return False  # the model loader reports the config's own errors
    return q.get("quant_method") == "fp8" and bool(q.get("weight_block_size"))


def _layouts(info, first_infer_rank):
    """The inference side's model and both layouts (the same on every
    rank). The trainer holds ``dtype`` weights; an fp8 block checkpoint is
    served fp8 with scales, so the plan quantizes on the way."""
    layers = info.layers or None
    tmodel = reshard.models.Model(info.model_config_path, layers=layers,
                                  dtype=info.dtype)
    imodel = reshard.models.Model(info.model_config_path, layers=layers,
                                  dtype=info.dtype,
                                  block_scales=_fp8_block(info.model_config_path))
    src = reshard.models.megatron_layout(tmodel, info.train, first_rank=0)
    dst = reshard.models.vllm_layout(imodel, info.infer,
                                     first_rank=first_infer_rank)
    return imodel, src, dst


# vLLM 0.33 fused-MoE backends whose kernel format is the loaded one
# (FlashInfer CUTLASS's is a pure relayout of it: w31=1, _moe_format):
# convert_to_unquantized_kernel_format (fused_moe/oracle/unquantized.py)
# returns w13/w2 as they were loaded (.contiguous() of a contiguous
# parameter) for these, and UnquantizedFusedMoEMethod._setup_kernel keeps
# the parameter; every other backend swaps, pads, permutes, shuffles or
# prepacks them (FLASHINFER_CUTLASS swap_w13_to_w31, FLASHINFER_TRTLLM
# align_moe_weights_for_fi + block layout, AITER shuffle_weights, CPU
# cpu_prepack_moe_weight in experts/cpu_moe.py, XPU a transpose, MOONEP
# its [E+B] layout, TPU/OOT their own).
_LOADED_FORMAT_MOE = ("TRITON", "BATCHED_TRITON")


def _moe_format(module, w31=0):
    """How w13/w2 (and their scales) of this live fused-MoE layer are
    written: "direct" (the live format is the layout's), "reprocess" (a
    real transform of the checkpoint format: received in that format, then
    vLLM's processing re-run), or why neither can work (a refusal)."""
    qm = getattr(module, "quant_method", None)
    backend = getattr(qm, "unquantized_backend", None)
    if backend is None:
        fp8 = getattr(qm, "fp8_backend", None)
        if fp8 is not None and fp8.name in _LOADED_FORMAT_MOE:
            # fp8 block experts under Triton (Hopper's choice without
            # expert parallelism: fused_moe/oracle/fp8.py
            # _get_priority_backends): convert_to_fp8_moe_kernel_format
            # leaves weights and scales as loaded (Fp8MoEMethod.
            # process_weights_after_loading rewrites nothing for block
            # scales but the e4m3fnuz conversion on MI300)
            from vllm.platforms import current_platform
            if w31:
                return ("vLLM chose the %s fp8 fused-MoE backend for this "
                        "layer, which reads w13 as loaded ([gate; up]), but "
                        "the inference spec says w31=1: drop w31=1"
                        % fp8.value)
            if not current_platform.is_fp8_fnuz():
                return "direct"
        if fp8 is not None and fp8.name == "FLASHINFER_CUTLASS" and w31 and \
                getattr(getattr(qm, "moe", None), "is_act_and_mul", True) and \
                getattr(qm, "block_quant", False):
            # Hopper's choice with expert parallelism
            # (prepare_fp8_moe_layer_for_fi, quantization/utils/
            # flashinfer_utils.py): w13 and its block scales swapped to
            # [up; gate] (the layout's w31=1), then the scales clamped to
            # >= 1e-10, which changes nothing reshard writes: its scales are
            # amax / 448 with amax >= 1e-4 (DeepSeek's per_block_cast_to_fp8)
            return "direct"
        # quantized experts (fp8 block: DeepGEMM requantizes to UE8M0,
        # FlashInfer swaps and clamps scales, ...): vLLM's
        # convert_to_fp8_moe_kernel_format re-run from the checkpoint's
        # [gate; up]
        if w31:
            return ("the inference spec says w31=1 (bf16 FlashInfer CUTLASS's "
                    "live [up; gate]), but these experts are quantized and are "
                    "re-processed from the checkpoint's [gate; up]: drop w31=1")
        return "reprocess"
    if backend.name in _LOADED_FORMAT_MOE:
        if w31:
            return ("vLLM chose the %s fused-MoE backend for this layer, which "
                    "reads w13 as loaded ([gate; up]), but the inference spec "
                    "says w31=1 ([up; gate], FlashInfer CUTLASS's): drop w31=1"
                    % backend.value)
        import os
        from vllm.platforms import current_platform
        # Triton on ROCm pads each expert's rows when VLLM_ROCM_MOE_PADDING
        # (UnquantizedFusedMoEMethod._maybe_pad_weight): not the loaded
        # layout any more
        if current_platform.is_rocm() and \
                os.environ.get("VLLM_ROCM_MOE_PADDING", "1") != "0":
            return "reprocess"
        return "direct"
    if backend.name == "FLASHINFER_CUTLASS":
        # convert_to_unquantized_kernel_format swaps each expert's halves
        # (swap_w13_to_w31) for gated activations, nothing else: a pure
        # relayout the destination layout expresses with w31=1; without
        # it, the swap is re-run
        gated = getattr(getattr(qm, "moe", None), "is_act_and_mul", True)
        if not w31:
            return "reprocess"
        if gated:
            return "direct"
        return ("vLLM chose the FlashInfer CUTLASS fused-MoE backend for a "
                "non-gated activation (w13 is one projection, not swapped), "
                "but the inference spec says w31=1: drop w31=1")
    if w31:
        return ("the inference spec says w31=1 ([up; gate], FlashInfer "
                "CUTLASS's), but vLLM chose the %s fused-MoE backend, which "
                "is re-processed from the checkpoint's [gate; up]: drop w31=1"
                % backend.value)
    # FlashInfer TRT-LLM, AITER, CPU, XPU, MoonEP, ...: their
    # convert_to_unquantized_kernel_format re-run (a backend that pads at
    # allocation, TRT-LLM's maybe_roundup_sizes, is refused by
    # Reprocess.check: its checkpoint-format parameter is not reshard's)
    return "reprocess"


def _torch_tensor():
    return sys.modules["torch"].Tensor


_DERIVED = ("W_UK_T", "W_UV", "W_UK_T_dcp_qrep", "W_K", "W_V")


def _mla_holders(model, name, module):
    """The live modules that derive tensors from this kv_b_proj
    (MLAAttention in vLLM 0.33: DeepseekV2MLAAttention, its
    MultiHeadLatentAttentionWrapper and the MLAAttention inside all hold
    it), with those tensors."""
    parent = _owner(model, name.rpartition(".")[0])
    out = []
    for m in (parent.modules() if parent is not None else ()):
        if getattr(m, "kv_b_proj", None) is not module:
            continue
        derived = [d for d in (getattr(m, a, None) for a in _DERIVED)
                   if isinstance(d, _torch_tensor())]
        if derived:
            out.append((m, derived))
    return out


def _mla_format(model, name, module):
    """kv_b_proj: "direct" when nothing is derived from it or W_UK_T and
    W_UV are views of it (MLAAttention.process_weights_after_loading's
    split_kv_b_proj on bf16/fp16 weights, replace_parameter); otherwise
    "reprocess" (fp8 kv_b_proj: DeepGEMM's processing and dequantized
    copies; DCP query replication's all-gathered W_UK_T_dcp_qrep, AITER's
    quantized W_K / W_V, CPU AMX's packed copies)."""
    import torch
    w = module.weight
    if w.dtype not in (torch.bfloat16, torch.float16, torch.float32) or \
            name.endswith("weight_scale_inv"):
        return "reprocess"
    base = w.untyped_storage().data_ptr()
    if all(d.untyped_storage().data_ptr() == base
           for _, derived in _mla_holders(model, name, module)
           for d in derived):
        return "direct"
    return "reprocess"


def _classify(model, dmodel, dst, rank, w31=0):
    """This worker's parameters by how they are written: (reprocess
    {layer: [local names]}, MLA modules to re-derive, refusals {name:
    why}); every other parameter is written directly. The live format is
    read from the live modules: the fused-MoE backend vLLM chose, whether
    MLA's derived tensors are views, the fp8 kernels' processing."""
    reprocess, rerun, refused = {}, [], {}
    for name, b in dst.buffers(rank).items():
        what = dmodel.after_load("vllm", dst, b)
        if not what:
            continue
        module = _owner(model, name)
        if module is None:
            refused[name] = ("no live module holds it, so its kernel format "
                             "cannot be read; " + what)
            continue
        if ".kv_b_proj." in name:
            how = _mla_format(model, name, module)
            if how == "reprocess":
                for m, _ in _mla_holders(model, name, module):
                    if m not in rerun:
                        rerun.append(m)
        elif ".experts." in name or name.endswith(
                ("w13_weight", "w2_weight")):
            how = _moe_format(module, w31)
        else:
            how = "reprocess"  # fp8 block linears (DeepGEMM's UE8M0)
        if how == "reprocess":
            reprocess.setdefault(module, []).append(name.rpartition(".")[2])
        elif how != "direct":
            refused[name] = how
    return reprocess, rerun, refused


def _sync_modes(model, dmodel, dst, rank, w31=0):
    """_classify, with the re-processed layers checked
    (Reprocess.check): (reprocess, rerun, refusals)."""
    reprocess, rerun, refused = _classify(model, dmodel, dst, rank, w31)
    names = {m: n for n, m in model.named_modules()} if reprocess else {}
    prefix = {m: (names[m] + "." if names[m] else "") for m in reprocess}
    written = _written(dst, rank)
    refused.update(_Reprocess.check(reprocess, written, prefix, rank))
    # the parameters written directly: the live ones must be the layout's
    # size and dtype (a checkpoint that quantizes what reshard's model
    # keeps in bf16, or the reverse, is refused here, not at the first
    # update)
    staged = {prefix[m] + n for m, local in reprocess.items() for n in local}
    refused.update(_engine.size_refusals(
        dict(model.named_parameters()), written, staged | set(refused), rank,
        "vLLM", "the checkpoint's quantization_config (weight_block_size, "
        "ignored_layers) and reshard's model disagree on whether it is fp8"))
    return reprocess, rerun, refused


def _live_refusals(model, dmodel, dst, rank, w31=0):
    """{parameter name: why} for this worker's parameters that can be
    neither written directly nor re-processed; empty when every parameter
    can be synced."""
    return _sync_modes(model, dmodel, dst, rank, w31)[2]


class ReshardWeightTransferEngine(WeightTransferEngine):
    """The worker side: parameters written in place by one plan execute."""

    init_info_cls = ReshardInitInfo
    update_info_cls = ReshardUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.plan = self.comm = None

    def init_transfer_engine(self, init_info):
        pc = self.parallel_config
        # vLLM's numbering of a worker in a trainer-to-worker group
        # (weight_transfer/nccl_common.py, _worker_group_rank)
        rank = (init_info.rank_offset + pc.data_parallel_index * pc.world_size
                + pc.rank)
        _check_world(init_info, init_info.rank_offset, rank)
        dmodel, src, dst = _layouts(init_info, init_info.rank_offset)
        w31 = reshard.models.parallel(init_info.infer).w31
        reprocess, rerun, flagged = _sync_modes(self.model, dmodel, dst,
                                                rank, w31)
        # The communicator first (its creation is collective with the
        # trainer, MPI's Comm_dup for one): a refusal then leaves the
        # trainer in plan creation, which has a deadline.
        comm = _comm(init_info.transport, rank, init_info.world_size,
                     init_info.master_address, init_info.master_port,
                     self.device)
        if flagged:
            comm.close()
            _refuse(flagged, rank)
        # (a failed creation closes comm)
        self.plan = _plan(comm, init_info, src, dst)
        self.comm = comm
        self.rank, self.names = rank, list(dst.buffers(rank))
        self.reprocess = _Reprocess(reprocess, rerun,
                                    self.vllm_config.model_config.dtype) \
            if reprocess or rerun else None

    def _bind(self):
        """This step's binding: the target model's parameters now (vLLM
        may have swapped the target, set_weight_update_target, or
        reallocated parameters, sleep/wake; re-processed layers hold their
        checkpoint-format parameters while staged)."""
        params = dict(self.model.named_parameters())
        return self.plan.bind({}, {n: params.get(n) for n in self.names})

    def start_weight_update(self):
        pass  # parameters are written in place; staging is per update

    def finish_weight_update(self):
        pass

    def receive_weights(self, update_info):
        if self.plan is None:
            raise UnsupportedError("reshard vLLM engine: receive_weights "
                                   "before init_transfer_engine")
        rp = self.reprocess
        staged = rp.stage() if rp is not None else ()
        try:
            self.plan.execute(self._bind(), version=update_info.version,
                              stream=_stream(self.comm))
        except BaseException:
            if rp is not None:
                rp.abandon(staged)  # the kernel tensors keep the old weights
            raise
        if rp is not None:
            rp.process(staged)

    def shutdown(self):
        if self.plan is not None:
            self.plan.close()
        if self.comm is not None:
            self.comm.close()
        self.plan = self.comm = None


@dataclass
class ReshardTrainerInitInfo(TrainerInitInfo):
    """The trainer ranks' init info (``rank``: this trainer rank, 0 ..
    T-1, Megatron's order); the sender (rank 0) forwards the worker part
    to the inference side."""
    backend = "reshard"
    model_config_path: str = ""
    train: str = ""
    infer: str = ""
    world_size: int = 0
    transport: str = "nccl"
    master_address: Optional[str] = None
    master_port: Optional[int] = None
    layers: int = 0
    dtype: str = "bf16"
    staging_bytes: Optional[int] = None
    timeout_ms: Optional[int] = None
    topology: Optional[str] = None
    # removed from the source's names as often as it leads them (Megatron
    # wraps its model in DDP and Float16Module: module.module.<name>)
    strip_prefix: Optional[str] = field(default="module.")


class ReshardTrainerWeightTransferEngine(TrainerWeightTransferEngine):
    """The trainer side: each send_weights() takes a fresh pass of
    source.iter_local() (this rank's Megatron parameters: the WeightSource
    contract, vllm/distributed/weight_transfer/base.py, says each call
    starts a fresh pass, and a DTensor source yields fresh tensors), binds
    it and executes the plan while the sender drives the workers'
    start/update/finish."""

    init_info_cls = ReshardTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        if source is None:
            raise InvalidArgumentError("reshard trainer engine: needs a "
                                       "WeightSource (ModuleSource(model))")
        self = cls(client=client, source=source,
                   is_sender=init_info.rank == 0, rank=init_info.rank)
        ntrain = reshard.models.ranks(init_info.train)
        _check_world(init_info, ntrain, init_info.rank)
        # the workers' info: the trainer's fields of the same names, and
        # the workers start after the trainer ranks
        worker = ReshardInitInfo(rank_offset=ntrain, **{
            f.name: getattr(init_info, f.name) for f in fields(ReshardInitInfo)
            if f.name != "rank_offset"})
        # Layouts first (a bad spec or config fails here, on every rank,
        # before any collective); a worker whose live kernels use another
        # format refuses at its init (the plan creation below then fails
        # at its deadline, and the sender re-raises the worker's error).
        _, src, dst = _layouts(worker, ntrain)
        # Communicator and plan creation are collective with the workers,
        # which start theirs when the sender's RPC reaches them.
        self.deadline = deadline_s(init_info.timeout_ms)
        join = in_thread(client.init_weight_transfer_engine, asdict(worker),
                         deadline_s=self.deadline) \
            if self.is_sender else (lambda: None)
        try:
            comm = _comm(init_info.transport, init_info.rank,
                         init_info.world_size, init_info.master_address,
                         init_info.master_port, None)
            # (a failed creation closes comm)
            self.plan = _plan(comm, worker, src, dst)
            self.comm = comm
        finally:
            join()
        self.held = list(src.buffers(init_info.rank))
        self.strip_prefix = init_info.strip_prefix
        self.version = 0
        return self

    def _bind(self):
        local = {_strip(n, self.strip_prefix): t
                 for n, t in self.source.iter_local()}
        return self.plan.bind({n: local.get(n) for n in self.held}, {})

    def send_weights(self):
        bound = self._bind()  # before any RPC: a missing tensor stops here
        self.version += 1
        if self.is_sender:
            self.client.start_weight_update()
            join = in_thread(self.client.update_weights,
                             {"version": self.version},
                             deadline_s=self.deadline)
        try:
            self.plan.execute(bound, version=self.version,
                              stream=_stream(self.comm))
        finally:
            if self.is_sender:
                join()
        if self.is_sender:
            # the version vLLM reports at /weight_info
            # (VLLMWeightSyncClient.finish_weight_update, base.py)
            self.client.finish_weight_update(weight_version=str(self.version))

    def shutdown(self):
        plan, comm = getattr(self, "plan", None), getattr(self, "comm", None)
        if plan is not None:
            plan.close()
        if comm is not None:
            comm.close()
        self.plan = self.comm = None


def register():
    """Registers backend "reshard" with vLLM's worker and trainer
    factories (lazily imported from this module); a second call is a
    no-op."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory, WeightTransferTrainerFactory)
    for factory, cls in ((WeightTransferEngineFactory,
                          "ReshardWeightTransferEngine"),
                         (WeightTransferTrainerFactory,
                          "ReshardTrainerWeightTransferEngine")):
        try:
            factory.register_engine("reshard", __name__, cls)
        except ValueError:  # "already registered"
            pass
