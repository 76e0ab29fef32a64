"""An SGLang weight-update adapter ("reshard"): the trainer's Megatron
shards go straight into a running SGLang's parameters, each TP worker
receiving only the bytes it holds, in one plan for the whole model.

Written against SGLang 0.5.23 (paths relative to python/sglang/srt). The
extension point is SGLang's custom weight loader:

    python -m sglang.launch_server ... \\
        --custom-weight-loader reshard.integrations.sglang.load

(arg_groups/fields/model.py, custom_weight_loader). A call of
Engine.update_weights_from_tensor(named_tensors, load_format=LOADER)
(entrypoints/engine.py) reaches every TP worker's scheduler
(managers/scheduler_components/weight_updater.py,
SchedulerWeightUpdaterManager.update_weights_from_tensor), which takes its
own rank's copy of the payload (managers/tp_worker.py,
deserialize_own_rank) and calls the model runner's
WeightUpdater.update_weights_from_tensor
(model_executor/model_runner_components/weight_updater.py): that refuses
models with derived-weight caches (_unsupported_derived_weight_cache_error)
and then calls ``load(model, named_tensors)`` with the live model. It is
the one hook that runs code of ours in every TP worker with the model,
inside SGLang's update session, without SGLang moving any weight:
update_weights_from_distributed broadcasts whole tensors from the trainer
over a torch group into load_weights (a gather), update_weights_from_ipc is
the checkpoint engine's (whole tensors over CUDA IPC), and collective_rpc
(Engine.collective_rpc, managers/scheduler.py Scheduler.handle_rpc_request)
calls Scheduler methods by name only.

The payload is one entry, ("reshard", a uint8 tensor of JSON): the init
info (ReshardSGLangInitInfo, with this engine's replica index), the
weight version and the trainer's plan id. The first call on a worker (or
the first of another trainer's plan) builds its communicator and plan
(collective with the trainer's first send_weights); every call
executes one version, written in place into model.named_parameters() by
SGLang's own names (reshard.models.sglang_layout).

Trainer side: every trainer rank

    trainer = SGLangTrainer(ReshardSGLangInitInfo(model_config_path=...,
                            train="tp=2,pp=2", infer="tp=4,dp=2",
                            world_size=16, master_address=..., master_port=...),
                            rank=r, engines=[engine0, engine1] if r == 0 else None,
                            source=megatron_model)
    trainer.send_weights()                    # every step

``engines``: the sender's (rank 0) handles of the SGLang engines, one per
replica in dp order (sglang.Engine, entrypoints/engine.py, or anything
with its begin_weight_update / update_weights_from_tensor /
end_weight_update: entrypoints/http_server_engine.py
HttpServerEngineAdapter has them over HTTP);
SGLang 0.5.23 serves --dp-size replicas through update_weights_from_tensor
only as separate engines (tokenizer_control_mixin.py asserts dp_size 1).

Ranks: trainer ranks 0 .. T-1 (Megatron's order), then replica d's worker
at T + tp_rank + tp * (pp_rank + pp * d), as rm_sglang_layout numbers
them (src/models/sglang.c: runtime_context.py spawn_world_rank); tp_rank,
pp_rank and the widths are SGLang's own (runtime_context.py get_parallel),
checked against the spec (tp, pp, attn_dp, ep) before anything is built.
Transports as the vLLM engine's (_transport.py): "nccl" (default),
"mpi", "ucx", "ucx_cuda", "inproc:<key>".

Versions: every rank passes the step's version (>= 1, increasing) to the
plan, which checks them (as the vLLM engine does).

Post-load rewrites. SGLang 0.5.23 requires updates inside a session
(SchedulerWeightUpdaterManager.update_weights_from_tensor refuses
otherwise), which the trainer's sender opens and closes:
begin_weight_update undoes the quant methods' in-place repacks
(model_loader/loader.py DefaultModelLoader.restore_weights_before_loading:
"Restore canonical destinations for loader-free P2P/RDMA refits", e.g.
FlashInfer TRT-LLM's bf16 block layout of w13/w2), and end_weight_update
re-runs every quant method's process_weights_after_loading on what was
loaded (DefaultModelLoader.postprocess_weights: AITER's shuffle of w13/w2,
the fused-SwiGLU interleave of w13, _maybe_interleave_w13_for_fused_swiglu
in layers/quantization/unquant.py, TRT-LLM's block layout). reshard writes
the loaded format of every byte of those parameters, so SGLang's own
session re-processes them. What end_weight_update skips after a load is
the model's post_load_weights (run_post_load = not loaded_weights: a
model's load_weights runs it itself): DeepSeek's, which copies kv_b_proj
into the attention's w_kc / w_vc (models/deepseek_common/
deepseek_weight_loader.py DeepseekV2WeightLoaderMixin.post_load_weights);
the loader re-runs it after each update for the layers whose kv_b_proj it
wrote (weight_names=). Refused at a worker's first update, naming the
parameter and the way out: a parameter SGLang's model lacks or holds at
another size or dtype, AMX-packed weights (layers/amx_utils.py
_amx_process_weight_after_loading packs in place, and
restore_weights_before_loading skips the duck-typed AMX methods), the
triton_kernels MoE backend (w13 / w2 created transposed:
unquant.py UnquantizedFusedMoEMethod.create_weights, use_triton_kernels),
a kv_b_proj in a model without post_load_weights.

How a worker's error reaches the trainer: SGLang 0.5.23 calls the custom
loader without catching (WeightUpdater.update_weights_from_tensor), so a
refusal raises in the worker's scheduler as any scheduler error does; the
refusal comes after the worker's communicator (collective with the
trainer), so the trainer fails within its plan deadline, and its sender
re-raises what update_weights_from_tensor returned or raised.
"""
import json
import uuid
import weakref
from dataclasses import asdict, dataclass
from typing import Optional

