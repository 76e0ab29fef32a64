/* Element conversions between the floating-point dtypes a weight sync
 * meets: f32, bf16, f16, fp8 e4m3fn and fp8 e5m2 (issue 19). The one
 * definition of every cast the library makes: the host copies
 * (src/pack/copy.c) and the CUDA kernels include this header, so a byte
 * converted on a GPU equals the byte converted on a host.
 *
 * This header is C11 and CUDA C++ at once, like kernels/rs_tile.h: under
 * nvcc every function is __host__ __device__. Integer arithmetic only (no
 * floating-point environment, no compiler-specific half types), so the
 * result does not depend on the rounding mode, flush-to-zero or fast-math
 * flags of whoever compiles it.
 *
 * A cast widens the source exactly to f32 (every narrower format is a
 * subset of f32) and rounds that once to the destination, to nearest,
 * ties to even, with subnormals kept (no flush to zero). Among bf16, f16
 * and the fp8 formats this is a single rounding of the exact source value.
 *
 * Special values follow PyTorch's casts, which is what `tensor.to(dtype)`
 * gives a framework (c10/util/Half.h fp16_ieee_from_fp32_value,
 * c10/util/BFloat16.h round_to_nearest_even, c10/util/Float8_e4m3fn.h
 * fp8e4m3fn_from_fp32_value, c10/util/Float8_e5m2.h
 * fp8e5m2_from_fp32_value):
 *   - NaN stays NaN, as the format's quiet NaN with the sign kept
 *     (payloads are not; PyTorch's bf16 also drops the sign): f16 0x7e00,
 *     bf16 0x7fc0, e4m3fn 0x7f, e5m2 0x7f;
 *   - f16, bf16 and e5m2 have infinities: an infinity stays one, and a
 *     finite value that rounds past the largest finite becomes one;
 *   - e4m3fn has none (its largest finite is 448, 0x7e; 0x7f is NaN): an
 *     infinity, and any value that rounds past 448 (|x| > 464; the tie at
 *     464 goes to 448, the even one), becomes NaN, as in PyTorch.
 *     Quantizers scale into range first (amax maps to 448), so a
 *     quantized weight never meets this. */
#ifndef RS_PACK_CONVERT_H
#define RS_PACK_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "reshard.h"

#ifdef __CUDACC__
#define RS_CVT __host__ __device__ __forceinline__
#else
#define RS_CVT static inline
#endif
/* A branch rarely taken (layout of the hot path only; same results). */
#if defined(__GNUC__) || defined(__clang__)
#define RS_CVT_RARE(c) __builtin_expect(!!(c), 0)
#else
#define RS_CVT_RARE(c) (c)
#endif

/* Whether dtype is one of the floating-point formats a cast handles. */
RS_CVT int rs_cvt_float_dtype(int dtype) {
  return dtype == RESHARD_FP32 || dtype == RESHARD_BF16 || dtype == RESHARD_FP16 || dtype == RESHARD_FP8_E4M3 ||
         dtype == RESHARD_FP8_E5M2;
}

/* Bytes per element of a float dtype (reshard_dtype_size, on devices too). */
RS_CVT unsigned rs_cvt_size(int dtype) {
  return dtype == RESHARD_FP32 ? 4u : dtype == RESHARD_BF16 || dtype == RESHARD_FP16 ? 2u : 1u;
}

/* The dtype a tensor travels in between two ranks when its source is
 * `src` and its destination `dst`: the narrower, so that the wire carries
 * the fewest bytes (the sender casts when the destination is narrower,
 * the receiver otherwise; at equal sizes, the source's, cast on
 * arrival). */
RS_CVT int rs_cvt_wire_dtype(int src, int dst) {
  return rs_cvt_size(dst) < rs_cvt_size(src) ? dst : src;
}

/* A narrow format: exponent and mantissa widths, and whether its
 * all-ones exponent encodes infinities and NaNs (IEEE) or, as in e4m3fn,
 * ordinary values but for the one NaN pattern. */
