"""Random layouts over MPI ranks (reshard.Comm.mpi), run by test_mpi.py:
    mpirun -np N python tests/python/mpi_random_layouts.py SEED CASES
Every destination byte and every byte outside fragments checked, as in
test_random_layouts.py (the same cases, with processes as ranks). Any
failure aborts the job naming the case's seed."""
import os
import sys
import traceback

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reshard  # noqa: E402
from test_random_layouts import make_case  # noqa: E402

world = MPI.COMM_WORLD
seed, cases = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(seed)
case_seed = None
try:
    with reshard.Comm.mpi(world) as comm:
        for _ in range(cases):
            case_seed = int(rng.integers(1 << 31))
            make_case(case_seed, world.size)(world.rank, comm)
except BaseException:
    traceback.print_exc()
    sys.stderr.write("rank %d: FAILED at case seed %s (run seed %d)\n"
                     % (world.rank, case_seed, seed))
    sys.stderr.flush()
    world.Abort(1)
if world.rank == 0:
    print("mpi_random_layouts: OK (%d cases, %d ranks, seed %d)"
          % (cases, world.size, seed))
