/* The element casts of src/pack/convert.h against the self-test's
 * reference (src/selftest/ref_cast.c), written independently: values as
 * doubles, rounding by the C library's nearbyint (ties to even in the
 * default rounding mode) at the destination's unit in the last place,
 * encodings assembled from the rounded value. Every 8- and 16-bit source
 * pattern is cast to every format; f32 sources are the boundaries (ties,
 * the largest finite and the overflow threshold, subnormal edges, NaN,
 * infinities, signed zeros) and 2 million random bit patterns (seed
 * printed on failure). On x86, f32 -> f16 is also checked against the
 * compiler's _Float16 conversion, a third implementation. */
#include <fenv.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "pack/convert.h"
#include "reshard.h"
#include "selftest/ref_cast.h"

/* A format as the reference sees it. */
typedef struct ref_fmt {
  int dtype, ebits, mbits, ieee, bytes;
} ref_fmt;

static const ref_fmt FMTS[] = {
    {RESHARD_BF16, 8, 7, 1, 2},
    {RESHARD_FP16, 5, 10, 1, 2},
    {RESHARD_FP8_E4M3, 4, 3, 0, 1},
    {RESHARD_FP8_E5M2, 5, 2, 1, 1},
};
enum { NFMTS = sizeof FMTS / sizeof *FMTS };

static int bias_of(const ref_fmt *f) { return (1 << (f->ebits - 1)) - 1; }

static double max_finite(const ref_fmt *f) { return rs_ref_max_finite((reshard_dtype_t)f->dtype); }

static int is_nan_bits(const ref_fmt *f, uint32_t v) { return rs_ref_is_nan((reshard_dtype_t)f->dtype, v); }
static double ref_decode(const ref_fmt *f, uint32_t v) { return rs_ref_decode((reshard_dtype_t)f->dtype, v); }
static int64_t ref_round(const ref_fmt *f, double x) { return rs_ref_round((reshard_dtype_t)f->dtype, x); }

/* bit views of an f32: convert.h's (a reinterpretation, nothing to test) */
#define f32_bits rs_cvt_f32_bits
#define bits_f32 rs_cvt_bits_f32

static void put(unsigned char *p, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get(const unsigned char *p, int bytes) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

/* Casts one f32 pattern to f and compares with the reference. */
static int check_f32_to(const ref_fmt *f, uint32_t x) {
  unsigned char s[4], d[4] = {0xa5, 0xa5, 0xa5, 0xa5};
  put(s, x, 4);
  rs_cvt_elem(f->dtype, d, RESHARD_FP32, s);
  uint32_t got = get(d, f->bytes);
  int64_t want = ref_round(f, (double)bits_f32(x));
  if (f->bytes == 1 && d[1] != 0xa5) {
    fprintf(stderr, "f32 0x%08x -> %s wrote past its byte\n", x, reshard_dtype_name(f->dtype));
    return 1;
  }
  int ok = want < 0 ? is_nan_bits(f, got) : got == (uint32_t)want;
  if (!ok)
    fprintf(stderr, "f32 0x%08x (%.9g) -> %s: got 0x%x, want 0x%llx\n", x, (double)bits_f32(x),
            reshard_dtype_name(f->dtype), got, (long long)want);
  return !ok;
}

/* The f32 patterns every cast must get right: around each format's
 * largest finite, its overflow threshold, its smallest normal and
 * subnormal and their halves, exact ties, and the specials. */
static int boundaries(const ref_fmt *f) {
  int bad = 0, bias = bias_of(f);
  double edges[] = {max_finite(f),
                    ldexp(1.0, 1 - bias),              /* smallest normal */
                    ldexp(1.0, 1 - bias - f->mbits),   /* smallest subnormal */
                    ldexp(1.0, -bias - f->mbits),      /* half of it: a tie to zero */
                    ldexp(3.0, -bias - f->mbits - 1),  /* 1.5 x that half */
                    1.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 65504.0, 65520.0, 3.0e38};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
    if (!(edges[i] <= 3.4e38)) continue;
    uint32_t b = f32_bits((float)edges[i]);
    for (int64_t k = -3; k <= 3; k++)
      for (int sgn = 0; sgn < 2; sgn++) {
        int64_t v = (int64_t)b + k;
        if (v < 0 || v > 0x7fffffff) continue;
        bad += check_f32_to(f, (uint32_t)v | (uint32_t)sgn << 31);
      }
  }
  /* exact ties between neighbours of the format, at several magnitudes:
   * the midpoint of mantissa m and m + 1 */
  for (int E = 1 - bias - 2; E <= bias; E += 3)
    for (uint32_t m = 0; m < 8; m++) {
      double lo = ldexp((double)((1u << f->mbits) + m), E - f->mbits);
      double mid = lo + ldexp(0.5, E - f->mbits);
      if (mid > 3.4e38 || mid < ldexp(1.0, -149)) continue;
      bad += check_f32_to(f, f32_bits((float)mid));
      bad += check_f32_to(f, f32_bits(-(float)mid));
    }
  uint32_t specials[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                         0x00000001u, 0x807fffffu, 0x00800000u};
  for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) bad += check_f32_to(f, specials[i]);
  return bad;
}