import reshard
from ..errors import InvalidArgumentError, UnsupportedError
from . import _engine
from ._transport import WORLDS, comm as _comm, deadline_s, in_thread, leave  # noqa: F401

#: load_format for Engine.update_weights_from_tensor; the same string goes
#: in SGLang's --custom-weight-loader.
LOADER = __name__ + ".load"
#: the payload's one entry
KEY = "reshard"


@dataclass
class ReshardSGLangInitInfo:
    """What every trainer rank and SGLang worker needs to build the same
    plan. ``rank_offset`` (the trainer ranks) and ``replica`` (the
    engine's dp index) are set by the trainer for each engine."""
    model_config_path: str
    train: str
    infer: str
    world_size: int
    transport: str = "nccl"
    master_address: Optional[str] = None
    master_port: Optional[int] = None
    layers: int = 0
    dtype: str = "bf16"
    staging_bytes: Optional[int] = None
    timeout_ms: Optional[int] = None
    topology: Optional[str] = None
    rank_offset: int = 0
    replica: int = 0


def _layouts(info, first_infer_rank):
    """The inference side's model and both layouts (the same on every
    rank)."""
    layers = info.layers or None
    dmodel = reshard.models.Model(info.model_config_path, layers=layers,
                                  dtype=info.dtype)
    src = reshard.models.megatron_layout(dmodel, info.train, first_rank=0)
    dst = reshard.models.sglang_layout(dmodel, info.infer,
                                       first_rank=first_infer_rank)
    return dmodel, src, dst


def payload(info, version, plan_id=""):
    """The named_tensors of one update for one engine: [("reshard", uint8
    tensor of JSON)] (update_weights_from_tensor moves each value to the
    worker's device: a tensor it must be). ``plan_id``: the trainer's plan
    (a worker whose plan is another's builds a new one)."""
    import torch
    raw = json.dumps({"init": asdict(info), "version": int(version),
                      "plan": str(plan_id)}).encode()
    return [(KEY, torch.frombuffer(bytearray(raw), dtype=torch.uint8))]


def _message(named_tensors):
    entries = dict(named_tensors)
    if set(entries) != {KEY}:
        raise InvalidArgumentError(
            "reshard SGLang loader: the payload must be exactly [(%r, ...)] "
            "(reshard.integrations.sglang.payload), got names %s"
            % (KEY, sorted(entries)[:4]))
    msg = json.loads(bytes(entries[KEY].cpu().numpy().tobytes()).decode())
    return ReshardSGLangInitInfo(**msg["init"]), msg["version"], msg["plan"]