typedef struct rs_cvt_fmt {
  int ebits, mbits, ieee;
  uint32_t qnan; /* the quiet NaN, sign bit clear */
} rs_cvt_fmt;

RS_CVT rs_cvt_fmt rs_cvt_fmt_of(int dtype) {
  rs_cvt_fmt f;
  switch (dtype) {
  case RESHARD_BF16: f.ebits = 8, f.mbits = 7, f.ieee = 1, f.qnan = 0x7fc0u; break;
  case RESHARD_FP16: f.ebits = 5, f.mbits = 10, f.ieee = 1, f.qnan = 0x7e00u; break;
  case RESHARD_FP8_E5M2: f.ebits = 5, f.mbits = 2, f.ieee = 1, f.qnan = 0x7fu; break;
  default: /* RESHARD_FP8_E4M3: e4m3fn */ f.ebits = 4, f.mbits = 3, f.ieee = 0, f.qnan = 0x7fu; break;
  }
  return f;
}

/* The bits of an f32 -> the narrow format's bits (in the low 8 or 16). */
RS_CVT uint32_t rs_cvt_round_f32(uint32_t x, rs_cvt_fmt f) {
  const int nbits = 1 + f.ebits + f.mbits, bias = (1 << (f.ebits - 1)) - 1;
  const uint32_t sign = (x >> 31) << (nbits - 1), a = x & 0x7fffffffu;
  const uint32_t emax_field = (1u << f.ebits) - 1;
  if (a > 0x7f800000u) return sign | f.qnan;
  /* bf16 is f32's upper half: rounding the lower half to nearest even is
   * the whole cast (subnormals and the carry into infinity included); the
   * general path below gives the same bits, slower (test_convert checks
   * both against the reference) */
  if (f.ebits == 8 && f.mbits == 7) return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  if (a == 0x7f800000u) return sign | (f.ieee ? emax_field << f.mbits : f.qnan);
  if (a < 0x00800000u) {
    /* an f32 subnormal (or zero) is below 2^-126: only bf16 (f32's
     * exponent range) has values there; for the others it is under half
     * the smallest subnormal, and rounds to a signed zero */
    if (f.ebits < 8 || a == 0) return sign;
  }
  /* a = M x 2^(E - 23), M the 24-bit significand (no hidden bit for an
   * f32 subnormal, whose exponent is that of the smallest normal) */
  int E = a < 0x00800000u ? -126 : (int)(a >> 23) - 127;
  uint32_t M = a < 0x00800000u ? a : (a & 0x007fffffu) | 0x00800000u;
  /* the destination's unit in the last place at this magnitude: that of
   * E, or, below its smallest normal exponent, of its subnormals */
  const int emin = 1 - bias;
  int ulp = (E > emin ? E : emin) - f.mbits;
  int shift = 23 + ulp - E; /* >= 23 - mbits > 0 */
  uint32_t q;
  if (shift > 25) {
    q = 0; /* M / 2^shift < 1/4: rounds to zero */
  } else {
    q = M >> shift;
    uint32_t rem = M & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
  }
  if (q >> (f.mbits + 1)) { /* rounding carried into the next binade */
    q >>= 1;
    ulp++;
  }
  uint32_t field, mant;
  if (q >> f.mbits) {
    int e = ulp + f.mbits + bias;
    field = (uint32_t)e;
    mant = q & ((1u << f.mbits) - 1);
  } else {
    field = 0; /* a subnormal (or zero) */
    mant = q;
  }
  if (f.ieee) {
    if (field >= emax_field) return sign | (emax_field << f.mbits); /* past the largest finite */
  } else if (field > emax_field || (field == emax_field && mant == (1u << f.mbits) - 1)) {
    return sign | f.qnan; /* e4m3fn: past 448 */
  }
  return sign | (field << f.mbits) | mant;
}

