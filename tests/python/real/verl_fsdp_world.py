"""One MPI job: verl 0.9.1's FSDP actor syncing into reshard's verl
checkpoint engine with and without the gather (issue 41, item 4).

    VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=verl_cpu_platform \\
    PYTHONPATH=tests/python/real mpirun -n 6 python verl_fsdp_world.py \\
        --trainers 4 --port 29750

Ranks 0 .. T-1 are verl's actor workers: a gloo world of their own,
transformers' LlamaForCausalLM (tied embeddings, uneven chunks: vocab 203
and intermediate 14 over 4 ranks) sharded by torch's fully_shard over
verl's own mesh (verl/workers/engine/fsdp/utils.py create_device_mesh:
FSDP for fsdp_size -1, HSDP for fsdp_size 2). The ranks after them are
rollout workers. Every rank runs ReshardCheckpointEngine (transport
"mpi") as verl's manager would: init_process_group, then per update the
actor side's update_weights and the rollout side's receive_weights;
every received tensor is checked element by element against values from
global coordinates.

Real verl: FSDPEngine.get_per_tensor_param (full_tensor() of every
DTensor: the gather) and FSDPEngine.get_per_tensor_param_shard (the local
shards with their ShardSpecs), ActorRolloutRefWorker.update_weights as
verl ships it and as reshard.integrations.verl.PATCH changes it (the
patch applied with patch(1) to a copy of verl's engine_workers.py,
loaded as its own module).

STAND-INS, and why:
  - the FSDPEngine is verl's class without its __init__ (which builds the
    model, optimizer and device state on a GPU): object.__new__ with the
    attributes its two export methods read (module: the FSDP2 model;
    model_config: lora and hf_config; offload flags off).
  - update_weights' self is a namespace with config.rollout.
    checkpoint_engine.backend, checkpoint_engine and actor.engine, the
    attributes that method reads (ActorRolloutRefWorker's __init__ needs
    verl's full worker setup; verl_world.py runs that one).
  - verl_cpu_platform: a host accelerator platform (see that module);
    transformer_impl's get_device_id answers "cpu" (the platform's index
    0 is cuda:0 to torch's .to()).

Cases (each two updates, the trainer's shards changing in between):
  full        source "full", verl unpatched: the gather, then reshard
  fsdp        source "fsdp", verl patched: the local shards only
  hsdp        source "fsdp", fsdp_size 2 (HSDP), verl patched
Refusals (actor ranks; nothing moves): source "fsdp" under unpatched
verl (full tensors refused, naming the patch); a plan for HSDP against
an FSDP model (the tensor, rank and both placements named).

Bytes per actor rank: the gather's (what full_tensor() brings in: the
full tensor less the local shard, counted by wrapping DTensor.full_tensor)
and reshard's (the plans' send_bytes), printed as "bytes ..." lines; the
fsdp cases must make no full_tensor() call at all.

The last line is "N passed, M failed". Every wait has a deadline
(reshard's timeout_ms; a watchdog ends the job).
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import types

# the FSDP world's helpers (same folder): its watchdog, values from global
# coordinates and tally, and its model with tied embeddings
from fsdp_world import CONFIG as FSDP_CONFIG
from fsdp_world import Tally, values, watchdog

DEADLINE_S = 600
CONFIG = dict(FSDP_CONFIG, tie_word_embeddings=True)


def build(T, fsdp_size):
    """transformers' model, fp32 as verl's FSDP actor keeps it, sharded
    by fully_shard over verl's mesh for fsdp_size."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.workers.engine.fsdp.utils import create_device_mesh
    cfg = LlamaConfig(**{k: v for k, v in CONFIG.items()
                         if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    mesh = create_device_mesh(world_size=T, fsdp_size=fsdp_size)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(model, step):
    """Every local shard takes the step's values (from global
    coordinates): what an optimizer step does to FSDP2's shards."""
    import torch
    import reshard
    L = reshard.Layout.from_module(model)
    local = reshard.dtensor.local_tensors(model)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    rank = torch.distributed.get_rank()
    with torch.no_grad():
        for f in L.fragments(rank):
            box = tuple(slice(lo, hi) for lo, hi in f.box)
            local[f.name].copy_(values(f.name, shapes[f.name], step)[box]
                                .reshape(local[f.name].shape))


def verl_engine(model):
    """verl's FSDPEngine (STAND-IN for its __init__, see the docstring)."""
    import verl.workers.engine.fsdp.transformer_impl as impl
    # verl's device index on the host platform is 0, which torch reads as
    # cuda:0: the export methods' .to(device) gets the host instead
    impl.get_device_id = lambda: "cpu"
    e = object.__new__(impl.FSDPEngine)
    e.module = model
    e.model_config = types.SimpleNamespace(lora={}, hf_config=model.config)
    e._is_offload_param = False
    e._uses_fsdp2_cpu_offload_policy = False
    e._qat_enabled = False
    return e


def worker_module(patched):
    """verl's engine_workers module, as shipped or with reshard's patch
    applied (patch(1) on a copy, loaded under its own name)."""
    import importlib.util
    import verl.workers.engine_workers as ew
    if not patched:
        return ew
    import reshard.integrations.verl as rverl
    d = tempfile.mkdtemp(prefix="reshard_verl_patch_")
    os.makedirs(os.path.join(d, "verl", "workers"))
    copy = os.path.join(d, "verl", "workers", "engine_workers.py")
    with open(ew.__file__) as src, open(copy, "w") as dst:
        dst.write(src.read())
    with open(rverl.PATCH) as fh:
        r = subprocess.run(["patch", "-p1", "-d", d], stdin=fh,
                           capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise RuntimeError("the patch does not apply to verl: " + r.stdout + r.stderr)
    spec = importlib.util.spec_from_file_location("engine_workers_patched", copy)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class GatherCount:
    """Counts DTensor.full_tensor() calls and the bytes they bring in."""
    def __enter__(self):
        from torch.distributed.tensor import DTensor
        self.cls, self.orig = DTensor, DTensor.full_tensor
        self.calls, self.bytes = 0, 0
        me = self

        def counted(t, *a, **k):
            out = me.orig(t, *a, **k)
            me.calls += 1
            me.bytes += (out.numel() - t.to_local().numel()) * out.element_size()
            return out
        DTensor.full_tensor = counted
        return self

    def __exit__(self, *exc):
        self.cls.full_tensor = self.orig


def update(ew, engine, ckpt, backend):
    """verl's ActorRolloutRefWorker.update_weights (STAND-IN self)."""
    me = types.SimpleNamespace(
        config=types.SimpleNamespace(rollout=types.SimpleNamespace(
            checkpoint_engine=types.SimpleNamespace(backend=backend))),
        checkpoint_engine=ckpt, actor=types.SimpleNamespace(engine=engine))
    return asyncio.run(ew.ActorRolloutRefWorker.update_weights(me, global_steps=1))


def receive(ckpt):
    out = {}

    async def consume():
        async for name, t in ckpt.receive_weights(global_steps=1):
            out[name] = t.clone()
    asyncio.run(consume())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainers", type=int, default=4)
    ap.add_argument("--port", type=int, default=29750)
    args = ap.parse_args()
    watchdog(DEADLINE_S)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size, T = comm.Get_rank(), comm.Get_size(), args.trainers
    if T < 4 or T % 2 or size <= T:
        print("FAIL verl_fsdp_world.py: T >= 4 even trainers and rollout "
              "ranks after them; got %d ranks, T %d" % (size, T), flush=True)
        sys.exit(2)
    import torch
    import torch.distributed as dist
    import reshard
    from reshard.integrations.verl import ReshardCheckpointEngine
    tally = Tally(rank)
    trainer = rank < T
    if trainer:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=T)
    cfg_dir = comm.bcast(tempfile.mkdtemp(prefix="reshard_vfsdp_")
                         if rank == 0 else None, root=0)
    cfg_path = os.path.join(cfg_dir, "config.json")
    if rank == 0:
        with open(cfg_path, "w") as fh:
            json.dump(CONFIG, fh)
    comm.Barrier()
    shapes = {t.name: t.shape for t in
              reshard.models.Model(cfg_path, per_expert=True).tensors()}

    def engine(source, fsdp_size):
        # buckets of 16 KiB: several plans, as verl's buckets make them
        e = ReshardCheckpointEngine(
            bucket_size=16 << 10, model_config_path=cfg_path, transport="mpi",
            is_master=rank == 0, source=source, fsdp_size=fsdp_size,
            timeout_ms=60000)
        e.init_process_group(rank=rank, world_size=size, num_senders=T)
        return e

    sent = {}
    try:
        for case, source, fsdp_size, patched in (
                ("full", "full", -1, False), ("fsdp", "fsdp", -1, True),
                ("hsdp", "fsdp", 2, True)):
            ckpt = engine(source, fsdp_size)
            model = build(T, fsdp_size) if trainer else None
            ew = worker_module(patched) if trainer else None
            gathered = calls = 0
            for step in (1, 2):
                if trainer:
                    train(model, step)
                    with GatherCount() as g:
                        update(ew, verl_engine(model), ckpt, "reshard")
                    gathered += g.bytes
                    calls += g.calls
                    continue
                got = receive(ckpt)
                tally.check(sorted(got) == sorted(shapes),
                            "%s step %d: received %s" % (case, step, sorted(
                                set(got) ^ set(shapes))))
                wrong = sum(int((got[n].view(torch.int16) != values(
                    n, shapes[n], step).view(torch.int16)).sum())
                    for n in got if n in shapes)
                tally.check(wrong == 0, "%s step %d: %d wrong elements"
                            % (case, step, wrong))
            if trainer:
                sent[case] = (gathered // 2, sum(p.stats().send_bytes
                                                 for p in ckpt.plans) // 2)
                tally.check((calls > 0) == (case == "full"),
                            "%s: %d full_tensor() calls" % (case, calls))
            ckpt.close()

        # refusals: nothing moves (the actor raises before any execute; the
        # rollout ranks only build the plans)
        for case, fsdp_size, patched, match in (
                ("unpatched", -1, False, "reshard.integrations.verl.PATCH"),
                ("mismatch", 2, True, "model.embed_tokens.weight")):
            ckpt = engine("fsdp", fsdp_size)
            if trainer:
                model = build(T, -1)
                try:
                    update(worker_module(patched), verl_engine(model), ckpt,
                           "reshard")
                    tally.check(False, "%s: accepted" % case)
                except reshard.InvalidArgumentError as e:
                    msg = str(e)
                    tally.check(match in msg and "rank %d" % rank in msg,
                                "%s: message %r" % (case, msg))
            ckpt.close()
    except Exception:
        import traceback
        traceback.print_exc()
        tally.check(False, "exception")
        sys.stdout.flush()
        comm.Abort(1)
    per_rank = comm.gather(sent, root=0)
    if rank == 0:
        for case in ("full", "fsdp", "hsdp"):
            g = [p[case][0] for p in per_rank[:T]]
            s = [p[case][1] for p in per_rank[:T]]
            print("bytes %s: per actor rank and update, gathered %s, sent by "
                  "reshard %s" % (case, g, s), flush=True)
    ok = comm.reduce(tally.ok, root=0)
    bad = comm.reduce(tally.bad, root=0)
    if rank == 0:
        print("%d passed, %d failed" % (ok, bad), flush=True)
    if trainer:
        dist.destroy_process_group()
    sys.exit(1 if rank == 0 and bad else 0)


if __name__ == "__main__":
    main()
