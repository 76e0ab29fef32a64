/* One block of an fp8 block quantization (issue 19): where it lies in its
 * box and the two passes over it (amax, then codes and the scale), in
 * C11 and CUDA C++ at once, like convert.h. The host (src/pack/quantize.c,
 * one thread: tid 0 of 1) and the CUDA kernel (kernels/quant_kernels.cu,
 * a thread block per block: the partial maxima of its threads reduced
 * between the passes) run this very code, and the emulated device of the
 * CPU tests runs the kernel's threads one after another through it.
 *
 * Threads split a block into W columns (W = min(nthreads, block columns))
 * and nthreads / W rows at a time: consecutive threads read consecutive
 * elements of a row (coalesced on a GPU), and no per-element division. */
#ifndef RS_PACK_QUANT_BLOCK_H
#define RS_PACK_QUANT_BLOCK_H

#include <stdint.h>

#include "pack/convert.h"
#include "pack/quantize.h"

/* Where block blk of box q lies (blocks numbered plane by plane, then row
 * major over the plane's block grid, as the box's scales are laid out). */
typedef struct rs_qblock {
  const unsigned char *in; /* the plane's first input element */
  int64_t rs, cs;          /* input row and column strides, bytes */
  int64_t r0, r1, c0, c1;  /* the block's rows and columns in the plane */
  int64_t cols;            /* the plane's columns (codes are dense) */
  uint64_t code_at;        /* the plane's first code, from codes */
  uint64_t scale_at;       /* the block's scale, from scales */
  int vec;                 /* threads take 8 elements at a time (rs_qblock_vec) */
} rs_qblock;

RS_CVT int64_t rs_qblock_cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* Blocks of box q (every plane's). */
RS_CVT uint64_t rs_qblock_count(const rs_qbox *q) {
  int64_t n = 1;
  for (int d = 0; d < q->ndim - 2; d++) n *= q->extent[d];
  return (uint64_t)(n * rs_qblock_cdiv(q->extent[q->ndim - 2], q->block[0]) *
                    rs_qblock_cdiv(q->extent[q->ndim - 1], q->block[1]));
}

/* The box holding block g of a launch over boxes whose first blocks are
 * bstart[0, nboxes] (bstart[nboxes]: every block): the last box whose
 * first block is <= g (boxes without blocks share their start with the
 * next). */
RS_CVT uint32_t rs_qblock_box(const uint64_t *bstart, uint32_t nboxes, uint64_t g) {
  uint32_t lo = 0, hi = nboxes;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (bstart[mid] <= g) lo = mid;
    else hi = mid;
  }
  return lo;
}

RS_CVT void rs_qblock_locate(const rs_qbox *q, const void *in_base, uint64_t blk, rs_qblock *b) {
  const int nd = q->ndim;
  const int64_t es = q->in_dtype == RESHARD_FP32 ? 4 : 2;
  const int64_t R = q->extent[nd - 2], C = q->extent[nd - 1];
  const int64_t nbr = rs_qblock_cdiv(R, q->block[0]), nbc = rs_qblock_cdiv(C, q->block[1]);
  const uint64_t per_plane = (uint64_t)(nbr * nbc);
  uint64_t p = blk / per_plane, in_plane = blk % per_plane;
  const int64_t br = (int64_t)(in_plane / (uint64_t)nbc), bc = (int64_t)(in_plane % (uint64_t)nbc);
  /* the plane's input offset: its leading index, innermost first */
  int64_t off = (int64_t)q->in_off;
  uint64_t rest = p;
  for (int d = nd - 3; d >= 0; d--) {
    off += (int64_t)(rest % (uint64_t)q->extent[d]) * q->in_stride[d] * es;
    rest /= (uint64_t)q->extent[d];
  }
  b->in = (const unsigned char *)in_base + off;
  b->rs = q->in_stride[nd - 2] * es;
  b->cs = q->in_stride[nd - 1] * es;
  b->r0 = br * q->block[0];
  b->r1 = b->r0 + q->block[0] < R ? b->r0 + q->block[0] : R;
  b->c0 = bc * q->block[1];
  b->c1 = b->c0 + q->block[1] < C ? b->c0 + q->block[1] : C;
  b->cols = C;
  b->code_at = q->code_off + p * (uint64_t)(R * C);
  b->scale_at = q->scale_off + 4 * blk;
  b->vec = 0;
}

/* The kernel's threads take a block 8 elements at a time (16 bytes
 * read, 8 codes written, one load and one store each) where it can: a
 * bf16 block whose rows are contiguous, span a multiple of 8 elements and
 * start 16-byte aligned, and whose rows of codes start 8-byte aligned
 * (codes: the launch's, which rs_qblock_write is given). Element by
 * element (the loops below this), a thread spends two byte loads and a
 * 64-bit address on each element, and the kernel is bound by issuing
 * instructions, not by memory (docs/PERFORMANCE.md counts them). The same
 * codes either way: the vector loops round each element as the scalar
 * ones do. Sets b->vec; the host's one thread does not ask (its runs of
 * blocks are quantize.c's). Little-endian only: element 2k is the low
 * half of word k. */
