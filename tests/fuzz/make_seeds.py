#!/usr/bin/env python3
"""Writes the hand-made seeds of the plan fuzzer (tests/fuzz/corpus/seed-*)
in the byte format that tests/fuzz/plan_input.c decodes: meaningful
layout pairs (TP changes, disjoint and colocated sides, split sizes, fused
and grouped buffers, padding, raw buffers with strided fragments, small
chunks, relays, topologies) and a few invalid ones. The fuzzer grows the
rest of the corpus from them.

    python3 tests/fuzz/make_seeds.py tests/fuzz/corpus
"""
import os
import sys

FP32, BF16, INT8, FP64, INT64 = 2, 0, 6, 3, 10
ESIZE = {FP32: 4, BF16: 2, INT8: 1, FP64: 8, INT64: 8}
STAGING = {4096: 0, 8192: 1, 65536: 2, 256 << 20: 3}
CHUNK = {0: 0, 64: 3, 4096: 5}
TOPO = {None: 0, "cpu": 3, "h100-8x400g": 4}


def header(nranks, tensors, staging=256 << 20, chunk=0, relay=-1, topo=None, tweak=0):
    o1 = STAGING[staging] + 8 * CHUNK[chunk] + 64 * (relay + 1)
    out = [nranks - 1, o1, TOPO[topo], len(tensors) - 1]
    for dtype, shape in tensors:
        out += [dtype, len(shape)] + list(shape)
    return out + [tweak]


def mesh_strided(shape, start=0, stride=1):
    return [0, len(shape) - 1] + [s - 1 for s in shape] + [0, start, stride - 1]


def mesh_ranks(shape, ranks):
    return [0, len(shape) - 1] + [s - 1 for s in shape] + [3] + list(ranks)


R = [0]  # Replicate


def S(dim):  # Shard(dim), even
    return [3 + 8 * dim]


def SS(dim, sizes):  # Shard(dim) with split sizes (the last one implied)
    return [5 + 8 * dim] + list(sizes[:-1])


