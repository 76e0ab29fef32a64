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


def run_threads(fns):
    """Runs the callables concurrently, one thread each; returns their
    results in order and re-raises the first exception (in order). A
    thread still running past DEADLINE_S fails the test instead of
    hanging it."""
    results, errors = [None] * len(fns), [None] * len(fns)

    def body(i):
        try:
            results[i] = fns[i]()
        except BaseException as e:  # reported below, in order
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True)
               for i in range(len(fns))]
    for t in threads:
        t.start()
    for i, t in enumerate(threads):
        t.join(DEADLINE_S)
        if t.is_alive():
            pytest.fail("thread %d (rank %d of run_ranks) still running "
                        "after %d s" % (i, i, DEADLINE_S))
    for e in errors:
        if e is not None:
            raise e
    return results


def run_ranks(n, fn, *args):
    """Runs fn(rank, comm, *args) on n threads of one InprocWorld; returns
    the results by rank (run_threads: first exception re-raised, a
    deadline on each thread)."""
    world = reshard.InprocWorld(n)
    try:
        results = run_threads([lambda r=r: fn(r, world.comm(r), *args)
                               for r in range(n)])
    except pytest.fail.Exception:
        raise  # a thread is still inside the world: leave it be
    except BaseException:
        world.close()
        raise
    world.close()
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
