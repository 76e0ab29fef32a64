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

Names are the HF checkpoint's (reshard.models with per_expert=True: one
tensor per expert, as checkpoints store them). A name the model does not
have, or a tensor the generator never yields, is
reshard.InvalidArgumentError naming it.
"""
import numpy as np
import ray
import torch
from verl.checkpoint_engine.base import (CheckpointEngine,  # noqa: F401
                                         CheckpointEngineRegistry)
from verl.utils.net_utils import get_free_port

import reshard
from ..errors import InvalidArgumentError
from ._transport import comm as _comm


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
    "inproc:<key>"), layers, dtype, staging_bytes, timeout_ms, topology,
    master_address (default: this node's address as verl's own NCCL
    engine finds it, _routable_address) and is_master. Transports: "nccl"
    (GPUs; vLLM's PyNcclCommunicator, rendezvous at the master's address),
    "mpi" (every actor and rollout worker in one MPI job: COMM_WORLD),
    "inproc:<key>" (threads of one process; tests). Any other keyword
    (a misspelt engine_kwargs key) is InvalidArgumentError naming it."""

    def __init__(self, bucket_size, model_config_path, transport="nccl",
                 is_master=False, layers=0, dtype="bf16", staging_bytes=None,
                 timeout_ms=None, topology=None, master_address=None,
                 **unknown):
        if unknown:
            raise InvalidArgumentError(
                "reshard verl engine: unknown keyword(s) %s (engine_kwargs."
                "reshard takes model_config_path, transport, layers, dtype, "
                "staging_bytes, timeout_ms, topology, master_address)"
                % ", ".join(sorted(unknown)))
        self.bucket_size = int(bucket_size)
        self.model_config_path = model_config_path
        self.transport = transport
        self.is_master = is_master
        self.model = reshard.models.Model(model_config_path,
                                          layers=layers or None, dtype=dtype,
                                          per_expert=True)
        self.groups = _groups(self.model.tensors(), self.bucket_size)
        self.options = dict(staging_bytes=staging_bytes, timeout_ms=timeout_ms,
                            topology=topology)
        self.master_address = master_address
        self.comm, self.plans, self.key = None, [], None

    # ------------------------------------------------------- topology
    def prepare(self):
        if not self.is_master or not self.transport == "nccl":
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
        for g in self.groups:  # collective, in the same order everywhere
            self.plans.append(reshard.Plan(self.comm, _replicated(g, actors),
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
        group_of = {t.name: i for i, g in enumerate(self.groups) for t in g}
        pending = [dict() for _ in self.groups]
        done = 0

        def flush():
            nonlocal done
            while done < len(self.groups) and \
                    len(pending[done]) == len(self.groups[done]):
                self.plans[done].execute(pending[done], {},
                                         stream=self._stream())
                pending[done] = None  # the tensors can go
                done += 1

        def take(name, tensor):
            g = group_of.get(name)
            if g is None:
                raise InvalidArgumentError(
                    "reshard verl engine, rank %d: weight %r is not a tensor "
                    "of %s" % (self.rank, name, self.model_config_path))
            if g < done or name in pending[g]:
                raise InvalidArgumentError("reshard verl engine, rank %d: "
                                           "weight %r given twice"
                                           % (self.rank, name))
            pending[g][name] = tensor
            flush()

        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                take(name, tensor)
        else:
            for name, tensor in weights:
                take(name, tensor)
        if done < len(self.groups):
            missing = [t.name for t in self.groups[done]
                       if t.name not in pending[done]]
            raise InvalidArgumentError(
                "reshard verl engine, rank %d: the weights ended without %s%s"
                % (self.rank, missing[0],
                   " and %d more" % (len(missing) - 1) if len(missing) > 1 else ""))

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