def SS_any(dim, ndim, sizes):  # Shard(dim) with sizes as given (may not sum)
    b = next(b for b in range(128, 256) if b % 8 == 5 and (b // 8) % (ndim + 1) == dim)
    return [b] + list(sizes)


def place(t, m, *pl):
    return [1, t, m] + [b for p in pl for b in p]


def part(t, m, *pl, pad=None):
    out = [t, m] + [b for p in pl for b in p]
    return out + ([3] + list(pad) if pad else [0])


def fused(concat, groups, *parts):
    g = 0 if groups == 1 else 3 + 4 * (groups - 2)
    return [2, concat, g, len(parts) - 1] + [b for p in parts for b in p]


def builder(kind, m, tp_axis, t, heads=0, kv=0, hd=0):
    # kind 0: reshard_layout_add_megatron_qkv, 1: _vllm_qkv, 2: _gate_up (t[0], t[1])
    return [2, 250, kind, m, tp_axis + 1] + list(t) + [heads, kv, hd]


def frag(t, start, extent, offset_elems, strides=None):
    out = [t]
    for s, e in zip(start, extent):
        out += [s, e]
    if strides is None:
        out += [0]
    else:  # row-major with one element of padding per row when pad
        out += [1] + [1 if p else 0 for p in reversed(strides)]
    return out + [offset_elems]


def raw(rank, nbytes, *frags):
    return [3, rank, (nbytes + 15) // 16, len(frags)] + [b for f in frags for b in f]


def side(*ops):
    return [len(ops)] + [b for op in ops for b in op]


SEEDS = {
    # TP 4 -> 4: rows to columns, all-to-all
    "rows-to-cols-4": header(4, [(FP32, [8, 8])])
    + side(mesh_strided([4]), place(0, 0, S(0)))
    + side(mesh_strided([4]), place(0, 0, S(1))),
    # Megatron TP2 on ranks 0-1 -> vLLM TP4 on ranks 2-5, two tensors
    "disjoint-2-to-4": header(6, [(BF16, [8, 6]), (BF16, [6])])
    + side(mesh_strided([2]), place(0, 0, S(0)), place(1, 0, R))
    + side(mesh_strided([4], start=2), place(0, 0, S(0)), place(1, 0, S(0))),
    # colocated, uneven split sizes on both sides
    "colocated-split-sizes": header(3, [(FP32, [7, 5])])
    + side(mesh_strided([3]), place(0, 0, SS(0, [1, 4, 2])))
    + side(mesh_strided([3]), place(0, 0, SS(1, [3, 0, 2]))),
    # 2-D meshes: (TP x DP) -> (DP x TP), several axes on one dim
    "mesh-2d-same-dim": header(4, [(FP64, [8, 4])])
    + side(mesh_strided([2, 2]), place(0, 0, S(0), S(0)))
    + side(mesh_ranks([2, 2], [3, 1, 2, 0]), place(0, 0, R, S(1))),
    # vLLM-style fused qkv (concat along dim 0) from separate q, k, v
    "fused-qkv": header(2, [(BF16, [8, 4]), (BF16, [4, 4]), (BF16, [4, 4])])
    + side(mesh_strided([2]), place(0, 0, S(0)), place(1, 0, S(0)), place(2, 0, S(0)))
    + side(mesh_strided([2]), fused(0, 1, part(0, 0, S(0)), part(1, 0, S(0)), part(2, 0, S(0)))),
    # Megatron grouped qkv (2 groups) to separate tensors
    "grouped-qkv": header(4, [(FP32, [4, 2]), (FP32, [2, 2])])
    + side(mesh_strided([2]), fused(0, 2, part(0, 0, S(0)), part(1, 0, S(0))))
    + side(mesh_strided([2], start=2), place(0, 0, R), place(1, 0, S(1))),
    # the builders: Megatron linear_qkv on TP 2 (ranks 0-1) -> vLLM
    # qkv_proj with its KV heads replicated on TP 4 (ranks 2-5)
    "builders-qkv": header(6, [(BF16, [8, 4]), (BF16, [4, 4]), (BF16, [4, 4])])
    + side(mesh_strided([2]), builder(0, 0, 0, [0, 1, 2], 4, 2, 2))
    + side(mesh_strided([4], start=2), builder(1, 0, 0, [0, 1, 2], 4, 2, 2)),
    # [gate; up] on TP 2 x DP 2 -> replicated (tp_axis -1)
    "builders-gate-up": header(4, [(FP32, [4, 3]), (FP32, [4, 3])])
    + side(mesh_strided([2, 2]), builder(2, 0, 1, [0, 1, 0]))
    + side(mesh_strided([4]), builder(2, 0, -1, [0, 1, 0])),
    # padded vocabulary in a fused buffer
    "padded-vocab": header(2, [(FP32, [7, 3])])
    + side(mesh_strided([1]), place(0, 0, R))
    + side(mesh_strided([2]), fused(0, 1, part(0, 0, S(0), pad=[1, 0]))),
    # raw buffers with explicit strided fragments on the destination
    "raw-strided": header(2, [(INT64, [4, 4])])
    + side(mesh_strided([2]), place(0, 0, S(1)))
    + side(
        raw(0, 256, frag(0, [0, 0], [2, 4], 0, strides=[False, True]), frag(0, [2, 0], [2, 4], 12)),
        raw(1, 128, frag(0, [0, 0], [4, 4], 0)),
    ),
    # tiny chunks: many rounds, with relays between destination replicas
    "small-chunks-relay": header(4, [(FP32, [8, 8])], staging=4096, chunk=64, relay=1)
    + side(mesh_strided([2]), place(0, 0, S(0)))
    + side(mesh_strided([2], start=2), place(0, 0, R)),
    # a topology preset on 8 ranks, 3-D mesh
    "topology-3d": header(8, [(BF16, [4, 4, 2])], topo="h100-8x400g")
    + side(mesh_strided([2, 2, 2]), place(0, 0, S(0), S(1), S(2)))
    + side(mesh_strided([8]), place(0, 0, S(0))),
    # a scalar and an empty tensor
    "scalar-and-empty": header(2, [(INT8, []), (FP32, [0, 3])])
    + side(mesh_strided([1]), place(0, 0, R), place(1, 0, R))
    + side(mesh_strided([2]), place(0, 0, R), place(1, 0, S(1))),
    # invalid: a destination rank outside the communicator
    "bad-rank": header(2, [(FP32, [4])])
    + side(mesh_strided([2]), place(0, 0, S(0)))
    + side(mesh_strided([2], start=1), place(0, 0, S(0))),
    # invalid: split sizes that do not sum to the extent
    "bad-split-sizes": header(2, [(FP32, [4, 4])])
    + side(mesh_strided([2]), place(0, 0, SS_any(0, 2, [3, 3])))
    + side(mesh_strided([2]), place(0, 0, S(0))),
    # invalid: a destination tensor the source does not have
    "bad-extra-tensor": header(2, [(FP32, [4, 4])], tweak=7)
    + side(mesh_strided([2]), place(0, 0, S(0)))
    + side(mesh_strided([2]), place(0, 0, S(1)), place(1, 0, R)),
    # invalid: overlapping fragments in a raw buffer
    "bad-overlap": header(1, [(FP32, [4])])
    + side(mesh_strided([1]), place(0, 0, R))
    + side(raw(0, 64, frag(0, [0], [4], 0), frag(0, [0], [2], 2))),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        assert all(0 <= b < 256 for b in data), name
        with open(os.path.join(out, "seed-" + name), "wb") as f:
            f.write(bytes(data))
    print(f"{len(SEEDS)} seeds written to {out}")


if __name__ == "__main__":
    main()