RS_CVT void rs_qblock_vec(const rs_qbox *q, rs_qblock *b, const unsigned char *codes) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  (void)q, (void)codes;
  b->vec = 0;
#else
  const uintptr_t in = (uintptr_t)(b->in + b->r0 * b->rs + b->c0 * 2);
  const uintptr_t out = (uintptr_t)(codes + b->code_at + (uint64_t)(b->r0 * b->cols + b->c0));
  b->vec = q->in_dtype == RESHARD_BF16 && b->cs == 2 && (b->c1 - b->c0) % 8 == 0 &&
           ((in | (uintptr_t)b->rs) % 16 == 0) && ((out | (uintptr_t)b->cols) % 8 == 0);
#endif
}

/* Rows a thread loads before it uses the first: the first pass reads
 * memory (the second, the same bytes again, mostly from L2), and on a GPU
 * four loads in flight per thread, not one, hide its latency. */
#define RS_Q8_BATCH 4

/* Eight bf16 at p (16-byte aligned): element 2k in the low half of w[k]. */
typedef struct rs_q8 {
  uint32_t w[4];
} rs_q8;

RS_CVT rs_q8 rs_q8_load(const unsigned char *p) {
  rs_q8 v;
#ifdef __CUDA_ARCH__
  const uint4 u = __ldg((const uint4 *)p); /* (read-only for the kernel's life) */
  v.w[0] = u.x, v.w[1] = u.y, v.w[2] = u.z, v.w[3] = u.w;
#else
  if ((uintptr_t)p % 16) __builtin_trap(); /* (a GPU faults here: so do the CPU tests) */
  memcpy(v.w, p, 16);
#endif
  return v;
}

RS_CVT rs_q8 rs_q8_zero(void) {
  rs_q8 v = {{0, 0, 0, 0}};
  return v;
}

/* rs_q8_load where `load`, else zeros (a row past the block's). */
RS_CVT rs_q8 rs_q8_load_if(int load, const unsigned char *p) { return load ? rs_q8_load(p) : rs_q8_zero(); }

/* Eight codes to o (8-byte aligned), code k in byte k mod 4 of word k / 4. */
RS_CVT void rs_q8_store(unsigned char *o, uint32_t lo, uint32_t hi) {
#ifdef __CUDA_ARCH__
  *(uint2 *)o = make_uint2(lo, hi);
#else
  if ((uintptr_t)o % 8) __builtin_trap(); /* (as rs_q8_load) */
  memcpy(o, &lo, 4);
  memcpy(o + 4, &hi, 4);
#endif
}

/* The e4m3fn codes of eight elements, each rounded as rs_qblock_write's
 * scalar loop rounds it (_finite where the block's amax is finite). */
RS_CVT void rs_q8_codes(rs_q8 v, float factor, int finite, uint32_t c[2]) {
  c[0] = c[1] = 0;
  for (int k = 0; k < 8; k++) {
    const float x = rs_cvt_bits_f32(k % 2 ? v.w[k / 2] & 0xffff0000u : v.w[k / 2] << 16);
    const uint32_t e = finite ? rs_cvt_quant_e4m3_finite(x, factor) : rs_cvt_quant_e4m3(x, factor);
    c[k / 4] |= e << (8 * (k % 4));
  }
}

/* The larger of each 16-bit half of a and b (unsigned). */
RS_CVT uint32_t rs_q8_max2(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __vmaxu2(a, b);
#else
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? a & 0xffffu : b & 0xffffu;
  const uint32_t hi = (a >> 16) > (b >> 16) ? a >> 16 : b >> 16;
  return hi << 16 | lo;
#endif
}

/* m2 with each half raised to the |x| (15 bits) of v's halves. */
RS_CVT uint32_t rs_q8_amax(uint32_t m2, rs_q8 v) {
  return rs_q8_max2(m2, rs_q8_max2(rs_q8_max2(v.w[0] & 0x7fff7fffu, v.w[1] & 0x7fff7fffu),
                                   rs_q8_max2(v.w[2] & 0x7fff7fffu, v.w[3] & 0x7fff7fffu)));
}

/* Element at p of a float dtype of the box (f32, bf16, f16) as f32 bits:
 * bf16 is f32's upper half, f16 widens exactly. */
RS_CVT uint32_t rs_qblock_load(const unsigned char *p, int dtype) {
  if (dtype == RESHARD_BF16) return ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
  if (dtype == RESHARD_FP32)
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  return rs_cvt_widen_f32((uint32_t)p[0] | (uint32_t)p[1] << 8, rs_cvt_fmt_of(RESHARD_FP16));
}

