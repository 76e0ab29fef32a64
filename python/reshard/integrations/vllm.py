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

Parameters that vLLM rewrites after loading (rm_after_load: MLA's
kv_b_proj, fused-MoE w13/w2 of reordering backends, fp8 block weights)
would hold checkpoint values where vLLM expects processed ones: the
engine refuses such plans at init (reshard.UnsupportedError naming the
parameters and what vLLM does to them) instead of serving wrong weights.
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


def _layouts(info, first_infer_rank):
    """The model and both layouts; reshard.UnsupportedError, the same on
    every rank (trainer and workers alike, before any collective), when
    vLLM rewrites some parameter after loading: writing checkpoint values
    into it in place would serve wrong weights."""
    model = reshard.models.Model(info.model_config_path,
                                 layers=info.layers or None, dtype=info.dtype)
    src = reshard.models.megatron_layout(model, info.train, first_rank=0)
    dst = reshard.models.vllm_layout(model, info.infer,
                                     first_rank=first_infer_rank)
    flagged = {}
    for b in range(dst.num_buffers):
        why = model.after_load("vllm", dst, b)
        if why:
            flagged.setdefault(dst.buffer_name(b), why)
    if flagged:
        names = sorted(flagged)
        raise UnsupportedError(
            "reshard vLLM engine: vLLM rewrites %d parameters after loading, "
            "so writing checkpoint values into them in place would serve "
            "wrong weights: %s (%s)%s" % (
                len(names), names[0], flagged[names[0]],
                "; also " + ", ".join(names[1:4]) +
                (", ..." if len(names) > 4 else "") if len(names) > 1 else ""))
    return model, src, dst


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
        self.plan = self.comm = self.bound = None

    def init_transfer_engine(self, init_info):
        pc = self.parallel_config
        # vLLM's numbering of a worker in a trainer-to-worker group
        # (weight_transfer/nccl_common.py, _worker_group_rank)
        rank = (init_info.rank_offset + pc.data_parallel_index * pc.world_size
                + pc.rank)
        _, src, dst = _layouts(init_info, init_info.rank_offset)
        self.comm = _comm(init_info.transport, rank, init_info.world_size,
                          init_info.master_address, init_info.master_port,
                          self.device)
        self.plan = _plan(self.comm, init_info, src, dst)
        params = dict(self.model.named_parameters())
        self.bound = self.plan.bind(
            {}, {n: params.get(n) for n in dst.buffers(rank)})

    def start_weight_update(self):
        pass  # parameters are written in place: no layerwise reload

    def finish_weight_update(self):
        pass

    def receive_weights(self, update_info):
        if self.plan is None:
            raise UnsupportedError("reshard vLLM engine: receive_weights "
                                   "before init_transfer_engine")
        self.plan.execute(self.bound, version=update_info.version,
                          stream=_stream(self.comm))

    def shutdown(self):
        if self.plan is not None:
            self.plan.close()
        if self.comm is not None:
            self.comm.close()
        self.plan = self.comm = self.bound = None


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
    strip_prefix: Optional[str] = field(default="module.")


class ReshardTrainerWeightTransferEngine(TrainerWeightTransferEngine):
    """The trainer side: binds source.iter_local() (this rank's Megatron
    parameters) once, and each send_weights() executes the plan while the
    sender drives the workers' start/update/finish."""

    init_info_cls = ReshardTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        if source is None:
            raise InvalidArgumentError("reshard trainer engine: needs a "
                                       "WeightSource (ModuleSource(model))")
        self = cls(client=client, source=source,
                   is_sender=init_info.rank == 0, rank=init_info.rank)
        ntrain = reshard.models.ranks(init_info.train)
        # the workers' info: the trainer's fields of the same names, and
        # the workers start after the trainer ranks
        worker = ReshardInitInfo(rank_offset=ntrain, **{
            f.name: getattr(init_info, f.name) for f in fields(ReshardInitInfo)
            if f.name != "rank_offset"})
        # Refusals first, identical on every rank (the workers' too).
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
        local = dict(source.iter_local())
        p = init_info.strip_prefix
        if p:
            local = {(n[len(p):] if n.startswith(p) else n): t
                     for n, t in local.items()}
        held = src.buffers(init_info.rank)
        self.bound = self.plan.bind({n: local.get(n) for n in held}, {})
        self.version = 0
        return self

    def send_weights(self):
        self.version += 1
        if self.is_sender:
            self.client.start_weight_update()
            join = in_thread(self.client.update_weights,
                             {"version": self.version},
                             deadline_s=self.deadline)
        try:
            self.plan.execute(self.bound, version=self.version,
                              stream=_stream(self.comm))
        finally:
            if self.is_sender:
                join()
        if self.is_sender:
            self.client.finish_weight_update()

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
