"""FP8 block quantization in flight through the Python API (issue 19):
``Layout.add_tensor(name, "fp8e4m3", shape, block=(rows, cols))`` on the
destination, bf16 / f32 weights on the source. Every code and every scale
is checked against a reference quantizer written here in numpy (float32
arithmetic, numpy's round-half-to-even), apart from reshard's C casts:
DeepSeek's per_block_cast_to_fp8 (amax = max(max |x|, 1e-4) per block,
codes e4m3fn(x * (448 / amax)), scales amax / 448)."""
import numpy as np
import pytest

import reshard
from conftest import run_ranks

SHAPE = (40, 36)
BLOCK = (16, 8)


def e4m3fn_bits(v):
    """float32 values with |v| <= 448 (or NaN) -> e4m3fn bytes, rounding to
    nearest even at the format's spacing (subnormals below 2^-6)."""
    v = np.asarray(v, np.float64)
    out = np.zeros(v.shape, np.uint8)
    a = np.abs(v)
    nan = np.isnan(v)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, -6)  # below the smallest normal: subnormal spacing
    ulp = np.exp2(e - 3)
    q = np.round(np.where(nan, 0, a) / ulp) * ulp  # half to even
    # q may round up into the next binade
    e2 = np.maximum(np.floor(np.log2(np.where(q > 0, q, 1.0))), -6)
    normal = q >= 2.0 ** -6
    mant = np.where(normal, q / np.exp2(e2) - 1.0, q / 2.0 ** -6) * 8
    field = np.where(normal, e2 + 7, 0)
    bits = (field.astype(np.int64) << 3) | np.round(mant).astype(np.int64)
    bits = np.where(q == 0, 0, bits)
    out[...] = (bits | np.where(np.signbit(v), 0x80, 0)).astype(np.uint8)
    out[nan] = 0x7F | np.where(np.signbit(v[nan]), 0x80, 0).astype(np.uint8)
    return out


