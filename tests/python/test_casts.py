"""A tensor declared with another float dtype on each side converts in
flight (issue 19): checked against numpy's own casts (astype, to nearest,
ties to even), an expectation written apart from reshard's, through the
Python API on in-process ranks. Source values include ties, overflow,
subnormals, infinities and NaN."""
import numpy as np
import pytest

import reshard
from conftest import run_ranks

SHAPE = (24, 16)


def source_values(dtype):
    """The global tensor: random values at every magnitude the pair can
    meet, with the hard cases planted (f16's largest finite, its overflow
    tie, its subnormals, exact ties, infinities, NaN, signed zeros)."""
    rng = np.random.default_rng(19)
    x = (rng.standard_normal(SHAPE) * np.exp2(rng.integers(-30, 20, SHAPE))).astype(np.float64)
    special = [65504.0, 65520.0, 65519.0, 7e4, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 1.0 + 2.0 ** -11,
               1.0 + 3 * 2.0 ** -11, np.inf, -np.inf, np.nan, -0.0, 0.0, -65520.0, 2.0 ** -14]
    flat = x.reshape(-1)
    flat[:len(special)] = special
    with np.errstate(over="ignore"):  # 7e4 overflows f16: on purpose
        return flat.reshape(SHAPE).astype(dtype)


def run(src_dtype, dst_dtype):
    """Rows sharded over ranks 0 and 1 (src_dtype) -> columns sharded over
    ranks 2 and 3 (dst_dtype); returns what each destination rank got."""
    g = source_values(src_dtype)

    def rank_fn(rank, comm):
        src, dst = reshard.Layout(), reshard.Layout()
        w = src.add_tensor("w", np.dtype(src_dtype), SHAPE)
        src.place(w, src.add_mesh(2, start=0), [reshard.Shard(0)])
        w = dst.add_tensor("w", np.dtype(dst_dtype), SHAPE)
        dst.place(w, dst.add_mesh(2, start=2), [reshard.Shard(1)])
        mine = {}
        if rank < 2:
            mine = {n: np.ascontiguousarray(g[12 * rank:12 * (rank + 1)]).reshape(-1)
                    for n in src.buffers(rank)}
        theirs = {n: np.zeros(dst.buffer_bytes(b, rank) // np.dtype(dst_dtype).itemsize, dst_dtype)
                  for n, b in dst.buffers(rank).items()}
        with reshard.Plan(comm, src, dst, timeout_ms=30000) as plan:
            plan.execute(mine, theirs)
            stats = plan.stats()
        return theirs, stats

    return g, run_ranks(4, rank_fn)


@pytest.mark.parametrize("src_dtype,dst_dtype", [("float32", "float16"), ("float16", "float32")])
def test_cast_matches_numpy(src_dtype, dst_dtype):
    g, results = run(src_dtype, dst_dtype)
    with np.errstate(over="ignore"):
        want = g.astype(dst_dtype)  # numpy: to nearest, ties to even, overflow to inf
    for rank in (2, 3):
        theirs, _ = results[rank]
        (got,) = theirs.values()
        got = got.reshape(SHAPE[0], SHAPE[1] // 2)
        w = want[:, 8 * (rank - 2):8 * (rank - 1)]
        same = (got.view(np.uint16 if got.itemsize == 2 else np.uint32)
                == w.view(np.uint16 if w.itemsize == 2 else np.uint32)) | (np.isnan(got) & np.isnan(w))
        assert same.all(), "rank %d: %d of %d elements differ, first %s -> %r, want %r" % (
            rank, (~same).sum(), same.size, g[:, 8 * (rank - 2):][~same][0], got[~same][0], w[~same][0])
    # the wire carries f16 either way: 2 bytes per element, each source
    # rank's half-rows to both destination ranks
    for rank in (0, 1):
        assert results[rank][1].send_bytes == 12 * 16 * 2


def test_integer_dtypes_do_not_convert():
    def rank_fn(rank, comm):
        src, dst = reshard.Layout(), reshard.Layout()
        src.place(src.add_tensor("w", "i32", (4,)), src.add_mesh(1, start=0), [reshard.Replicate()])
        dst.place(dst.add_tensor("w", "f32", (4,)), dst.add_mesh(1, start=1), [reshard.Replicate()])
        with pytest.raises(reshard.InvalidArgumentError, match="tensor 'w'.*i32.*f32"):
            reshard.Plan(comm, src, dst, timeout_ms=30000)
        return True

    assert run_ranks(2, rank_fn) == [True, True]
