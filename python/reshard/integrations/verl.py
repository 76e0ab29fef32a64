"""A verl checkpoint engine ("reshard"): actor workers to rollout workers
through reshard plans, every actor worker a sender.

Written against verl's interface as of verl 0.9.1
(verl/checkpoint_engine/base.py: CheckpointEngine, CheckpointEngineRegistry;
CheckpointEngineManager.update_weights calls prepare -> build_topology ->
init_process_group -> send_weights / receive_weights -> finalize for each
update). Importing this module needs verl (and so torch) and registers
backend "reshard" in verl's CheckpointEngineRegistry.

Registration is verl's own plugin mechanism: checkpoint_engine.
custom_backend_module names this module, and verl imports it with
import_external_libs (verl/utils/import_utils.py) in every process that
builds an engine, before CheckpointEngineRegistry.new / .get:
ActorRolloutRefWorker.init_model (verl/workers/engine_workers.py, the
actor workers), CheckpointEngineWorker.__init__ and
CheckpointEngineManager.__init__ (verl/checkpoint_engine/base.py, the
rollout workers and the trainer). Each builds the engine with
bucket_size = update_weights_bucket_megabytes << 20 and
**engine_kwargs["reshard"] (the actor side adds is_master). In verl's
config (actor_rollout_ref.rollout.checkpoint_engine, a
CheckpointEngineConfig, verl/workers/config/rollout.py):

    actor_rollout_ref:
      rollout:
        checkpoint_engine:
          backend: reshard
          custom_backend_module: reshard.integrations.verl
          engine_kwargs:
            reshard:
              model_config_path: /path/config.json

or as Hydra overrides of verl's ppo_trainer config (engine_kwargs is {}
there, so its keys take a "+"):

    actor_rollout_ref.rollout.checkpoint_engine.backend=reshard
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=reshard.integrations.verl
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.model_config_path=/path/config.json

Any other keyword of ReshardCheckpointEngine goes the same way (a
"timeout_ms: 60000" under reshard:, or ...engine_kwargs.reshard.
timeout_ms=60000). tests/python/real/verl_world.py composes verl's config
with exactly the overrides above (read from this docstring) and its
test_verl_real.py loads the YAML above into CheckpointEngineConfig.

What verl's interface allows: the actor side hands send_weights full
tensors by HF name (actor.get_per_tensor_param()), on every actor worker,
and the rollout side must yield full tensors by name to its server
adapter, which loads them. So the plan's source is every tensor
replicated on all actor workers, its destination every tensor replicated
on all rollout workers: reshard splits each tensor's bytes evenly over
the actor workers (every actor worker sends, where verl's nccl engine
sends from rank 0 and its NVLink peers), and with a topology relays
between rollout workers so each byte enters an NVLink domain once. It
cannot write vLLM's fused parameters directly here: for that, use the
vLLM engine (reshard.integrations.vllm).

Memory: tensors are grouped in model order into plans of at most
bucket_size bytes; an actor worker holds the generator's tensors of one
group until the group is complete (all of them if the generator does not
follow the config's order), a rollout worker one group's received tensors
until its server adapter takes them.

Without the gather (source="fsdp", verl's FSDP / FSDP2 actor): each
actor worker sends only the FSDP shard it holds, and no actor worker
gathers anything. verl 0.9.1 hands send_weights full tensors: its
ActorRolloutRefWorker.update_weights (verl/workers/engine_workers.py)
calls self.actor.engine.get_per_tensor_param(), whose FSDP engine
(verl/workers/engine/fsdp/transformer_impl.py FSDPEngine.
get_per_tensor_param) yields param.full_tensor() of every DTensor: an
all-gather of the whole model on every actor worker. It passes the
training engine itself only to the "delta_sharded" backend. The patch
PATCH (verl-0.9.1-send-shards.patch beside this module: one condition)
passes it to any engine whose takes_training_engine is true, as this
one's is with source="fsdp". Apply it where verl is installed:

    patch -p1 -d "$(python -c 'import os, verl; print(os.path.dirname(os.path.dirname(verl.__file__)))')" \\
        < "$(python -c 'import reshard.integrations.verl as v; print(v.PATCH)')"

send_weights then reads the engine's get_per_tensor_param_shard()
(transformer_impl.py: each rank's local shard, bf16, flat, with a
ShardSpec of its global shape, mesh and placements). The
plan's source is the mesh verl's FSDP engine builds (verl/workers/engine/
fsdp/utils.py create_device_mesh: (n,) for fsdp_size -1 or >= n, else
(n / fsdp_size, fsdp_size), HSDP) with each tensor Shard(0) over its
last axis, as fully_shard places it (Replicate over the first): pass the
actor's fsdp_size (actor_rollout_ref.actor.fsdp_config.fsdp_size). Every
shard's ShardSpec is checked against that plan; a different placement is
InvalidArgumentError naming the tensor and rank, before the group that
holds the tensor moves (the other ranks' executes of it then end at
their deadline). Without the patch, source="fsdp" refuses verl's full
tensors with that message, before anything moves. Dense models only:
transformers 5 fuses a MoE model's experts in the trainer
(modeling_qwen3_moe.py Qwen3MoeExperts.gate_up_proj [E, 2 I, H]), which
this engine does not map yet; it refuses them at construction.

Names are the HF checkpoint's (reshard.models with per_expert=True: one
tensor per expert, as checkpoints store them). A name the model does not
have, or a tensor the generator never yields, is
reshard.InvalidArgumentError naming it. A tied model's lm_head.weight
(torch's state_dict lists a tied parameter under both names, so verl
yields it) is the embedding the model lists once, and vLLM ties it the
same way (vllm/model_executor/models/qwen2.py Qwen2ForCausalLM.__init__:
lm_head.tie_weights(model.embed_tokens)): skipped.
"""
import os

