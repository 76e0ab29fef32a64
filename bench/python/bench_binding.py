"""The Python binding's own cost per execute, for a plan of many buffers.

    python bench/python/bench_binding.py [--buffers 1000] [--iters 2000]

One rank (in-process), N tensors of 16 f32 each placed whole on both
sides, so the plan is N local copies of 64 bytes. In one process,
alternating, it times:
  c         the C call alone (reshard_plan_execute_sized through cffi, on
            the arrays a Bound holds: the floor any binding pays)
  bound     plan.execute(bound): what a training loop calls each step
  dicts     plan.execute(src_dict, dst_dict): binds and checks every
            buffer on every call
  bind      plan.bind(src_dict, dst_dict) alone (the buffer checks)
and prints medians; binding overhead = bound - c.
"""
import argparse
import statistics
import time

import numpy as np

import reshard
from reshard import _ffi as ffi, _lib as lib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--buffers", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    src, dst = reshard.Layout(), reshard.Layout()
    for L in (src, dst):
        m = L.add_mesh(1)
        for i in range(a.buffers):
            L.place(L.add_tensor("p%d" % i, "f32", (16,)), m, [reshard.Replicate()])
    world = reshard.InprocWorld(1)
    comm = world.comm(0)
    plan = reshard.Plan(comm, src, dst)
    sd = {"p%d" % i: np.full(16, i, np.float32) for i in range(a.buffers)}
    dd = {"p%d" % i: np.zeros(16, np.float32) for i in range(a.buffers)}
    bound = plan.bind(sd, dd)
    h = plan.handle

    def c_call():
        r = lib.reshard_plan_execute_sized(h, 0, bound._src, bound._nsrc,
                                           bound._dst, bound._ndst, ffi.NULL)
        assert r == 0

    cases = {"c": c_call, "bound": lambda: plan.execute(bound),
             "dicts": lambda: plan.execute(sd, dd),
             "bind": lambda: plan.bind(sd, dd)}
    iters = {"c": a.iters, "bound": a.iters, "dicts": max(a.iters // 20, 20),
             "bind": max(a.iters // 20, 20)}
    times = {k: [] for k in cases}
    for _ in range(5):  # rounds, alternating
        for k, fn in cases.items():
            fn()
            t0 = time.perf_counter()
            for _ in range(iters[k]):
                fn()
            times[k].append((time.perf_counter() - t0) / iters[k])
    med = {k: statistics.median(v) for k, v in times.items()}
    assert all((dd["p%d" % i] == i).all() for i in range(a.buffers))
    print("# bench_binding: %d buffers per side, 1 rank, %d local copies of "
          "64 B; medians of 5 alternating rounds" % (a.buffers, a.buffers))
    for k in cases:
        print("  %-6s %9.1f us" % (k, med[k] * 1e6))
    print("  binding overhead per execute (bound - c): %.1f us"
          % ((med["bound"] - med["c"]) * 1e6))
    plan.close()
    comm.close()
    world.close()


if __name__ == "__main__":
    main()