def reference(g, block=BLOCK):
    """Codes (uint8) and scales (float32) of the global f32 tensor g in
    blocks of ``block`` (rows, cols)."""
    rows, cols = g.shape
    nbr, nbc = -(-rows // block[0]), -(-cols // block[1])
    codes = np.zeros(g.shape, np.uint8)
    scales = np.zeros((nbr, nbc), np.float32)
    for i in range(nbr):
        for j in range(nbc):
            blk = g[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]].astype(np.float32)
            amax = np.float32(max(np.abs(blk).max(), np.float32(1e-4)))
            factor = np.float32(448.0) / amax
            codes[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = \
                e4m3fn_bits((blk * factor).astype(np.float32))
            scales[i, j] = amax / np.float32(448.0)
    return codes, scales


def source_values():
    rng = np.random.default_rng(1919)
    x = rng.standard_normal(SHAPE) * np.exp2(rng.integers(-12, 4, (SHAPE[0] // BLOCK[0] + 1, 1)).repeat(BLOCK[0], 0)[:SHAPE[0]])
    x[0:16, 0:8] = 0.0  # an all-zero block: amax clamps to 1e-4
    x[16:32, 8:16] *= 2.0 ** -30  # tiny: clamped too
    x[0, 16] = 4.0  # a power-of-two amax: products at e4m3 ties
    return x.astype(np.float32)


def to_bf16(x):
    """float32 -> bf16 bits (round to nearest even) and back as float32."""
    b = x.view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("src_dtype", ["bf16", "f32"])
def test_quantized_sync_matches_numpy_reference(src_dtype):
    g32 = source_values()
    if src_dtype == "bf16":
        raw, g = to_bf16(g32)
    else:
        raw, g = g32, g32
    codes_want, scales_want = reference(g)
    # rows split 20 / 20 over two trainer ranks: 16-row blocks span them
    half = SHAPE[0] // 2

    def rank_fn(rank, comm):
        src, dst = reshard.Layout(), reshard.Layout()
        w = src.add_tensor("w", src_dtype, SHAPE)
        src.place(w, src.add_mesh(2, start=0), [reshard.Shard(0)])
        wd = dst.add_tensor("w", "fp8e4m3", SHAPE, block=BLOCK)
        assert dst.tensor_block(wd) == (BLOCK, dst.tensor_id("w_scale_inv"))
        m = dst.add_mesh(2, start=2)
        dst.place(wd, m, [reshard.Shard(1)])
        dst.place("w_scale_inv", m, [reshard.Shard(1)])
        mine = {}
        if rank < 2:
            mine = {n: np.ascontiguousarray(raw[half * rank:half * (rank + 1)]).reshape(-1)
                    for n in src.buffers(rank)}
        theirs = {n: np.zeros(dst.buffer_bytes(b, rank), np.uint8) for n, b in dst.buffers(rank).items()}
        with reshard.Plan(comm, src, dst, timeout_ms=30000) as plan:
            plan.execute(mine, theirs)
        return theirs

    results = run_ranks(4, rank_fn)
    cols, scols = SHAPE[1] // 2, -(-SHAPE[1] // BLOCK[1])
    scale_split = [-(-scols // 2), scols - -(-scols // 2)]
    for k, rank in enumerate((2, 3)):
        got = results[rank]
        codes = got["w"].reshape(SHAPE[0], cols)
        np.testing.assert_array_equal(codes, codes_want[:, cols * k:cols * (k + 1)])
        s0 = 0 if k == 0 else scale_split[0]
        scales = got["w_scale_inv"].view(np.float32).reshape(scales_want.shape[0], scale_split[k])
        np.testing.assert_array_equal(scales, scales_want[:, s0:s0 + scale_split[k]])


def test_block_needs_fp8e4m3():
    lay = reshard.Layout()
    with pytest.raises(reshard.InvalidArgumentError, match="fp8e4m3"):
        lay.add_tensor("w", "bf16", SHAPE, block=BLOCK)
    assert lay.num_tensors == 0
    assert lay.tensor_block(lay.add_tensor("v", "bf16", SHAPE)) is None


def test_model_bf16_training_to_fp8_serving():
    """A whole model: Megatron in bf16 (no scales) -> vLLM with block
    scales (reshard.models ... block_scales=True): every linear weight but
    the router quantized on the way; the self-test's reference quantizer
    checks every code and scale (SelfTest.check with src=)."""
    import os
    cfg = os.path.join(os.path.dirname(__file__), "..", "data", "tiny-deepseek-v3-fp8.json")
    src = reshard.models.megatron_layout(cfg, "tp=2,dp=2,ep=2,etp=2", layers=2)
    dst = reshard.models.vllm_layout(cfg, "tp=2,dp=2,ep=4", first_rank=4, layers=2, block_scales=True)
    blocked = [t for t in dst.tensors() if dst.tensor_block(t.id)]
    assert blocked and all(dst.tensor_block(t.id)[0] == (4, 8) for t in blocked)

    def rank_fn(rank, comm):
        s, d = reshard.SelfTest(src, rank, 5), reshard.SelfTest(dst, rank, -1)
        with reshard.Plan(comm, src, dst, timeout_ms=30000) as plan:
            plan.execute(s.arrays, d.arrays)
            stats = plan.stats()
        return d.check(5, "fp8 model", src=src), stats

    results = run_ranks(8, rank_fn)
    assert all(wrong == 0 for wrong, _ in results)


@pytest.mark.parametrize("mode", ["finite", "bits"])
def test_model_sync_checked_with_either_values(mode):
    """The self-test's values mode (reshard.selftest.set_values): weight-like
    finite floats (what the tools time converting syncs with) or every bit
    pattern; a quantizing model sync is checked exactly with either (the C
    test test_quant finite_values counts the codes' kinds)."""
    import os
    cfg = os.path.join(os.path.dirname(__file__), "..", "data", "tiny-deepseek-v3-fp8.json")
    src = reshard.models.megatron_layout(cfg, "tp=2", layers=1)
    dst = reshard.models.vllm_layout(cfg, "tp=2", first_rank=2, layers=1, block_scales=True)
    with pytest.raises(ValueError, match="expected 'bits' or 'finite'"):
        reshard.selftest.set_values("floats")
    reshard.selftest.set_values(mode)
    try:
        assert reshard.selftest.get_values() == mode
        blocked = [t.id for t in dst.tensors() if dst.tensor_block(t.id)]

        def rank_fn(rank, comm):
            s, d = reshard.SelfTest(src, rank, 2), reshard.SelfTest(dst, rank, -1)
            with reshard.Plan(comm, src, dst, timeout_ms=30000) as plan:
                plan.execute(s.arrays, d.arrays)
            return d.check(2, "values " + mode, src=src)

        assert run_ranks(4, rank_fn) == [0, 0, 0, 0]
        assert blocked
    finally:
        reshard.selftest.set_values("bits")