def _parallel():
    """This worker's SGLang ranks and widths (runtime_context.py
    get_parallel, published by the scheduler at spawn)."""
    from sglang.srt.runtime_context import get_parallel
    p = get_parallel()
    return {k: getattr(p, k) for k in ("tp_rank", "tp_size", "pp_rank",
                                       "pp_size", "attn_dp_size",
                                       "moe_ep_size")}


def worker_rank(info, par):
    """This worker's reshard rank (rm_sglang_layout's order), after
    checking SGLang's widths against the spec: a worker of another
    parallel configuration than ``infer`` says would receive another
    rank's shards."""
    p = reshard.models.parallel(info.infer)  # validated: keys and values
    want = {"tp_size": p.tp, "pp_size": p.pp,
            "attn_dp_size": p.attn_dp or 1, "moe_ep_size": p.ep}
    for k, v in want.items():
        if par[k] != v:
            raise InvalidArgumentError(
                "reshard SGLang engine: this SGLang worker (tp_rank %d, "
                "pp_rank %d) runs %s=%d, the inference spec '%s' says %d"
                % (par["tp_rank"], par["pp_rank"], k, par[k], info.infer, v))
    if not 0 <= info.replica < p.dp:
        raise InvalidArgumentError(
            "reshard SGLang engine: replica %d is not one of the %d in "
            "'%s'" % (info.replica, p.dp, info.infer))
    return info.rank_offset + par["tp_rank"] + p.tp * (
        par["pp_rank"] + p.pp * info.replica)


_AMX = ("SGLang packed it for Intel AMX after loading (layers/amx_utils.py "
        "_amx_process_weight_after_loading), a layout its "
        "restore_weights_before_loading cannot undo and reshard does not "
        "write: serve on a device without AMX packing")
_TRITON_KERNELS = (
    "SGLang's triton_kernels MoE backend creates w13 / w2 transposed "
    "(unquant.py UnquantizedFusedMoEMethod.create_weights, "
    "use_triton_kernels), a layout reshard does not write: serve with "
    "another --moe-runner-backend (triton, the default)")


def _classify(model, dmodel, dst, rank):
    """(kv_b_proj names to re-derive after each update, refusals {name:
    why}) of this worker; every other parameter is written directly (the
    session re-processes the quant methods' formats, see the module
    docstring)."""
    live = dict(model.named_parameters())
    written = _engine.written(dst, rank)
    refused, kv_b = {}, []
    for name, b in dst.buffers(rank).items():
        if name not in live:
            refused[name] = (
                "SGLang's model has no parameter of this name on rank %d: "
                "the served model, its config and the inference spec "
                "disagree" % rank)
            continue
        module = _engine.owner(model, name)
        if getattr(module, "use_intel_amx_backend", False):
            refused[name] = _AMX
        elif getattr(getattr(module, "quant_method", None),
                     "use_triton_kernels", False):
            refused[name] = _TRITON_KERNELS
        elif dmodel.after_load("sglang", dst, b):
            if callable(getattr(model, "post_load_weights", None)):
                kv_b.append(name)
            else:
                refused[name] = (
                    "%s; but this model (%s) has no post_load_weights to "
                    "re-run" % (dmodel.after_load("sglang", dst, b),
                                type(model).__name__))
    refused.update(_engine.size_refusals(
        live, written, set(refused), rank, "SGLang",
        "the served checkpoint's dtype or quantization_config and reshard's "
        "model (dtype=%s) disagree" % dmodel.dtype))
    return kv_b, refused


