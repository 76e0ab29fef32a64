"""FSDP2 -> vLLM against Megatron -> vLLM, the same bytes, alternated in
one MPI job (issue 41's target: within 1.2 x).

    mpirun -np 8 python bench/python/fsdp_vs_megatron.py \\
        --model-config configs/Qwen2.5-0.5B.json --train-ranks 4 \\
        --megatron tp=2,pp=2 --infer tp=2,dp=2 --rounds 6

Ranks 0 .. T-1 are trainers, the rest inference ranks (vLLM layout). Two
plans share the destination layout and buffers:

  fsdp      transformers' model for the config (random weights), sharded
            by torch's fully_shard over the T trainer ranks (gloo), source
            layout reshard.Layout.from_module, source buffers FSDP2's own
            local shards (reshard.dtensor.local_tensors: no gather);
  megatron  reshard.models.megatron_layout of the same config, numpy
            source buffers of the same dtype (the C example's layouts).

Each round executes both (order alternating), timed as the slowest rank's
execute (MPI max after a barrier); the first round is left out. Prints
the median of each and their ratio. Every wait has a deadline: reshard's
own, and a watchdog that ends the job past --deadline seconds.
"""
import argparse
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def watchdog(seconds):
    def kill():
        time.sleep(seconds)
        print("watchdog: the job ran past %d s" % seconds, flush=True)
        os._exit(3)
    threading.Thread(target=kill, daemon=True).start()


def fsdp_model(config_path, layers, T):
    import json
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM
    with open(config_path) as fh:
        raw = json.load(fh)
    cfg = AutoConfig.for_model(raw["model_type"], **{
        k: v for k, v in raw.items() if k not in ("model_type",
                                                  "architectures")})
    if layers:
        cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    mesh = init_device_mesh("cpu", (T,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default="configs/Qwen2.5-0.5B.json")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--train-ranks", type=int, default=4)
    ap.add_argument("--megatron", default="tp=2,pp=2")
    ap.add_argument("--infer", default="tp=2,dp=2")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--port", type=int, default=29800)
    ap.add_argument("--deadline", type=int, default=900)
    a = ap.parse_args()
    watchdog(a.deadline)
    from mpi4py import MPI
    import reshard
    comm = MPI.COMM_WORLD
    rank, size, T = comm.Get_rank(), comm.Get_size(), a.train_ranks
    layers = a.layers or None
    if reshard.models.ranks(a.megatron) != T or \
            reshard.models.ranks(a.infer) != size - T:
        sys.exit("ranks: %d trainers (megatron %s), %d inference (%s), "
                 "%d in the job" % (T, a.megatron, size - T, a.infer, size))
    trainer = rank < T
    model = None
    if trainer:
        import torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
        dist.init_process_group("gloo", rank=rank, world_size=T)
        model = fsdp_model(a.model_config, a.layers, T)
    specs = comm.bcast(reshard.dtensor.describe(model) if rank == 0 else None,
                       root=0)
    fsrc = (reshard.Layout.from_module(model) if trainer
            else reshard.dtensor.layout(specs))
    msrc = reshard.models.megatron_layout(a.model_config, a.megatron,
                                          layers=layers)
    dst = reshard.models.vllm_layout(a.model_config, a.infer, first_rank=T,
                                     layers=layers)
    dbufs = {n: np.zeros(dst.buffer_bytes(b, rank), np.uint8)
             for n, b in dst.buffers(rank).items()}
    mbufs = {n: np.ones(msrc.buffer_bytes(b, rank), np.uint8)
             for n, b in msrc.buffers(rank).items()}
    c = reshard.Comm.mpi(comm)
    times = {"fsdp": [], "megatron": []}
    with reshard.Plan(c, fsrc, dst) as pf, reshard.Plan(c, msrc, dst) as pm:
        bf = pf.bind(reshard.dtensor.local_tensors(model) if trainer else None,
                     dbufs)
        bm = pm.bind(mbufs, dbufs)
        nbytes = comm.allreduce(sum(b.size for b in dbufs.values()))
        for r in range(a.rounds + 1):
            order = [("fsdp", pf, bf), ("megatron", pm, bm)]
            if r % 2:
                order.reverse()
            for name, plan, bound in order:
                comm.Barrier()
                t0 = time.perf_counter()
                plan.execute(bound, version=r + 1)
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if r:
                    times[name].append(dt)
    if rank == 0:
        f, m = (statistics.median(times[k]) for k in ("fsdp", "megatron"))
        print("config %s layers %s: %d trainer ranks (FSDP2 / Megatron %s) "
              "-> %d vLLM ranks (%s), %.1f MB delivered per sync"
              % (a.model_config, a.layers or "all", T, a.megatron, size - T,
                 a.infer, nbytes / 1e6))
        print("fsdp     median %.1f ms  (%s)" % (
            f * 1e3, " ".join("%.1f" % (x * 1e3) for x in times["fsdp"])))
        print("megatron median %.1f ms  (%s)" % (
            m * 1e3, " ".join("%.1f" % (x * 1e3) for x in times["megatron"])))
        print("ratio fsdp / megatron: %.3f" % (f / m))
    if trainer:
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