import numpy as np
import ray
import torch
from verl.checkpoint_engine.base import (CheckpointEngine,  # noqa: F401
                                         CheckpointEngineRegistry)
from verl.utils.net_utils import get_free_port

import reshard
from ..errors import InvalidArgumentError
from ._transport import comm as _comm

#: verl 0.9.1's ActorRolloutRefWorker.update_weights passing the training
#: engine to this engine with source="fsdp" (see the module docstring)
PATCH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "verl-0.9.1-send-shards.patch")


def _routable_address():
    """This node's address as its peers reach it, found as verl's own NCCL
    engine finds the address it announces (verl/checkpoint_engine/
    nccl_checkpoint_engine.py, NCCLCheckpointEngine._start_zmq_server:
    ray.util.get_node_ip_address(); verl needs Ray, so it is there): the
    node's address in the Ray cluster, never the hostname's, which often
    resolves to 127.0.0.1 and cannot be reached from another node."""
    return ray.util.get_node_ip_address().strip("[]")


def _groups(tensors, bucket_size):
    """Consecutive tensors (model order) in groups of <= bucket_size bytes
    (a larger tensor alone)."""
    groups, cur, cur_bytes = [], [], 0
    for t in tensors:
        n = int(np.prod(t.shape, dtype=np.int64)) * reshard.dtypes.size(
            reshard.dtypes.to_c(t.dtype))
        if cur and cur_bytes + n > bucket_size:
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += n
    if cur:
        groups.append(cur)
    return groups


def _fsdp(tensors, ranks, fsdp_size):
    """The source verl's FSDP engine holds: its mesh (verl/workers/engine/
    fsdp/utils.py create_device_mesh) with every tensor Shard(0) over the
    fsdp axis (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    FSDPParam._init_sharded_param: Shard(0), HSDP (Replicate(), Shard(0)))."""
    n = len(ranks)
    if fsdp_size < 0 or fsdp_size >= n:
        shape, placements = (n,), [reshard.Shard(0)]
    else:
        shape, placements = (n // fsdp_size, fsdp_size), [reshard.Replicate(),
                                                          reshard.Shard(0)]
    L = reshard.Layout()
    m = L.add_mesh(shape, ranks=ranks)
    for t in tensors:
        L.place(L.add_tensor(t.name, t.dtype, t.shape), m, placements)
    return L


def _replicated(tensors, ranks):
    L = reshard.Layout()
    m = L.add_mesh(len(ranks), ranks=ranks)
    for t in tensors:
        L.place(L.add_tensor(t.name, t.dtype, t.shape), m, [reshard.Replicate()])
    return L


