"""Shared helpers of the Python tests: ranks as threads, values from global
coordinates, and a deadline on everything (no test can hang)."""
import os
import sys
import threading

import numpy as np
import pytest

import reshard

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEADLINE_S = 120


def run_ranks(n, fn, *args):
    """Runs fn(rank, comm, *args) on n threads of one InprocWorld; returns
    the results by rank; re-raises the first exception (by rank). A thread
    still running past DEADLINE_S fails the test instead of hanging it."""
    world = reshard.InprocWorld(n)
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(r, world.comm(r), *args)
        except BaseException as e:  # reported below, by rank
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True)
               for r in range(n)]
    for t in threads:
        t.start()
    for r, t in enumerate(threads):
        t.join(DEADLINE_S)
        if t.is_alive():
            pytest.fail("rank %d still running after %d s" % (r, DEADLINE_S))
    world.close()
    for e in errors:
        if e is not None:
            raise e
    return results


def values(tensor_seed, linear, esize):
    """Element bytes of a tensor from its global row-major indices: an
    independent expectation (no reshard code), as uint8 [n, esize]."""
    x = (linear.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
         + np.uint64((tensor_seed * 0xBF58476D1CE4E5B9) % (1 << 64)))
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(29)
    return x.view(np.uint8).reshape(-1, 8)[:, :esize]


def chunk_box(shape, mesh_shape, coord, placements):
    """The box a rank at ``coord`` of a mesh holds under DTensor-style
    placements (torch.chunk pieces of ceil(n/k), later axes splitting the
    earlier one's piece), computed here, independently of reshard."""
    box = [[0, s] for s in shape]
    for axis, p in enumerate(placements):
        if isinstance(p, reshard.Replicate):
            continue
        lo, hi = box[p.dim]
        n, k, i = hi - lo, mesh_shape[axis], coord[axis]
        if p.sizes is not None:
            start = sum(p.sizes[:i])
            box[p.dim] = [lo + start, lo + start + p.sizes[i]]
        else:
            c = -(-n // k) if n else 0
            box[p.dim] = [lo + min(i * c, n), lo + min((i + 1) * c, n)]
    return [tuple(b) for b in box]


def box_linear(shape, box):
    """Global row-major indices of a box's elements, in the box's own
    row-major order."""
    grids = np.meshgrid(*[np.arange(lo, hi, dtype=np.int64) for lo, hi in box],
                        indexing="ij")
    if not grids:
        return np.zeros(1, dtype=np.int64)
    return np.ravel_multi_index([g.ravel() for g in grids], shape).astype(np.int64)


@pytest.fixture
def seed(request):
    """A seed per test, printed on failure (RS_PY_SEED replays one)."""
    s = int(os.environ.get("RS_PY_SEED", np.random.SeedSequence().entropy % (1 << 31)))
    request.node.user_properties.append(("seed", s))
    sys.stdout.write("seed %d (RS_PY_SEED=%d replays it)\n" % (s, s))
    return s