static void f32_to_narrow_boundaries(void **state) {
  (void)state;
  int bad = 0;
  for (int i = 0; i < NFMTS; i++) bad += boundaries(&FMTS[i]);
  assert_int_equal(bad, 0);
}

static void f32_to_narrow_random(void **state) {
  (void)state;
  /* a fixed seed, so that CI is reproducible; RS_CONVERT_SEED=<n> tries others */
  const char *env = getenv("RS_CONVERT_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 0) : 0x5eed0019u, s = seed | 1;
  int bad = 0;
  for (int n = 0; n < 2000000 && bad < 10; n++) {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    uint32_t x = (uint32_t)((s * 0x2545F4914F6CDD1DULL) >> 32);
    for (int i = 0; i < NFMTS; i++) bad += check_f32_to(&FMTS[i], x);
  }
  if (bad) fail_msg("%d casts differ from the reference (seed 0x%llx)", bad, (unsigned long long)seed);
}

/* Every pattern of every narrow format: widened to f32 exactly, and cast
 * to every other narrow format (one rounding of its exact value). */
static void narrow_exhaustive(void **state) {
  (void)state;
  int bad = 0;
  for (int i = 0; i < NFMTS && bad < 10; i++) {
    const ref_fmt *f = &FMTS[i];
    for (uint32_t v = 0; v < (1u << (8 * f->bytes)) && bad < 10; v++) {
      unsigned char s[4] = {0}, d[4];
      put(s, v, f->bytes);
      rs_cvt_elem(RESHARD_FP32, d, f->dtype, s);
      uint32_t w = get(d, 4);
      double want = ref_decode(f, v);
      int ok = isnan(want) ? isnan(bits_f32(w)) : (double)bits_f32(w) == want && !signbit(bits_f32(w)) == !signbit(want);
      if (!ok) {
        fprintf(stderr, "%s 0x%x -> f32: got 0x%08x, want %.9g\n", reshard_dtype_name(f->dtype), v, w, want);
        bad++;
      }
      for (int j = 0; j < NFMTS; j++) {
        const ref_fmt *g = &FMTS[j];
        if (g == f) continue;
        unsigned char o[4] = {0, 0, 0, 0};
        rs_cvt_elem(g->dtype, o, f->dtype, s);
        uint32_t got = get(o, g->bytes);
        int64_t r = ref_round(g, want);
        if (r < 0 ? !is_nan_bits(g, got) : got != (uint32_t)r) {
          fprintf(stderr, "%s 0x%x -> %s: got 0x%x, want 0x%llx\n", reshard_dtype_name(f->dtype), v,
                  reshard_dtype_name(g->dtype), got, (long long)r);
          bad++;
        }
      }
    }
  }
  assert_int_equal(bad, 0);
}

/* The quantizer's branch-free e4m3 rounding (rs_cvt_round_e4m3, whose
 * finite inputs take rs_cvt_round_e4m3_finite) is the general rounding
 * bit for bit: every f32 bit pattern with a stride of 61 (70 million,
 * both signs, every exponent; all 2^32 agreed once, 2026-12-03, 21 s,
 * after the subnormals joined the branch-free path), and every pattern
 * around e4m3's smallest normal, its largest finite, the overflow tie,
 * infinity, and the subnormal ties (half the smallest subnormal, 1.5 and
 * 7.5 of it). */
static void e4m3_fast_rounding(void **state) {
  (void)state;
  const rs_cvt_fmt f = rs_cvt_fmt_of(RESHARD_FP8_E4M3);
  int bad = 0;
  for (uint64_t x = 0; x < (1ull << 32) && bad < 10; x += 61) {
    uint32_t a = rs_cvt_round_e4m3((uint32_t)x), b = rs_cvt_round_f32((uint32_t)x, f);
    if (a != b) fprintf(stderr, "e4m3 0x%08llx: fast 0x%02x, general 0x%02x\n", (unsigned long long)x, a, b), bad++;
  }
  static const uint32_t around[] = {0x3c800000u, 0x43e00000u, 0x43e80000u, 0x7f800000u,
                                    0x3a800000u, 0x3b400000u, 0x3c700000u};
  for (int k = 0; k < 7; k++)
    for (int64_t d = -70000; d <= 70000; d++)
      for (uint32_t sign = 0; sign <= 0x80000000u; sign += 0x80000000u) {
        uint32_t x = (uint32_t)((int64_t)around[k] + d) | sign;
        if (rs_cvt_round_e4m3(x) != rs_cvt_round_f32(x, f)) bad++;
        if (sign) break;
      }
  assert_int_equal(bad, 0);
}

/* Named values, so that a reader sees the rules. */
static void named_values(void **state) {
  (void)state;
  const ref_fmt *bf16 = &FMTS[0], *f16 = &FMTS[1], *e4 = &FMTS[2], *e5 = &FMTS[3];
  struct {
    const ref_fmt *f;
    float x;
    uint32_t want;
  } cases[] = {
      {e4, 448.0f, 0x7e},        /* the largest e4m3fn */
      {e4, 464.0f, 0x7e},        /* the tie past it goes to the even 448 */
      {e4, 464.1f, 0x7f},        /* past it: NaN, as in PyTorch */
      {e4, -INFINITY, 0xff},     /* no infinity in e4m3fn: NaN, sign kept */
      {e4, 0.001953125f, 0x01},  /* 2^-9, the smallest subnormal */
      {e4, 0.0009765625f, 0x00}, /* 2^-10, its half: tie to even zero */
      {e5, 57344.0f, 0x7b},      /* the largest e5m2 */
      {e5, 61440.0f, 0x7c},      /* the tie past it: infinity */
      {f16, 65504.0f, 0x7bff},   /* the largest f16 */
      {f16, 65520.0f, 0x7c00},   /* the tie past it: infinity */
      {f16, 1.0f + 1.0f / 2048, 0x3c00}, /* tie between 1 and its neighbour: even */
      {f16, 1.0f + 3.0f / 2048, 0x3c02}, /* tie between odd and even: even, up */
      {bf16, 1.0f + 1.0f / 256, 0x3f80},
      {bf16, 1.0f + 3.0f / 256, 0x3f82},
      {bf16, -0.0f, 0x8000},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    unsigned char s[4], d[4] = {0, 0, 0, 0};
    put(s, f32_bits(cases[i].x), 4);
    rs_cvt_elem(cases[i].f->dtype, d, RESHARD_FP32, s);
    uint32_t got = get(d, cases[i].f->bytes);
    if (got != cases[i].want)
      fail_msg("%.9g -> %s: got 0x%x, want 0x%x", (double)cases[i].x, reshard_dtype_name(cases[i].f->dtype), got,
               cases[i].want);
  }
}

#if defined(__x86_64__) && defined(__FLT16_MAX__)
/* The compiler's f32 -> f16 conversion (correctly rounded, ties to even)
 * as a second, unrelated reference, over every f32 with 12 random low
 * bits dropped: 2^20 patterns spanning every exponent. */
static void f16_against_compiler(void **state) {
  (void)state;
  int bad = 0;
  for (uint32_t hi = 0; hi < (1u << 20) && bad < 10; hi++) {
    uint32_t x = hi << 12 | (hi * 2654435761u >> 20);
    float v = bits_f32(x);
    _Float16 h = (_Float16)v;
    uint16_t want;
    memcpy(&want, &h, 2);
    unsigned char s[4], d[4];
    put(s, x, 4);
    rs_cvt_elem(RESHARD_FP16, d, RESHARD_FP32, s);
    uint32_t got = get(d, 2);
    if (isnan(v) ? !is_nan_bits(&FMTS[1], got) : got != want) {
      fprintf(stderr, "f32 0x%08x -> f16: got 0x%x, compiler 0x%x\n", x, got, want);
      bad++;
    }
  }
  assert_int_equal(bad, 0);
}
#endif

/* fp8 block quantization, element by element: the library's f32 steps
 * against the reference's double-then-round ones, over random values and
 * block maxima (amax >= |x|, as in a block), the clamp at 1e-4, x = +-amax
 * (exactly +-448), zeros, values whose product is an e4m3fn subnormal or
 * a rounding tie, and the scale. */
static int check_quant(float x, float amax) {
  float si_ref;
  int64_t want = rs_ref_quant_e4m3(x, amax, &si_ref);
  uint32_t got = rs_cvt_quant_e4m3(x, rs_cvt_block_factor(amax));
  float si = rs_cvt_block_scale_inv(amax);
  /* the factor itself, bit for bit: a 1-ulp error shows in q only near a
   * tie, but it is one */
  double clamped = amax < 1e-4f ? (double)1e-4f : (double)amax;
  float factor = rs_cvt_block_factor(amax), factor_ref = (float)(448.0 / clamped);
  if (f32_bits(factor) != f32_bits(factor_ref) && !(isnan(factor) && isnan(factor_ref))) {
    fprintf(stderr, "quant amax=%.9g: factor %.9g, want %.9g\n", (double)amax, (double)factor, (double)factor_ref);
    return 1;
  }
  int ok = (want < 0 ? rs_ref_is_nan(RESHARD_FP8_E4M3, got) : got == (uint32_t)want) &&
           (f32_bits(si) == f32_bits(si_ref) || (isnan(si) && isnan(si_ref)));
  if (!ok)
    fprintf(stderr, "quant x=%.9g amax=%.9g: got 0x%02x scale %.9g, want 0x%llx scale %.9g\n", (double)x, (double)amax, got,
            (double)si, (long long)want, (double)si_ref);
  return !ok;
}

static void block_quant(void **state) {
  (void)state;
  int bad = 0;
  /* named values */
  assert_int_equal(rs_cvt_quant_e4m3(2.5f, rs_cvt_block_factor(2.5f)), 0x7e);  /* x = amax -> 448 */
  assert_int_equal(rs_cvt_quant_e4m3(-2.5f, rs_cvt_block_factor(2.5f)), 0xfe);
  assert_true(rs_cvt_block_factor(0.0f) == 448.0f / 1e-4f);                     /* an all-zero block */
  assert_int_equal(rs_cvt_quant_e4m3(0.0f, rs_cvt_block_factor(0.0f)), 0x00);
  bad += check_quant(3e-5f, 2e-5f); /* clamped: 3e-5 x 4.48e6 */
  bad += check_quant(1.0f, NAN);
  /* factor 1 (amax 448): e4m3fn ties, normal and subnormal */
  float ties[] = {1.0625f, 1.1875f, -1.0625f, 0.0009765625f, 0.0029296875f, 232.0f, 248.0f, 432.0f};
  uint32_t want_ties[] = {0x38, 0x3a, 0xb8, 0x00, 0x02, 0x76, 0x78, 0x7e};
  for (int i = 0; i < 8; i++) {
    bad += check_quant(ties[i], 448.0f);
    if (rs_cvt_quant_e4m3(ties[i], rs_cvt_block_factor(448.0f)) != want_ties[i])
      fail_msg("tie %.9g: got 0x%02x, want 0x%02x", (double)ties[i], rs_cvt_quant_e4m3(ties[i], 1.0f), want_ties[i]);
  }
  uint64_t s = 0x9b10c5eedULL;
  for (int n = 0; n < 2000000 && bad < 10; n++) {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    uint64_t r = s * 0x2545F4914F6CDD1DULL;
    /* a bf16 value (the training dtype), any exponent in [-40, 20] */
    float x = ldexpf((float)(((r >> 40) & 0xff) | 0x100) / 256.0f, (int)((r >> 8) % 61) - 40) * ((r & 1) ? -1.0f : 1.0f);
    x = bits_f32(f32_bits(x) & 0xffff0000u);
    float amax = fabsf(x) * ldexpf(1.0f + (float)((r >> 20) & 0xfff) / 4096.0f, (int)((r >> 32) % 12));
    if ((r >> 50) % 16 == 0) amax = fabsf(x);       /* the block's largest */
    if ((r >> 50) % 16 == 1) x = 0.0f;
    bad += check_quant(x, amax);
  }
  assert_int_equal(bad, 0);
}

int main(void) {
  assert_int_equal(fegetround(), FE_TONEAREST);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(named_values),
      cmocka_unit_test(f32_to_narrow_boundaries),
      cmocka_unit_test(narrow_exhaustive),
      cmocka_unit_test(f32_to_narrow_random),
      cmocka_unit_test(block_quant),
      cmocka_unit_test(e4m3_fast_rounding),
#if defined(__x86_64__) && defined(__FLT16_MAX__)
      cmocka_unit_test(f16_against_compiler),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
