"""fsdp_weight_sync.py: the weight sync of an RL loop whose trainer is
PyTorch FSDP2, on MPI ranks: no gather on the trainer.

Trainer ranks build transformers' model for a config, shard it with
torch's fully_shard (gloo here; NCCL on GPUs), and describe it with
reshard.Layout.from_module. Inference ranks hold the vLLM layout of the
same config (reshard.models.vllm_layout: fused qkv_proj and gate_up_proj,
padded vocabulary) and build the trainer's layout from the description
rank 0 broadcasts. One plan; each step the trainers set their local
shards (FSDP2's own tensors) from global coordinates, the plan moves them,
and every inference rank checks every element it holds and that the
padding around them was left alone.

    mpirun -np 6 python examples/python/fsdp_weight_sync.py \\
        --model-config configs/Qwen2.5-0.5B.json --layers 2 \\
        --train-ranks 4 --infer tp=2 --steps 3

Trainer ranks come first in MPI_COMM_WORLD. It never hangs: reshard's
calls end at their deadline and raise, any exception ends the job (MPI
Abort), and a watchdog ends it past --deadline seconds.
"""
import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

SENTINEL = 0xA5


def values(name, shape, box, step):
    """The values of the window ``box`` of a parameter of global ``shape``,
    from global coordinates alone (exact in bf16): computed for the window
    only, so a rank's work is proportional to what it holds."""
    import torch
    seed = sum(map(ord, name)) * 31 + step * 7
    gstride = np.cumprod((list(shape[1:]) + [1])[::-1])[::-1]
    lin = np.zeros([hi - lo for lo, hi in box], np.int64)
    for d, (lo, hi) in enumerate(box):
        ax = [1] * len(box)
        ax[d] = hi - lo
        lin = lin + (np.arange(lo, hi, dtype=np.int64) * gstride[d]).reshape(ax)
    v = torch.from_numpy((lin * 13 + seed) % 251 - 125)
    return (v.to(torch.float32) / 32).to(torch.bfloat16)


def elements(f):
    """Element indices of fragment f in its (bf16) buffer, box order."""
    idx = np.meshgrid(*[np.arange(hi - lo) for lo, hi in f.box], indexing="ij")
    return sum(i.ravel() * s for i, s in zip(idx, f.strides)) + f.offset // 2


def build(config_path, layers, ntrain):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM
    with open(config_path) as fh:
        raw = json.load(fh)
    cfg = AutoConfig.for_model(raw["model_type"], **{
        k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    if layers:
        cfg.num_hidden_layers = layers
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    mesh = init_device_mesh("cpu", (ntrain,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default="configs/Qwen2.5-0.5B.json")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--train-ranks", type=int, default=4)
    ap.add_argument("--infer", default="tp=2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--port", type=int, default=29900)
    ap.add_argument("--deadline", type=int, default=600)
    a = ap.parse_args()

    def watchdog():
        time.sleep(a.deadline)
        print("watchdog: past %d s, ending the job" % a.deadline, flush=True)
        os._exit(3)
    threading.Thread(target=watchdog, daemon=True).start()

    from mpi4py import MPI
    import torch
    import reshard
    comm = MPI.COMM_WORLD
    rank, size, T = comm.Get_rank(), comm.Get_size(), a.train_ranks
    if size != T + reshard.models.ranks(a.infer):
        sys.exit("run on %d + %d ranks" % (T, reshard.models.ranks(a.infer)))
    trainer = rank < T
    try:
        model = None
        if trainer:
            import torch.distributed as dist
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
            dist.init_process_group("gloo", rank=rank, world_size=T)
            model = build(a.model_config, a.layers, T)
        specs = comm.bcast(reshard.dtensor.describe(model) if rank == 0
                           else None, root=0)
        src = (reshard.Layout.from_module(model) if trainer
               else reshard.dtensor.layout(specs))
        dst = reshard.models.vllm_layout(a.model_config, a.infer, first_rank=T,
                                         layers=a.layers or None)
        shape = {s.name: s.shape for s in specs}
        bufs = {n: np.full(dst.buffer_bytes(b, rank), SENTINEL, np.uint8)
                for n, b in dst.buffers(rank).items()}
        with reshard.Plan(reshard.Comm.mpi(comm), src, dst) as plan:
            for step in range(1, a.steps + 1):
                if trainer:  # "train": FSDP2's local shards change in place
                    local = reshard.dtensor.local_tensors(model)
                    with torch.no_grad():
                        for f in src.fragments(rank):
                            local[f.name].view(-1)[torch.from_numpy(elements(f))] = \
                                values(f.name, shape[f.name], f.box, step).reshape(-1)
                comm.Barrier()  # time the sync, not the "training" before it
                t0 = time.perf_counter()
                plan.execute(reshard.dtensor.local_tensors(model) if trainer
                             else None, bufs, version=step)
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                wrong = 0
                if not trainer:
                    inside = {n: np.zeros(b.size // 2, bool) for n, b in bufs.items()}
                    for f in dst.fragments(rank):
                        n, pos = dst.buffer_name(f.buffer), elements(f)
                        want = values(f.name, shape[f.name], f.box, step)
                        got = bufs[n].view(np.int16)[pos]
                        wrong += int(np.count_nonzero(
                            got != want.contiguous().view(torch.int16).numpy().ravel()))
                        inside[n][pos] = True
                    for n, b in bufs.items():
                        wrong += int(np.count_nonzero(b[np.repeat(~inside[n], 2)] != SENTINEL))
                wrong = comm.allreduce(wrong)
                if rank == 0:
                    print("step %d: %.1f ms, %d wrong" % (step, dt * 1e3, wrong),
                          flush=True)
                if wrong:
                    raise RuntimeError("step %d: %d wrong elements or bytes"
                                       % (step, wrong))
        if rank == 0:
            print("fsdp_weight_sync: OK (%d FSDP2 ranks -> vLLM %s, %d steps, "
                  "every element checked)" % (T, a.infer, a.steps), flush=True)
    except Exception:
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        comm.Abort(1)
    if trainer:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