/* The narrow format's bits -> the f32 bits of the same value (exact). */
RS_CVT uint32_t rs_cvt_widen_f32(uint32_t v, rs_cvt_fmt f) {
  const int nbits = 1 + f.ebits + f.mbits, bias = (1 << (f.ebits - 1)) - 1;
  const uint32_t sign = ((v >> (nbits - 1)) & 1u) << 31;
  const uint32_t emax_field = (1u << f.ebits) - 1;
  uint32_t field = (v >> f.mbits) & emax_field, mant = v & ((1u << f.mbits) - 1);
  if (f.ieee && field == emax_field) return sign | 0x7f800000u | (mant ? 0x00400000u : 0);
  if (!f.ieee && field == emax_field && mant == (1u << f.mbits) - 1) return sign | 0x7fc00000u;
  if (field == 0) {
    if (mant == 0) return sign;
    /* a subnormal: mant x 2^(1 - bias - mbits); normalize (bf16's reach
     * f32's subnormals, whose exponent field stays 0) */
    int e = 1 - bias;
    while (!(mant >> f.mbits) && e > -126) {
      mant <<= 1;
      e--;
    }
    if (!(mant >> f.mbits)) return sign | (mant << (23 - f.mbits)); /* f32 subnormal */
    return sign | ((uint32_t)(e + 127) << 23) | ((mant & ((1u << f.mbits) - 1)) << (23 - f.mbits));
  }
  return sign | ((uint32_t)((int)field - bias + 127) << 23) | (mant << (23 - f.mbits));
}

/* One element of dtype `from` at s -> dtype `to` at d (both float dtypes
 * of rs_cvt_float_dtype; unaligned addresses are fine). */
RS_CVT void rs_cvt_elem(int to, unsigned char *d, int from, const unsigned char *s) {
  uint32_t x;
  if (from == RESHARD_FP32) {
    x = (uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 24;
  } else {
    rs_cvt_fmt f = rs_cvt_fmt_of(from);
    uint32_t v = f.ebits + f.mbits + 1 == 16 ? (uint32_t)s[0] | (uint32_t)s[1] << 8 : (uint32_t)s[0];
    x = rs_cvt_widen_f32(v, f);
  }
  if (to == RESHARD_FP32) {
    d[0] = (unsigned char)x, d[1] = (unsigned char)(x >> 8), d[2] = (unsigned char)(x >> 16),
    d[3] = (unsigned char)(x >> 24);
    return;
  }
  rs_cvt_fmt g = rs_cvt_fmt_of(to);
  uint32_t y = rs_cvt_round_f32(x, g);
  d[0] = (unsigned char)y;
  if (g.ebits + g.mbits + 1 == 16) d[1] = (unsigned char)(y >> 8);
}

/* ---- fp8 block quantization (issue 19) ----
 *
 * DeepSeek's per_block_cast_to_fp8 (DeepSeek-V3 inference/kernel.py's
 * convention, and DeepGEMM's tests), which vLLM's block-fp8 linear layers
 * read (weight plus weight_scale_inv per 128 x 128 block): over a block's
 * elements read as f32, amax = max(max |x|, 1e-4); each element becomes
 * e4m3fn(x * (448 / amax)), the factor and the product in f32 rounded to
 * nearest even, the cast as rs_cvt_round_f32; the block's scale is
 * weight_scale_inv = amax / 448 in f32. These are the per-element steps;
 * the amax of a block is its caller's (the block may span shards). */

RS_CVT float rs_cvt_bits_f32(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

RS_CVT uint32_t rs_cvt_f32_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}

/* A block's amax clamped as the definition does (NaN stays NaN: max over
 * a block holding NaN is NaN in PyTorch, and so is everything after it). */
RS_CVT float rs_cvt_block_amax(float amax) { return amax < 1e-4f ? 1e-4f : amax; }

/* 448 / amax and amax / 448, in f32 (one IEEE division each). */
RS_CVT float rs_cvt_block_factor(float amax) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(448.0f, rs_cvt_block_amax(amax));
#else
  return 448.0f / rs_cvt_block_amax(amax);
#endif
}