class Worker:
    """One SGLang TP worker's side: its plan, and the kv_b_proj layers
    whose derived copies it re-derives after each update."""

    def __init__(self, model, info, par=None, device=None):
        self.info = info
        try:
            rank = worker_rank(info, par if par is not None else _parallel())
            _engine.check_world(info, info.rank_offset, rank, "SGLang")
        except InvalidArgumentError:
            leave(info.transport)  # the trainer is in its creation
            raise
        dmodel, src, dst = _layouts(info, info.rank_offset)
        kv_b, refused = _classify(model, dmodel, dst, rank)
        # The communicator first (collective with the trainer): a refusal
        # then leaves the trainer in plan creation, which has a deadline.
        comm = _comm(info.transport, rank, info.world_size,
                     info.master_address, info.master_port, device)
        if refused:
            comm.close()
            _engine.refuse(refused, rank, "SGLang")
        self.comm, self.rank, self.kv_b = comm, rank, kv_b
        self.names = list(dst.buffers(rank))
        # (a failed creation closes comm)
        self.plan = _engine.make_plan(comm, info, src, dst)

    def update(self, model, version):
        """One version into the model's parameters as they are now (SGLang
        may have reallocated them: release/resume_memory_occupation), then
        DeepSeek's w_kc / w_vc re-derived from the kv_b_proj written."""
        params = dict(model.named_parameters())
        bound = self.plan.bind({}, {n: params.get(n) for n in self.names})
        self.plan.execute(bound, version=version,
                          stream=_engine.stream(self.comm))
        if self.kv_b:
            # deepseek_weight_loader.py post_load_weights(weight_names=):
            # the layers whose kv_b_proj was loaded
            model.post_load_weights(weight_names=self.kv_b)

    def close(self):
        for x in (getattr(self, "plan", None), getattr(self, "comm", None)):
            if x is not None:
                x.close()
        self.plan = self.comm = None


#: model -> its Worker (one per live model in this process)
_WORKERS = weakref.WeakKeyDictionary()


def _device(model):
    """The CUDA device of the model's parameters (the "nccl" transport's
    communicator lives there), else None."""
    for p in model.parameters():
        return p.device if p.device.type == "cuda" else None
    return None


def load(model, named_tensors):
    """SGLang's custom weight loader (--custom-weight-loader
    reshard.integrations.sglang.load): one reshard update of ``model``,
    the live model of this TP worker. The first call (or a call with other
    init info) builds this worker's plan."""
    info, version, plan_id = _message(named_tensors)
    w = _WORKERS.get(model)
    if w is not None and (w.info, w.plan_id) != (info, plan_id):
        w.close()
        del _WORKERS[model]
        w = None
    if w is None:
        w = Worker(model, info, device=_device(model))
        w.plan_id = plan_id
        _WORKERS[model] = w
    w.update(model, version)


def close(model):
    """Ends this model's reshard plan and communicator (a worker leaving
    the job); the next load builds them again."""
    w = _WORKERS.pop(model, None)
    if w is not None:
        w.close()


def _ok(result, what, replica):
    """SGLang's results: Engine's (success, message), the HTTP server's
    {"success": ..., "message": ...} (HttpServerEngineAdapter); a failure
    raises."""
    if isinstance(result, dict) and "success" in result:
        result = (result["success"], result.get("message"))
    if isinstance(result, tuple) and len(result) == 2 and not result[0]:
        raise UnsupportedError("reshard SGLang engine: replica %d: %s "
                               "failed: %s" % (replica, what, result[1]))
    return result


