"""Random layouts through in-process ranks (threads): every destination
byte checked against values computed from global coordinates, and every
byte outside destination fragments checked untouched. The seed is printed
on failure (RS_PY_SEED=<seed> replays it)."""
import numpy as np
import pytest

import reshard
from conftest import box_linear, chunk_box, run_ranks, values

DTYPES = ["f32", "bf16", "u8", "i64", "f16"]
SENTINEL = 0xA5
GAP = 8  # bytes before and after a raw buffer's fragment


def random_side(rng, nranks, tensors):
    """One side: per tensor a mesh over some ranks and placements, or (one
    tensor in four) a raw buffer on one rank holding the whole tensor
    between two gaps."""
    side = []
    for t, (shape, dtype) in enumerate(tensors):
        if rng.random() < 0.25:
            side.append(("raw", int(rng.integers(nranks))))
            continue
        k = int(rng.integers(1, nranks + 1))
        ranks = [int(r) for r in rng.permutation(nranks)[:k]]
        if k >= 4 and k % 2 == 0 and rng.random() < 0.5:
            mshape = (2, k // 2)
        else:
            mshape = (k,)
        pls, sharded = [], set()
        for axis in range(len(mshape)):
            if rng.random() < 0.3 or not shape:
                pls.append(reshard.Replicate())
                continue
            d = int(rng.integers(len(shape)))
            sizes = None
            if d not in sharded and rng.random() < 0.3:
                cuts = np.sort(rng.integers(0, shape[d] + 1, mshape[axis] - 1))
                sizes = list(np.diff(np.concatenate(([0], cuts, [shape[d]]))))
            sharded.add(d)
            pls.append(reshard.Shard(d, sizes=sizes))
        side.append(("mesh", ranks, mshape, pls))
    return side


def build(tensors, side):
    L = reshard.Layout()
    for t, (shape, dtype) in enumerate(tensors):
        L.add_tensor("t%d" % t, dtype, shape)
    for t, spec in enumerate(side):
        shape, dtype = tensors[t]
        if spec[0] == "raw":
            nbytes = int(np.prod(shape, dtype=np.int64)) * reshard.dtypes.size(
                reshard.dtypes.to_c(dtype))
            b = L.add_buffer("raw%d" % t, spec[1], GAP + nbytes + GAP)
            L.add_fragment(t, b, [0] * len(shape), shape, offset=GAP)
        else:
            _, ranks, mshape, pls = spec
            m = L.add_mesh(mshape, ranks=ranks)
            L.place(t, m, pls, name="p%d" % t)
    return L


def expected_pieces(tensors, side, rank):
    """{buffer name: (nbytes, [(offset, box, tensor)])} on rank, computed
    from the description alone."""
    out = {}
    for t, spec in enumerate(side):
        shape, dtype = tensors[t]
        es = reshard.dtypes.size(reshard.dtypes.to_c(dtype))
        if spec[0] == "raw":
            if spec[1] == rank:
                n = int(np.prod(shape, dtype=np.int64)) * es
                out["raw%d" % t] = (GAP + n + GAP,
                                    [(GAP, [(0, s) for s in shape], t)])
            continue
        _, ranks, mshape, pls = spec
        if rank not in ranks:
            continue
        coord = np.unravel_index(ranks.index(rank), mshape)
        box = chunk_box(shape, mshape, coord, pls)
        n = int(np.prod([hi - lo for lo, hi in box], dtype=np.int64)) * es
        if n:
            out["p%d" % t] = (n, [(0, box, t)])
    return out


def fill(nbytes, pieces, tensors, seed_of, fill_values):
    buf = np.full(nbytes, SENTINEL, dtype=np.uint8)
    for off, box, t in pieces:
        shape, dtype = tensors[t]
        es = reshard.dtypes.size(reshard.dtypes.to_c(dtype))
        lin = box_linear(shape, box)
        if fill_values and lin.size and all(hi > lo for lo, hi in box):
            buf[off:off + lin.size * es] = values(seed_of[t], lin, es).ravel()
    return buf


def make_case(seed, nranks, register=False):
    """The body each rank runs for the random case ``seed``: fn(rank, comm).
    register: the buffers registered (plan.register_buffers: one-sided
    reads on UCX) instead of bound."""
    rng = np.random.default_rng(seed)
    tensors = []
    for t in range(int(rng.integers(1, 4))):
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(s) for s in rng.integers(1, 9, ndim))
        tensors.append((shape, str(rng.choice(DTYPES))))
    src_side = random_side(rng, nranks, tensors)
    dst_side = random_side(rng, nranks, tensors)
    seed_of = [int(rng.integers(1 << 30)) for _ in tensors]
    staging = int(rng.choice([4096, 1 << 16, 1 << 20]))

    def rank_fn(rank, comm):
        src, dst = build(tensors, src_side), build(tensors, dst_side)
        want_src = expected_pieces(tensors, src_side, rank)
        want_dst = expected_pieces(tensors, dst_side, rank)
        # The layout's own view of this rank agrees with the description.
        for L, want in ((src, want_src), (dst, want_dst)):
            got = {}
            for f in L.fragments(rank):
                got.setdefault(L.buffer_name(f.buffer), []).append(
                    (f.offset, [tuple(b) for b in f.box], f.tensor))
            assert got == {k: v[1] for k, v in want.items()}, (got, want)
            for name, (n, _) in want.items():
                assert L.buffer_bytes(L.buffer_id(name, rank), rank) == n
        with reshard.Plan(comm, src, dst, staging_bytes=staging,
                          timeout_ms=30000) as plan:
            sbufs = {k: fill(n, p, tensors, seed_of, True)
                     for k, (n, p) in want_src.items()}
            dbufs = {k: fill(n, p, tensors, seed_of, False)
                     for k, (n, p) in want_dst.items()}
            sbefore = {k: v.copy() for k, v in sbufs.items()}
            bound = plan.register_buffers(sbufs, dbufs) if register \
                else plan.bind(sbufs, dbufs)
            for _ in range(2):  # a second step replays the same plan
                plan.execute(bound)
            for k, (n, p) in want_dst.items():
                want = fill(n, p, tensors, seed_of, True)
                bad = np.flatnonzero(dbufs[k] != want)
                assert bad.size == 0, (
                    "rank %d buffer %s: %d wrong bytes, first at byte %d "
                    "(got %d, want %d)" % (rank, k, bad.size, bad[0],
                                           dbufs[k][bad[0]], want[bad[0]]))
            for k in sbufs:
                assert np.array_equal(sbufs[k], sbefore[k]), \
                    "rank %d: source %s modified" % (rank, k)
        return True

    return rank_fn


def one_case(seed, nranks):
    run_ranks(nranks, make_case(seed, nranks))


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_random_layouts(seed, nranks):
    rng = np.random.default_rng(seed)
    for case in range(6):
        case_seed = int(rng.integers(1 << 31))
        try:
            one_case(case_seed, nranks)
        except BaseException as e:
            raise AssertionError("case seed %d (nranks %d): %s"
                                 % (case_seed, nranks, e)) from e