/* Row helpers of the host's runs of contiguous bf16 blocks
 * (src/pack/quantize.c), each a loop of its own, which the compiler
 * vectorizes: max |x| as 15-bit integers (a signed 16-bit max: SSE2 has
 * it), and the codes of a row given its block's finite factor. */
RS_CVT int16_t rs_qrow_amax_bf16(const unsigned char *row, int64_t c0, int64_t c1) {
  int16_t m = 0;
  for (int64_t j = c0; j < c1; j++) {
    const int16_t a = (int16_t)(((unsigned)row[2 * j] | (unsigned)row[2 * j + 1] << 8) & 0x7fffu);
    m = a > m ? a : m;
  }
  return m;
}

RS_CVT void rs_qrow_quant_bf16(const unsigned char *row, unsigned char *o, int64_t c0, int64_t c1, float factor) {
  for (int64_t j = c0; j < c1; j++) {
    const uint32_t x = ((uint32_t)row[2 * j] | (uint32_t)row[2 * j + 1] << 8) << 16;
    o[j] = (unsigned char)rs_cvt_quant_e4m3_finite(rs_cvt_bits_f32(x), factor);
  }
}

/* Thread tid of nth's part of the block's max |x|, as bits: |x| as bits
 * orders like the values and every NaN's bits lie above infinity's, so
 * the largest bits are amax, or say the block holds a NaN. The block's is
 * the max of every thread's part. */
RS_CVT uint32_t rs_qblock_amax_part(const rs_qbox *q, const rs_qblock *b, unsigned tid, unsigned nth) {
  if (b->vec) { /* rs_qblock_vec: groups of 8 columns, |x| as 15 bits */
    const int64_t g = (b->c1 - b->c0) / 8, w = g < (int64_t)nth ? g : (int64_t)nth, h = (int64_t)nth / w;
    if ((int64_t)tid >= w * h) return 0;
    const unsigned char *row = b->in + (b->r0 + (int64_t)tid / w) * b->rs + b->c0 * 2;
    const int64_t j0 = (int64_t)tid % w;
    uint32_t m2 = 0;
    if (w == g) /* a group of each of its rows, RS_Q8_BATCH rows' loads at once */
      for (int64_t i = b->r0 + (int64_t)tid / w; i < b->r1; i += RS_Q8_BATCH * h) {
        rs_q8 v[RS_Q8_BATCH];
        for (int k = 0; k < RS_Q8_BATCH; k++) v[k] = rs_q8_load_if(i + k * h < b->r1, row + k * h * b->rs + 16 * j0);
        for (int k = 0; k < RS_Q8_BATCH; k++) m2 = rs_q8_amax(m2, v[k]);
        row += RS_Q8_BATCH * h * b->rs;
      }
    else /* (w == nth, h == 1: the rows are wider) */
      for (int64_t i = b->r0; i < b->r1; i++, row += b->rs)
        for (int64_t j = j0; j < g; j += w) m2 = rs_q8_amax(m2, rs_q8_load(row + 16 * j));
    const uint32_t lo = m2 & 0xffffu, hi = m2 >> 16;
    return (hi > lo ? hi : lo) << 16;
  }
  const int64_t w = b->c1 - b->c0 < (int64_t)nth ? b->c1 - b->c0 : (int64_t)nth, h = (int64_t)nth / w;
  uint32_t m = 0;
  if ((int64_t)tid >= w * h) return 0;
  for (int64_t i = b->r0 + (int64_t)tid / w; i < b->r1; i += h)
    for (int64_t j = b->c0 + (int64_t)tid % w; j < b->c1; j += w) {
      const uint32_t a = rs_qblock_load(b->in + i * b->rs + j * b->cs, q->in_dtype) & 0x7fffffffu;
      m = a > m ? a : m;
    }
  return m;
}

/* The block's amax from its bits (a NaN's: as PyTorch's amax), the
 * factor its codes are computed with, and its scale, written little-endian
 * at scales + b->scale_at. */
RS_CVT float rs_qblock_amax(uint32_t amax_bits) {
  return rs_cvt_bits_f32(amax_bits > 0x7f800000u ? 0x7fc00000u : amax_bits);
}

RS_CVT void rs_qblock_put_scale(const rs_qblock *b, uint32_t amax_bits, unsigned char *scales) {
  const uint32_t s = rs_cvt_f32_bits(rs_cvt_block_scale_inv(rs_qblock_amax(amax_bits)));
  unsigned char *at = scales + b->scale_at;
  at[0] = (unsigned char)s, at[1] = (unsigned char)(s >> 8), at[2] = (unsigned char)(s >> 16),
  at[3] = (unsigned char)(s >> 24);
}

