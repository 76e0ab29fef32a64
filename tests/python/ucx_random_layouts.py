"""Random layouts over UCX processes (reshard.Comm.ucx), launched without
mpirun by test_ucx.py:
    python tests/python/ucx_random_layouts.py HOST:PORT RANK SIZE SEED CASES [register]
The cases of test_random_layouts.py (every destination byte and every byte
outside fragments checked) with processes as ranks; with "register", each
plan's buffers registered (plan.register_buffers: one-sided reads). A failure exits 1
naming the case's seed (its partners then fail at their deadline)."""
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reshard  # noqa: E402
from test_random_layouts import make_case  # noqa: E402

rendezvous, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seed, cases = int(sys.argv[4]), int(sys.argv[5])
register = sys.argv[6:] == ["register"]
rng = np.random.default_rng(seed)
case_seed = None
try:
    with reshard.Comm.ucx(rendezvous, rank, size, timeout_ms=30000) as comm:
        for _ in range(cases):
            case_seed = int(rng.integers(1 << 31))
            make_case(case_seed, size, register)(rank, comm)
except BaseException:
    traceback.print_exc()
    sys.stderr.write("rank %d: FAILED at case seed %s (run seed %d)\n"
                     % (rank, case_seed, seed))
    sys.stderr.flush()
    sys.exit(1)
print("ucx_random_layouts: rank %d OK (%d cases, %d ranks, seed %d)"
      % (rank, cases, size, seed))