RS_CVT float rs_cvt_block_scale_inv(float amax) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(rs_cvt_block_amax(amax), 448.0f);
#else
  return rs_cvt_block_amax(amax) / 448.0f;
#endif
}

/* rs_cvt_round_f32 to e4m3fn, bit for bit, without data-dependent
 * branches for finite inputs (rs_cvt_round_e4m3_finite; loops over a
 * block whose amax is finite vectorize): at or above e4m3's smallest
 * normal (2^-6), rounding to 3 mantissa bits is adding half an ulp (less
 * one, plus the kept lowest bit: ties to even) and truncating, as for
 * bf16, and the exponent is rebiased by a subtraction (127 - 7); a result
 * at or past the NaN pattern (it rounded past 448: e4m3fn has no
 * infinity) is NaN; below 2^-6, see the function. Infinities and NaN take
 * the general path. test_convert compares them. */
RS_CVT uint32_t rs_cvt_round_e4m3_finite(uint32_t x) {
  /* (signed 32-bit arithmetic on values below 2^31: what SSE2 compares) */
  const int32_t a = (int32_t)(x & 0x7fffffffu), sign = (int32_t)((x >> 24) & 0x80u);
  const int32_t small = a < 0x3c800000;
  int32_t code = ((a + 0x7ffff + ((a >> 20) & 1)) >> 20) - (120 << 3);
  code = code < 0x7f ? code : 0x7f;
  /* below 2^-6: e4m3's subnormals are the multiples of 2^-9, so the code
   * is |x| / 2^-9 rounded to an integer, ties to even: the product is
   * exact, and adding 2^23 rounds it so in f32, leaving the integer in
   * the low mantissa bits of 2^23 + code (no conversion, which would
   * keep the loop from vectorizing; a larger |x| is not used) */
  const float t = rs_cvt_bits_f32((uint32_t)a & (0u - (uint32_t)small)) * 512.0f; /* (a mask: no branch) */
  const int32_t sub = (int32_t)(rs_cvt_f32_bits(t + 8388608.0f) - 0x4b000000u); /* 0 .. 8 */
  const int32_t m = -small; /* (masks, not a ?: the compiler would branch on) */
  return (uint32_t)(sign | (sub & m) | (code & ~m));
}

RS_CVT uint32_t rs_cvt_round_e4m3(uint32_t x) {
  if (RS_CVT_RARE((x & 0x7fffffffu) >= 0x7f800000u)) return rs_cvt_round_f32(x, rs_cvt_fmt_of(RESHARD_FP8_E4M3));
  return rs_cvt_round_e4m3_finite(x);
}

/* One element (as f32) quantized with its block's factor: e4m3fn bits;
 * _finite when the product is finite (the block's amax is). */
RS_CVT float rs_cvt_quant_product(float x, float factor) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(x, factor); /* never contracted into anything */
#else
  return x * factor;
#endif
}

RS_CVT uint32_t rs_cvt_quant_e4m3(float x, float factor) {
  const uint32_t p = rs_cvt_f32_bits(rs_cvt_quant_product(x, factor));
  /* A NaN product (an infinity times the factor 0 of a block whose amax
   * is infinite) is 0x7f, whatever sign the hardware gave it: x86 makes
   * 0xffc00000 (0xff), a GPU 0x7fffffff (0x7f, what PyTorch on a GPU
   * gives), and the host and device codes must be the same bytes. */
  if (RS_CVT_RARE((p & 0x7fffffffu) > 0x7f800000u)) return 0x7f;
  return rs_cvt_round_e4m3(p);
}

RS_CVT uint32_t rs_cvt_quant_e4m3_finite(float x, float factor) {
  return rs_cvt_round_e4m3_finite(rs_cvt_f32_bits(rs_cvt_quant_product(x, factor)));
}

#endif