/* rs_qblock_write's vector loops (rs_qblock_vec), for a block holding a
 * NaN (every code 0x7f), a finite block, and a block whose amax is
 * infinite: kind is a constant at each call, so each is a loop of its own
 * and the finite one holds the rounding's common path only. */
enum { RS_Q8_NAN, RS_Q8_FINITE, RS_Q8_INF };

RS_CVT void rs_q8_write(rs_q8 v, unsigned char *o, float factor, int kind) {
  uint32_t c[2] = {0x7f7f7f7fu, 0x7f7f7f7fu}; /* NaN: as the scalar loop, below */
  if (kind != RS_Q8_NAN) rs_q8_codes(v, factor, kind == RS_Q8_FINITE, c);
  rs_q8_store(o, c[0], c[1]);
}

RS_CVT void rs_qblock_write_vec(const rs_qblock *b, unsigned char *codes, float factor, int kind, unsigned tid,
                                unsigned nth) {
  const int64_t g = (b->c1 - b->c0) / 8, w = g < (int64_t)nth ? g : (int64_t)nth, h = (int64_t)nth / w;
  if ((int64_t)tid >= w * h) return;
  const int64_t i0 = b->r0 + (int64_t)tid / w, j0 = (int64_t)tid % w;
  const unsigned char *row = b->in + i0 * b->rs + b->c0 * 2;
  unsigned char *o = codes + b->code_at + (uint64_t)(i0 * b->cols + b->c0);
  /* (as rs_qblock_amax_part's vector loops) */
  if (w == g)
    for (int64_t i = i0; i < b->r1; i += RS_Q8_BATCH * h) {
      rs_q8 v[RS_Q8_BATCH];
      for (int k = 0; k < RS_Q8_BATCH; k++)
        v[k] = rs_q8_load_if(kind != RS_Q8_NAN && i + k * h < b->r1, row + k * h * b->rs + 16 * j0);
      for (int k = 0; k < RS_Q8_BATCH && i + k * h < b->r1; k++)
        rs_q8_write(v[k], o + k * h * b->cols + 8 * j0, factor, kind);
      row += RS_Q8_BATCH * h * b->rs, o += RS_Q8_BATCH * h * b->cols;
    }
  else
    for (int64_t i = i0; i < b->r1; i++, row += b->rs, o += b->cols)
      for (int64_t j = j0; j < g; j += w)
        rs_q8_write(kind != RS_Q8_NAN ? rs_q8_load(row + 16 * j) : rs_q8_zero(), o + 8 * j, factor, kind);
}

/* Thread tid of nth's codes of the block, given the block's amax bits;
 * thread 0 also writes the scale. */
RS_CVT void rs_qblock_write(const rs_qbox *q, const rs_qblock *b, uint32_t amax_bits, unsigned char *codes,
                            unsigned char *scales, unsigned tid, unsigned nth) {
  const float factor = rs_cvt_block_factor(rs_qblock_amax(amax_bits));
  if (tid == 0) rs_qblock_put_scale(b, amax_bits, scales);
  if (b->vec) { /* rs_qblock_vec: each kind of block its own loop */
    if (amax_bits > 0x7f800000u) rs_qblock_write_vec(b, codes, factor, RS_Q8_NAN, tid, nth);
    else if (amax_bits < 0x7f800000u) rs_qblock_write_vec(b, codes, factor, RS_Q8_FINITE, tid, nth);
    else rs_qblock_write_vec(b, codes, factor, RS_Q8_INF, tid, nth);
    return;
  }
  const int64_t w = b->c1 - b->c0 < (int64_t)nth ? b->c1 - b->c0 : (int64_t)nth, h = (int64_t)nth / w;
  if ((int64_t)tid >= w * h) return;
  unsigned char *out = codes + b->code_at;
  if (amax_bits > 0x7f800000u) {
    /* a block holding a NaN: x * NaN is NaN, e4m3fn's 0x7f (the positive
     * one: PyTorch on a GPU, whose NaN results are canonical) */
    for (int64_t i = b->r0 + (int64_t)tid / w; i < b->r1; i += h)
      if (w == 1) /* (one thread: the row at once) */
        memset(out + i * b->cols + b->c0, 0x7f, (size_t)(b->c1 - b->c0));
      else
        for (int64_t j = b->c0 + (int64_t)tid % w; j < b->c1; j += w) out[i * b->cols + j] = 0x7f;
    return;
  }
  for (int64_t i = b->r0 + (int64_t)tid / w; i < b->r1; i += h)
    for (int64_t j = b->c0 + (int64_t)tid % w; j < b->c1; j += w)
      out[i * b->cols + j] =
          (unsigned char)rs_cvt_quant_e4m3(rs_cvt_bits_f32(rs_qblock_load(b->in + i * b->rs + j * b->cs, q->in_dtype)),
                                           factor);
}

#endif
