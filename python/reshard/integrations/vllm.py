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
every update in place into self.model's parameters (no load_weights, no
layerwise reload). Trainer side: every trainer rank calls

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
trainer and worker processes in one MPI job: mpi4py's COMM_WORLD), or
"inproc:<key>" (threads of one process, reshard.integrations.WORLDS;
tests).

Parameters whose live format is not the checkpoint's: vLLM rewrites some
parameters after loading (reshard.models.Model.after_load lists them:
MLA's kv_b_proj, fused-MoE w13/w2, fp8 block weights). Each worker reads,
at init, the format its live modules actually use (_live_refusals): the
fused-MoE backend vLLM chose for the layer, whether MLA's W_UK_T / W_UV
are views of kv_b_proj. Where the live format is the loaded one (Triton
MoE, Hopper's default for bf16; MLA on CUDA's default backends) reshard
writes straight into the parameter. Anything else is refused at the
worker's init with reshard.UnsupportedError naming the parameter, the
backend and the way out, instead of serving wrong weights; the trainer
then fails within its plan deadline and the sender re-raises the worker's
error from the control plane.
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


def _check_world(info, ntrain, rank):
    """The world must be the trainer ranks then every worker of the
    inference layout: a worker beyond the layout (a dp left out of
    ``infer``) would receive nothing and serve stale weights."""
    ninfer = reshard.models.ranks(info.infer)
    if info.world_size != ntrain + ninfer:
        raise InvalidArgumentError(
            "reshard vLLM engine, rank %d: world_size %d is not the %d "
            "trainer ranks (train '%s') plus the %d inference ranks (infer "
            "'%s'); give every replica in infer (dp=...)" % (
                rank, info.world_size, ntrain, info.train, ninfer, info.infer))


def _layouts(info, first_infer_rank):
    """The model and both layouts (the same on every rank)."""
    model = reshard.models.Model(info.model_config_path,
                                 layers=info.layers or None, dtype=info.dtype)
    src = reshard.models.megatron_layout(model, info.train, first_rank=0)
    dst = reshard.models.vllm_layout(model, info.infer,
                                     first_rank=first_infer_rank)
    return model, src, dst


# vLLM 0.33 fused-MoE backends whose kernel format is the loaded one
# (FlashInfer CUTLASS's is a pure relayout of it: w31=1, _moe_refusal):
# convert_to_unquantized_kernel_format (fused_moe/oracle/unquantized.py)
# returns w13/w2 as they were loaded (.contiguous() of a contiguous
# parameter) for these, and UnquantizedFusedMoEMethod._setup_kernel keeps
# the parameter; every other backend swaps, pads, permutes, shuffles or
# prepacks them (FLASHINFER_CUTLASS swap_w13_to_w31, FLASHINFER_TRTLLM
# align_moe_weights_for_fi + block layout, AITER shuffle_weights, CPU
# cpu_prepack_moe_weight in experts/cpu_moe.py, XPU a transpose, MOONEP
# its [E+B] layout, TPU/OOT their own).
_LOADED_FORMAT_MOE = ("TRITON", "BATCHED_TRITON")


def _owner(model, name):
    """The live module holding parameter ``name``, or None."""
    path = name.rpartition(".")[0]
    try:
        return model.get_submodule(path)
    except (AttributeError, TypeError):
        return None


def _moe_refusal(module, what, w31=0):
    """Why w13/w2 of this live fused-MoE layer cannot be written as the
    layout says (w31: the inference spec's w13 order), or None."""
    qm = getattr(module, "quant_method", None)
    backend = getattr(qm, "unquantized_backend", None)
    if backend is None:
        # quantized experts (fp8 block: DeepGEMM requantizes to UE8M0,
        # FlashInfer swaps, ...): the static description says what
        return what
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
        if not (current_platform.is_rocm() and
                os.environ.get("VLLM_ROCM_MOE_PADDING", "1") != "0"):
            return None
    elif backend.name == "FLASHINFER_CUTLASS":
        # convert_to_unquantized_kernel_format swaps each expert's halves
        # (swap_w13_to_w31) for gated activations, nothing else: a pure
        # relayout the destination layout expresses with w31=1
        gated = getattr(getattr(qm, "moe", None), "is_act_and_mul", True)
        if w31 and gated:
            return None
        if not gated:
            return ("vLLM chose the FlashInfer CUTLASS fused-MoE backend for a "
                    "non-gated activation (w13 is one projection, not swapped): "
                    "not modelled; serve with --moe-backend triton")
        return ("vLLM chose the FlashInfer CUTLASS fused-MoE backend for this "
                "layer, which keeps w13 as [up; gate] (swap_w13_to_w31): add "
                "w31=1 to the inference spec (infer=...), or serve with "
                "--moe-backend triton")
    return ("vLLM chose the %s fused-MoE backend for this layer, which "
            "rewrites w13/w2 after loading (fused_moe/oracle/unquantized.py "
            "convert_to_unquantized_kernel_format): reshard writes the loaded "
            "layout ([gate; up]); serve this model with --moe-backend triton "
            "(the default for bf16 on Hopper)" % backend.value)


def _torch_tensor():
    return sys.modules["torch"].Tensor


def _mla_refusal(model, name, module, what):
    """kv_b_proj: fine when nothing derived from it or W_UK_T and W_UV are
    views of it (MLAAttention.process_weights_after_loading's
    split_kv_b_proj on bf16/fp16 weights)."""
    # Every module that holds this kv_b_proj (DeepseekV2MLAAttention, its
    # MultiHeadLatentAttentionWrapper and the MLAAttention inside, in
    # vLLM 0.33): the derived tensors live on MLAAttention.
    parent = _owner(model, name.rpartition(".")[0])
    holders = [m for m in (parent.modules() if parent is not None else ())
               if getattr(m, "kv_b_proj", None) is module]
    # W_UK_T / W_UV: views for bf16 (split_kv_b_proj, replace_parameter);
    # W_UK_T_dcp_qrep (DCP query replication: an all-gathered copy), W_K /
    # W_V (AITER's fp8/fp4 BMM: quantized copies) go stale: refused
    derived = [d for m in holders
               for d in (getattr(m, a, None) for a in (
                   "W_UK_T", "W_UV", "W_UK_T_dcp_qrep", "W_K", "W_V"))
               if isinstance(d, _torch_tensor())]
    if not derived:
        return None  # nothing derived (yet): the kernels read kv_b_proj
    base = module.weight.untyped_storage().data_ptr()
    if all(d.untyped_storage().data_ptr() == base for d in derived):
        return None
    return what


def _live_refusals(model, dmodel, dst, rank, w31=0):
    """{parameter name: why} for this worker's parameters whose live
    kernel format is not what reshard writes (the loaded format), read
    from the live modules; empty when every parameter can be written in
    place."""
    out = {}
    for name, b in dst.buffers(rank).items():
        what = dmodel.after_load("vllm", dst, b)
        if not what:
            continue
        module = _owner(model, name)
        if module is None:
            out[name] = ("no live module holds it, so its kernel format "
                         "cannot be read; " + what)
        elif name.endswith(("w13_weight", "w2_weight")):
            why = _moe_refusal(module, what, w31)
            if why:
                out[name] = why
        elif ".kv_b_proj." in name:
            why = _mla_refusal(model, name, module, what)
            if why:
                out[name] = why
        else:
            out[name] = what
    return out


def _refuse(flagged, rank):
    names = sorted(flagged)
    raise UnsupportedError(
        "reshard vLLM engine, rank %d: %d parameters are served in a format "
        "other than the one reshard writes: %s: %s%s" % (
            rank, len(names), names[0], flagged[names[0]],
            "; also " + ", ".join(names[1:4]) +
            (", ..." if len(names) > 4 else "") if len(names) > 1 else ""))


def _strip(name, prefix):
    """name without any number of leading ``prefix`` (Megatron's DDP and
    Float16Module wrappers each add one "module.")."""
    while prefix and name.startswith(prefix):
        name = name[len(prefix):]
    return name


def _plan(comm, info, src, dst):
    return reshard.Plan(comm, src, dst, staging_bytes=info.staging_bytes,
                        timeout_ms=info.timeout_ms, topology=info.topology)


def _stream(comm):
    if not comm.device:
        return None
    torch = sys.modules.get("torch")
    return torch.cuda.current_stream() if torch is not None else None


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
        flagged = _live_refusals(self.model, dmodel, dst, rank,
                                 reshard.models.parallel(init_info.infer).w31)
        # The communicator first (its creation is collective with the
        # trainer, MPI's Comm_dup for one): a refusal then leaves the
        # trainer in plan creation, which has a deadline.
        comm = _comm(init_info.transport, rank, init_info.world_size,
                     init_info.master_address, init_info.master_port,
                     self.device)
        if flagged:
            comm.close()
            _refuse(flagged, rank)
        self.comm = comm
        self.plan = _plan(self.comm, init_info, src, dst)
        self.rank, self.names = rank, list(dst.buffers(rank))

    def _bind(self):
        """This step's binding: the target model's parameters now (vLLM
        may have swapped the target, set_weight_update_target, or
        reallocated parameters, sleep/wake)."""
        params = dict(self.model.named_parameters())
        return self.plan.bind({}, {n: params.get(n) for n in self.names})

    def start_weight_update(self):
        pass  # parameters are written in place: no layerwise reload

    def finish_weight_update(self):
        pass

    def receive_weights(self, update_info):
        if self.plan is None:
            raise UnsupportedError("reshard vLLM engine: receive_weights "
                                   "before init_transfer_engine")
        self.plan.execute(self._bind(), version=update_info.version,
                          stream=_stream(self.comm))

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
            self.comm = _comm(init_info.transport, init_info.rank,
                              init_info.world_size, init_info.master_address,
                              init_info.master_port, None)
            self.plan = _plan(self.comm, worker, src, dst)
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
