"""rl_weight_sync.py: the weight sync of an RL post-training loop from
Python, on MPI ranks (the same job as examples/rl_weight_sync.c).

Trainer ranks hold a model in Megatron layout, inference ranks want it in
vLLM layout; the geometry comes from a HuggingFace config.json. One plan
is created; each step the trainers "train" (every weight changes with the
step), the plan runs on numpy buffers bound once, and every inference
rank checks every element it holds and that the padding around them was
left alone.

    mpirun -np 8 python examples/python/rl_weight_sync.py \\
        --model-config configs/Qwen2.5-0.5B.json --layers 4 \\
        --train tp=2,pp=2 --infer tp=2,dp=2 --steps 5

Trainer ranks come first in MPI_COMM_WORLD, then inference ranks. It never
hangs: reshard's calls end at their deadline and raise, any exception
ends the job (MPI Abort), and the example's own MPI calls run under a
watchdog that aborts the job if one of them outlives RESHARD_TIMEOUT_MS
(default 60 s) + 5 s.
"""
import argparse
import os
import sys
import threading
import time

# numpy's OpenBLAS starts a thread per core in every rank, and they spin
# for a while: with several ranks per node they steal cores from the
# sync (measured: Python 1.11-1.16 x the C example's step time with them,
# 1.00 x without; docs/PERFORMANCE.md). Nothing here uses BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import mpi4py

# MPI_THREAD_FUNNELED, as the C example's MPI_Init: only the main thread
# calls MPI (mpi4py's default, MPI_THREAD_MULTIPLE, puts a lock around
# every MPI call of reshard's transport). The watchdog's Abort is the one
# exception, and only when the job is being killed anyway.
mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI  # noqa: E402

import reshard


class Watchdog:
    """Aborts the job when a guarded MPI call outlives the deadline."""

    def __init__(self, comm, seconds):
        self.comm, self.seconds = comm, seconds
        self.what, self.since = None, 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while True:
            time.sleep(0.5)
            with self.lock:
                late = self.what is not None and time.monotonic() - self.since > self.seconds
                what = self.what
            if late:
                sys.stderr.write("rank %d: %s did not return within %.0f s; "
                                 "aborting\n" % (self.comm.rank, what, self.seconds))
                sys.stderr.flush()
                self.comm.Abort(3)

    def __call__(self, what):
        self._next = what
        return self

    def __enter__(self):
        with self.lock:
            self.what, self.since = self._next, time.monotonic()

    def __exit__(self, *exc):
        with self.lock:
            self.what = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-config", default="configs/Qwen2.5-0.5B.json")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--train", default="tp=2,pp=2")
    ap.add_argument("--infer", default="tp=2,dp=2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--staging-mib", type=int, default=64)
    a = ap.parse_args()

    world = MPI.COMM_WORLD
    rank, nranks = world.rank, world.size
    wd = Watchdog(world, int(os.environ.get("RESHARD_TIMEOUT_MS", "60000")) / 1e3 + 5)

    # Every rank builds both layouts from the same config: the global
    # description (the plan checks by digest that all ranks agree).
    model = reshard.models.Model(a.model_config, layers=a.layers, dtype="bf16")
    ntrain, ninfer = reshard.models.ranks(a.train), reshard.models.ranks(a.infer)
    if ntrain + ninfer != nranks:
        if rank == 0:
            sys.stderr.write("rl_weight_sync.py: --train needs %d ranks and "
                             "--infer %d: run with mpirun -np %d\n"
                             % (ntrain, ninfer, ntrain + ninfer))
        world.Abort(2)
    src = reshard.models.megatron_layout(model, a.train, first_rank=0)
    dst = reshard.models.vllm_layout(model, a.infer, first_rank=ntrain)

    with wd("reshard.Comm.mpi (MPI_Comm_dup)"):
        comm = reshard.Comm.mpi(world)
    with wd("MPI barrier"):
        world.Barrier()
    t0 = time.perf_counter()
    plan = reshard.Plan(comm, src, dst, staging_bytes=a.staging_mib << 20)
    plan_s = time.perf_counter() - t0
    with wd("MPI reduce"):
        plan_max = world.reduce(plan_s, op=MPI.MAX, root=0)

    # This rank's weights (trainer) or inference buffers: numpy arrays
    # over reshard's self-test memory (values from global coordinates,
    # sentinel bytes outside fragments), bound to the plan once by
    # parameter name.
    train = reshard.SelfTest(src, rank, -1)
    infer = reshard.SelfTest(dst, rank, -1)
    names_src = {src.buffer_name(b): arr for b, arr in train.arrays.items()}
    names_dst = {dst.buffer_name(b): arr for b, arr in infer.arrays.items()}
    bound = plan.bind(names_src, names_dst)
    mine = sum(int(np.prod(f.shape)) * 2 for f in dst.fragments(rank))
    with wd("MPI allreduce"):
        delivered = world.allreduce(mine)
    stats = plan.stats()
    with wd("MPI gather"):
        all_stats = world.gather(stats, root=0)
    if rank == 0:
        print("# rl_weight_sync.py: %s (%s), %d layers, %.1f M parameters, "
              "%d tensors, bf16" % (a.model_config, model.arch, model.layers,
                                    model.num_params / 1e6, len(model.tensors())))
        print("# trainer megatron %s on ranks 0-%d -> inference vllm %s on "
              "ranks %d-%d, MPI, from Python" % (a.train, ntrain - 1, a.infer,
                                                 ntrain, nranks - 1))
        print("# plan created in %.1f ms (slowest rank)" % (1e3 * plan_max))
        print("#  rank  side    send_MiB  recv_MiB  local_MiB  rounds")
        for i, s in enumerate(all_stats):
            print("   %4d  %-6s %9.2f %9.2f %10.2f %7d" % (
                i, "train" if i < ntrain else "infer", s.send_bytes / 2**20,
                s.recv_bytes / 2**20, s.local_copy_bytes / 2**20, s.num_chunks))
        print("#  step   delivered_MiB   sync_ms   algbw_GB/s   wrong")

    total_wrong = 0
    for step in range(a.steps):
        train.fill(step)  # the optimizer step
        with wd("MPI barrier"):
            world.Barrier()
        s0 = time.perf_counter()
        plan.execute(bound, version=step + 1)
        s = time.perf_counter() - s0
        bad = infer.check(step, "rl_weight_sync.py")
        with wd("MPI reduce"):
            smax = world.reduce(s, op=MPI.MAX, root=0)
        with wd("MPI allreduce"):
            wrong = world.allreduce(bad)
        total_wrong += wrong
        if rank == 0:
            print("   %4d   %13.2f   %7.2f   %10.2f   %5d" % (
                step, delivered / 2**20, 1e3 * smax, delivered / smax / 1e9,
                wrong), flush=True)
    if rank == 0:
        print("# rl_weight_sync.py: %s (%d steps; every destination element "
              "and padding byte checked)" % ("FAILED" if total_wrong else "OK",
                                             a.steps))
    plan.close()
    comm.close()
    train.close()
    infer.close()
    return 1 if total_wrong else 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException as e:  # any failure ends the whole job, never a hang
        if isinstance(e, SystemExit) and not e.code:
            raise
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.exit(code)