class SGLangTrainer:
    """The trainer side (every trainer rank): each send_weights() binds
    this rank's parameters from ``source`` (a module: named_parameters()
    and named_buffers(), or a callable returning (name, tensor) pairs),
    names without ``strip_prefix`` (Megatron's DDP and Float16Module
    wrappers), and executes the plan while the sender (rank 0) drives the
    engines' session: begin_weight_update, update_weights_from_tensor with
    reshard's payload (one thread per engine), end_weight_update. The plan
    is built at the first send_weights, collectively with the workers'
    first load."""

    def __init__(self, info, rank, source, engines=None,
                 strip_prefix="module."):
        self.ntrain = reshard.models.ranks(info.train)
        _engine.check_world(info, self.ntrain, rank, "SGLang")
        if not 0 <= rank < self.ntrain:
            raise InvalidArgumentError(
                "reshard SGLang trainer: rank %d is not a trainer rank of "
                "'%s' (0 .. %d)" % (rank, info.train, self.ntrain - 1))
        self.info = ReshardSGLangInitInfo(**dict(asdict(info),
                                                 rank_offset=self.ntrain))
        self.rank, self.source, self.strip_prefix = rank, source, strip_prefix
        self.is_sender = rank == 0
        self.engines = list(engines or ())
        dp = reshard.models.parallel(info.infer).dp
        if self.is_sender and len(self.engines) != dp:
            raise InvalidArgumentError(
                "reshard SGLang trainer: the sender needs one engine per "
                "replica of '%s' (%d), got %d" % (info.infer, dp,
                                                  len(self.engines)))
        # layouts first: a bad spec or config fails here, on every rank,
        # before any collective
        _, self.src, self.dst = _layouts(self.info, self.ntrain)
        self.held = list(self.src.buffers(rank))
        self.deadline = deadline_s(info.timeout_ms)
        self.plan = self.comm = None
        self.version = 0
        # this trainer's plan, named in every payload: a worker still
        # holding an earlier trainer's plan (same init info) builds anew
        self.plan_id = uuid.uuid4().hex if self.is_sender else ""

    def _local(self):
        src = self.source
        pairs = src() if callable(src) and not hasattr(
            src, "named_parameters") else \
            list(src.named_parameters()) + list(src.named_buffers())
        local = {}
        for n, t in pairs:
            local.setdefault(_engine.strip(n, self.strip_prefix), t)
        missing = [n for n in self.held if n not in local]
        if missing:
            raise InvalidArgumentError(
                "reshard SGLang trainer, rank %d: the source has no %s "
                "(Megatron's name, after removing %r)%s" % (
                    self.rank, missing[0], self.strip_prefix,
                    " and %d more" % (len(missing) - 1) if len(missing) > 1
                    else ""))
        return local

    def _rpc(self, version):
        """The sender: open every engine's session, then the updates in
        threads (they block until the workers finish); returns join()."""
        begun = []
        try:
            for d, e in enumerate(self.engines):
                _ok(e.begin_weight_update(), "begin_weight_update", d)
                begun.append(d)
        except BaseException:
            for d in begun:  # no session left open
                try:
                    self.engines[d].end_weight_update()
                except Exception:
                    pass  # the begin's error is the one to report
            raise
        joins = []
        for d, e in enumerate(self.engines):
            info = ReshardSGLangInitInfo(**dict(asdict(self.info), replica=d))

            def call(e=e, d=d, info=info):
                _ok(e.update_weights_from_tensor(
                    named_tensors=payload(info, version, self.plan_id),
                    load_format=LOADER,
                    flush_cache=True), "update_weights_from_tensor", d)
            joins.append(in_thread(call, deadline_s=self.deadline))

        def join():
            err = None
            for j in joins:
                try:
                    j()
                except BaseException as e:  # every thread joined first
                    err = err or e
            # every session closed, also after a failure (SGLang keeps one
            # open otherwise and refuses the next begin)
            for d, e in enumerate(self.engines):
                try:
                    _ok(e.end_weight_update(), "end_weight_update", d)
                except BaseException as e2:
                    err = err or e2
            if err is not None:
                raise err
        return join

    def _connect(self):
        """Communicator and plan, collective with the workers' first load
        (a failure leaves neither, and the next send_weights tries again)."""
        comm = _comm(self.info.transport, self.rank, self.info.world_size,
                     self.info.master_address, self.info.master_port, None)
        # (a failed creation closes comm)
        self.plan = _engine.make_plan(comm, self.info, self.src, self.dst)
        self.comm = comm

    def send_weights(self):
        local = self._local()  # before any RPC: a missing tensor stops here
        self.version += 1
        join = self._rpc(self.version) if self.is_sender else (lambda: None)
        try:
            if self.plan is None:
                self._connect()
            bound = self.plan.bind({n: local[n] for n in self.held}, {})
            self.plan.execute(bound, version=self.version,
                              stream=_engine.stream(self.comm))
        finally:
            join()

    def shutdown(self):
        for x in (self.plan, self.comm):
            if x is not None:
                x.close()
        self.plan = self.comm = None