# verl's registry: CheckpointEngineRegistry.register (verl/checkpoint_engine/
# base.py), run when verl imports this module as custom_backend_module
@CheckpointEngineRegistry.register("reshard")
class ReshardCheckpointEngine(CheckpointEngine):
    """verl checkpoint engine over reshard plans. Constructor keywords
    (verl passes bucket_size and the backend's engine kwargs):
    model_config_path (required), transport ("nccl", "mpi",
    "inproc:<key>"), source ("full": verl's full tensors; "fsdp": the
    FSDP shards, see the module docstring), fsdp_size (with "fsdp": the
    actor's, verl's semantics; default -1, every actor worker one shard),
    layers, dtype, staging_bytes, timeout_ms, topology, master_address
    (default: this node's address as verl's own NCCL engine finds it,
    _routable_address) and is_master. Transports: "nccl"
    (GPUs; vLLM's PyNcclCommunicator, rendezvous at the master's address),
    "mpi" (every actor and rollout worker in one MPI job: COMM_WORLD),
    "ucx" (host memory over UCX, rendezvous at the master's address as
    for nccl: actors and rollouts launched as Ray actors, no MPI),
    "ucx_cuda" (GPU memory over UCX, the same rendezvous),
    "inproc:<key>" (threads of one process; tests). Any other keyword
    (a misspelt engine_kwargs key) is InvalidArgumentError naming it."""

    def __init__(self, bucket_size, model_config_path, transport="nccl",
                 is_master=False, layers=0, dtype="bf16", staging_bytes=None,
                 timeout_ms=None, topology=None, master_address=None,
                 source="full", fsdp_size=-1, **unknown):
        if unknown:
            raise InvalidArgumentError(
                "reshard verl engine: unknown keyword(s) %s (engine_kwargs."
                "reshard takes model_config_path, transport, source, "
                "fsdp_size, layers, dtype, staging_bytes, timeout_ms, "
                "topology, master_address)" % ", ".join(sorted(unknown)))
        if source not in ("full", "fsdp"):
            raise InvalidArgumentError(
                "reshard verl engine: source %r: \"full\" (verl's full "
                "tensors) or \"fsdp\" (the FSDP shards)" % (source,))
        if source == "fsdp" and dtype != "bf16":
            raise InvalidArgumentError(
                "reshard verl engine: source \"fsdp\" with dtype %r: verl's "
                "FSDP engine exports its shards in bf16 "
                "(FSDPEngine.get_per_tensor_param_shard)" % (dtype,))
        self.source, self.fsdp_size = source, int(fsdp_size)
        # full tensors in another float dtype are cast to the model's
        # (never to fp8: that takes scales, reshard's own quantization)
        self.cast = getattr(torch, reshard.dtypes.torch_name(
            reshard.dtypes.to_c(dtype))) if dtype in ("bf16", "f16", "f32") \
            else None
        # verl's ActorRolloutRefWorker.update_weights, patched
        # (integrations/verl-0.9.1-send-shards.patch), passes the training
        # engine itself to send_weights where this is true
        self.takes_training_engine = source == "fsdp"
        self.bucket_size = int(bucket_size)
        self.model_config_path = model_config_path
        self.transport = transport
        self.is_master = is_master
        self.model = reshard.models.Model(model_config_path,
                                          layers=layers or None, dtype=dtype,
                                          per_expert=True)
        if source == "fsdp" and any(".experts." in t.name
                                    for t in self.model.tensors()):
            raise InvalidArgumentError(
                "reshard verl engine: source \"fsdp\" with the MoE model %s: "
                "transformers 5 holds its experts fused (modeling_qwen3_moe."
                "py Qwen3MoeExperts.gate_up_proj [E, 2 I, H]), not as the "
                "checkpoint's per-expert tensors; not mapped yet (use "
                "source \"full\")" % (model_config_path,))
        self.groups = _groups(self.model.tensors(), self.bucket_size)
        self.options = dict(staging_bytes=staging_bytes, timeout_ms=timeout_ms,
                            topology=topology)
        self.master_address = master_address
        self.comm, self.plans, self.key = None, [], None

    # ------------------------------------------------------- topology
    def prepare(self):
        if not self.is_master or self.transport not in ("nccl", "ucx", "ucx_cuda"):
            return {}
        addr = self.master_address or _routable_address()
        # a free port there, as verl's NCCL engine finds its own
        # (verl/utils/net_utils.py get_free_port: IPv6 too)
        port, _ = get_free_port(addr)
        return {"master_address": addr, "master_port": port}

    @classmethod
    def build_topology(cls, actor_wg_world_size, rollout_world_size, metadata):
        world = actor_wg_world_size + rollout_world_size
        master = metadata[0] if metadata else {}
        actor = {"rank": list(range(actor_wg_world_size)),
                 "world_size": [world] * actor_wg_world_size,
                 "num_senders": [actor_wg_world_size] * actor_wg_world_size,
                 "master_metadata": [master] * actor_wg_world_size}
        rollout = {"rank": list(range(actor_wg_world_size, world)),
                   "world_size": [world] * rollout_world_size,
                   "num_senders": [actor_wg_world_size] * rollout_world_size,
                   "master_metadata": [master] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank, world_size, num_senders,
                           master_metadata=None):
        key = (rank, world_size, num_senders)
        if self.key == key and not any(p.status().failed for p in self.plans):
            return  # the same group as the last update: plans kept
        # (a failed plan refuses executes: build the group again; every
        # rank's plans failed with it, so every rank rebuilds)
        self.close()
        md = master_metadata or {}
        self.comm = _comm(self.transport, rank, world_size,
                          md.get("master_address"), md.get("master_port"),
                          None)
        self.rank, self.senders = rank, num_senders
        actors = list(range(num_senders))
        rollouts = list(range(num_senders, world_size))
        self.sources = [_fsdp(g, actors, self.fsdp_size)
                        if self.source == "fsdp" else _replicated(g, actors)
                        for g in self.groups]
        # this rank's box of each tensor it sends (source "fsdp": checked
        # against the trainer's ShardSpecs)
        self.boxes = [{f.name: f.box for f in src.fragments(rank)}
                      for src in self.sources]
        for g, src in zip(self.groups, self.sources):
            # collective, in the same order everywhere
            self.plans.append(reshard.Plan(self.comm, src,
                                           _replicated(g, rollouts),
                                           **self.options))
        self.key = key

    def finalize(self):
        pass  # plans and communicator are kept for the next update

    def close(self):
        """Releases the plans and the communicator."""
        for p in self.plans:
            p.close()
        if self.comm is not None:
            self.comm.close()
        self.comm, self.plans, self.key = None, [], None

    # -------------------------------------------------------- weights
    def _stream(self):
        if self.comm is None or not self.comm.device:
            return None
        return torch.cuda.current_stream()

    async def send_weights(self, weights, global_steps=None):
        if self.rank >= self.senders:
            raise InvalidArgumentError("reshard verl engine: send_weights on "
                                       "rollout rank %d" % self.rank)
        if self.source == "fsdp":
            get = getattr(weights, "get_per_tensor_param_shard", None)
            if get is None:
                raise InvalidArgumentError(
                    "reshard verl engine, rank %d: source \"fsdp\" needs the "
                    "training engine, and send_weights got %s: verl 0.9.1 "
                    "passes the engine only to the delta_sharded backend; "
                    "apply reshard.integrations.verl.PATCH to verl (see "
                    "that module's docstring)"
                    % (self.rank, type(weights).__name__))
            weights, _ = get()
        group_of = {t.name: i for i, g in enumerate(self.groups) for t in g}
        tied = "lm_head.weight" not in group_of and \
            "model.embed_tokens.weight" in group_of
        pending = [dict() for _ in self.groups]
        seen = [set() for _ in self.groups]
        done = 0

        def flush():
            nonlocal done
            while done < len(self.groups) and \
                    len(seen[done]) == len(self.groups[done]):
                self.plans[done].execute(pending[done], {},
                                         stream=self._stream())
                pending[done] = None  # the tensors can go
                done += 1

        def take(name, tensor, shard=None):
            g = group_of.get(name)
            if g is None:
                if tied and name == "lm_head.weight":
                    return  # the embedding, listed once (module docstring)
                raise InvalidArgumentError(
                    "reshard verl engine, rank %d: weight %r is not a tensor "
                    "of %s" % (self.rank, name, self.model_config_path))
            if g < done or name in seen[g]:
                raise InvalidArgumentError("reshard verl engine, rank %d: "
                                           "weight %r given twice"
                                           % (self.rank, name))
            if self.source == "fsdp":
                tensor = self._shard(g, name, tensor, shard)
            elif self.cast is not None and isinstance(tensor, torch.Tensor) \
                    and tensor.is_floating_point() and tensor.dtype != self.cast:
                # verl's FSDP actor keeps fp32 master weights and its
                # get_per_tensor_param yields them as they are; its own
                # shard export casts to bf16 the same way
                # (FSDPEngine.get_per_tensor_param_shard)
                tensor = tensor.to(self.cast)
            seen[g].add(name)
            if tensor is not None:
                pending[g][name] = tensor
            flush()

        if hasattr(weights, "__aiter__"):
            async for item in weights:
                take(*item)
        else:
            for item in weights:
                take(*item)
        if done < len(self.groups):
            missing = [t.name for t in self.groups[done]
                       if t.name not in seen[done]]
            raise InvalidArgumentError(
                "reshard verl engine, rank %d: the weights ended without %s%s"
                % (self.rank, missing[0],
                   " and %d more" % (len(missing) - 1) if len(missing) > 1 else ""))

    def _shard(self, g, name, local, shard):
        """This rank's source buffer of tensor ``name`` (group g) from the
        training engine's (local, ShardSpec); None where the plan gives
        the rank nothing of it. The ShardSpec's placement must give this
        rank the box the plan does."""
        if shard is None:
            raise InvalidArgumentError(
                "reshard verl engine, rank %d: weight %r came without its "
                "ShardSpec: source \"fsdp\" takes (name, local shard, "
                "ShardSpec) as FSDPEngine.get_per_tensor_param_shard yields "
                "them" % (self.rank, name))
        box = self.boxes[g].get(name)
        want = [box] if box is not None else []
        if shard.mesh is None:
            # unsharded on the trainer (a parameter outside fully_shard):
            # the plan's piece of the full tensor, a view (dim 0 rows)
            if not want:
                return None
            full = tuple(int(n) for n in shard.full_shape)
            got = "the whole tensor %s with %d elements" % (full, local.numel())
            (lo, hi), rest = want[0][0], want[0][1:]
            if local.numel() == int(np.prod(full, dtype=np.int64)) and \
                    all(b == (0, n) for b, n in zip(rest, full[1:])):
                return local.reshape(full)[lo:hi].reshape(-1)
        else:
            s = reshard.dtensor.spec(name, shard, dtype="bf16")
            mine = [f.box for f in reshard.dtensor.layout([s]).fragments(self.rank)]
            got = "%s (placements %r over mesh %r of torch ranks %r)" % (
                mine, s.placements, s.mesh, s.ranks)
            if mine == want:
                return local if want else None
        raise InvalidArgumentError(
            "reshard verl engine, rank %d: weight %r: the trainer's shard is "
            "%s, the plan (verl's FSDP mesh for %d actor workers, fsdp_size "
            "%d) gives this rank %s" % (self.rank, name, got, self.senders,
                                        self.fsdp_size, want))

    async def receive_weights(self, global_steps=None):
        # torch tensors, on the GPU or on the host: verl's server adapters
        # (BucketedWeightSender.async_send_weights, verl/workers/rollout/
        # vllm_rollout/bucketed_weight_transfer.py) call element_size(),
        # read .dtype as torch's and copy_() them. reshard writes straight
        # into them (torch tensors are execute's buffers: no copy, no
        # numpy view; bf16 is torch.bfloat16 itself).
        device = "cuda" if self.comm.device else "cpu"
        for g, plan in zip(self.groups, self.plans):
            out = {t.name: torch.empty(
                t.shape, device=device, dtype=getattr(
                    torch, reshard.dtypes.torch_name(reshard.dtypes.to_c(t.dtype))))
                for t in g}
            stream = self._stream()
            plan.execute({}, out, stream=stream)
            if stream is not None:
                # the consumer may read on another stream or process:
                # the data must have landed before the tensors go out
                stream.synchronize()
            for t in g:
                yield t.name, out[t.name]
