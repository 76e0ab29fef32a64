/* The device quantize kernel's block body (src/pack/quant_block.h, run by
 * kernels/quant_kernels.cu), on the CPU: each block as the kernel runs it,
 * RS_KERNEL_THREADS threads one after another (the first pass's maxima
 * reduced, then the second pass), in its vector loops (rs_qblock_vec: 8
 * bf16 elements a load, 8 codes a store) and in its scalar ones.
 *
 * Every code and scale of a box is checked against the self-test's
 * reference quantizer (src/selftest/ref_cast.c rs_ref_quant_e4m3, double
 * arithmetic, written apart from the library's integer casts), with each
 * block's amax taken here over the decoded inputs; the vector loops' bytes
 * must also equal the scalar loops' (the same block forced scalar); bytes
 * outside the box's codes and scales keep their sentinel.
 *
 * random_boxes: seeded random boxes (2 or 3 dims, ragged last blocks,
 * padded and unaligned rows, odd offsets of codes, bf16, f16 and f32,
 * rows wider than the kernel's threads' groups) holding every kind of
 * block: weight-like, all zero, amax below 1e-4, subnormal products,
 * products on e4m3 rounding ties, a NaN, an infinity; 1000 seeds
 * (RESHARD_TEST_SCALE scales them). RS_QK_SEED=<n> replays one seed. aligned_blocks: a DeepSeek-like bf16 box of 128 x 128
 * blocks takes the vector loops in every block, and copies of it whose
 * input or codes are misaligned take none. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/rs_kernels.h"
#include "pack/quant_block.h"
#include "reshard.h"
#include "selftest/ref_cast.h"
#include "support/quant_emul.h"
#include "support/test_scale.h"

static uint64_t rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  uint64_t x = *s;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  return x ^ (x >> 29);
}
static int64_t rnd_in(uint64_t *s, int64_t lo, int64_t hi) { return lo + (int64_t)(rnd(s) % (uint64_t)(hi - lo + 1)); }
static double unit(uint64_t *s) { return (double)(rnd(s) >> 11) / 9007199254740992.0; }

static unsigned esize(int dt) { return dt == RESHARD_FP32 ? 4 : 2; }

/* The bits of v (exact in dt where the caller made it so) in dt. */
static uint32_t encode(int dt, float v) {
  uint32_t b;
  if (dt == RESHARD_FP32) {
    memcpy(&b, &v, 4);
    return b;
  }
  if (isnan(v)) return dt == RESHARD_BF16 ? 0x7fc0u : 0x7e00u;
  const int64_t r = rs_ref_round((reshard_dtype_t)dt, (double)v);
  return (uint32_t)r;
}

static double decode(int dt, const unsigned char *p) {
  uint32_t b = 0;
  memcpy(&b, p, esize(dt)); /* (little-endian, as the kernel's vector loops) */
  if (dt == RESHARD_FP32) {
    float f;
    memcpy(&f, &b, 4);
    return (double)f;
  }
  return rs_ref_decode((reshard_dtype_t)dt, b);
}

/* A box, its input buffer and its output buffers. */
typedef struct kbox {
  rs_qbox q;
  unsigned char *in;
  size_t in_bytes;
  unsigned char *codes, *scales;
  size_t code_bytes, scale_bytes;
} kbox;

/* Element (plane p, row i, column j) of the box's input. */
static unsigned char *elem(const kbox *k, int64_t p, int64_t i, int64_t j) {
  const rs_qbox *q = &k->q;
  int64_t off = 0, rest = p;
  for (int d = q->ndim - 3; d >= 0; d--) {
    off += (rest % q->extent[d]) * q->in_stride[d];
    rest /= q->extent[d];
  }
  off += i * q->in_stride[q->ndim - 2] + j * q->in_stride[q->ndim - 1];
  return k->in + q->in_off + (uint64_t)off * esize(q->in_dtype);
}

enum { V_WEIGHT, V_ZERO, V_TINY, V_SUBNORMAL, V_TIES, V_NAN, V_INF, V_KINDS };

/* Fills block (p, br, bc) with values of `kind`. */
static void fill_block(kbox *k, uint64_t *s, int64_t p, int64_t br, int64_t bc, int kind) {
  const rs_qbox *q = &k->q;
  const int nd = q->ndim, dt = q->in_dtype;
  const int64_t R = q->extent[nd - 2], C = q->extent[nd - 1];
  const int64_t r0 = br * q->block[0], c0 = bc * q->block[1];
  const int64_t r1 = r0 + q->block[0] < R ? r0 + q->block[0] : R, c1 = c0 + q->block[1] < C ? c0 + q->block[1] : C;
  const double mag = ldexp(1.0, (int)rnd_in(s, -12, 6));
  for (int64_t i = r0; i < r1; i++)
    for (int64_t j = c0; j < c1; j++) {
      float v = 0;
      switch (kind) {
      case V_WEIGHT: v = (float)((unit(s) * 2 - 1) * mag); break;
      case V_ZERO: v = (rnd(s) & 1) ? -0.0f : 0.0f; break;
      case V_TINY: v = (float)((unit(s) * 2 - 1) * 9e-5); break; /* amax < 1e-4: clamped */
      case V_SUBNORMAL: /* a wide range: most products below e4m3's 2^-6 */
        v = (float)((rnd(s) & 1 ? -1 : 1) * ldexp(1.0 + unit(s), (int)rnd_in(s, -14, 0)));
        break;
      case V_TIES: /* amax 448: factor 1, and midpoints of e4m3 codes */
        if ((rnd(s) & 1)) /* normal range: 1.mmm1 x 2^e */
          v = (float)ldexp(1.0 + (double)(2 * rnd_in(s, 0, 7) + 1) / 16.0, (int)rnd_in(s, -6, 7));
        else /* subnormal range: (k + 1/2) x 2^-9 */
          v = (float)ldexp((double)rnd_in(s, 0, 7) + 0.5, -9);
        if (rnd(s) & 1) v = -v;
        break;
      case V_NAN:
      case V_INF: v = (float)((unit(s) * 2 - 1) * mag); break;
      }
      memcpy(elem(k, p, i, j), &(uint32_t){encode(dt, v)}, esize(dt));
    }
  /* the special element of the block: the amax of a weight-like block
   * (at the block's edges half the time, where a loop that stops short
   * would miss it) */
  const int edge = (int)(rnd(s) % 2);
  const int64_t si = edge ? r1 - 1 : rnd_in(s, r0, r1 - 1), sj = edge ? c1 - 1 : rnd_in(s, c0, c1 - 1);
  float sv = 0;
  int special = 1;
  if (kind == V_WEIGHT) sv = (float)((rnd(s) & 1 ? -1.5 : 1.5) * mag);
  else if (kind == V_TIES) sv = (rnd(s) & 1) ? 448.0f : -448.0f;
  else if (kind == V_NAN) sv = NAN;
  else if (kind == V_INF) sv = (rnd(s) & 1) ? INFINITY : -INFINITY;
  else special = 0;
  if (special) memcpy(elem(k, p, si, sj), &(uint32_t){encode(dt, sv)}, esize(dt));
}

/* A random box: geometry, buffers with sentinels, values. */
static void random_box(uint64_t seed, kbox *k, int *wide) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  memset(k, 0, sizeof *k);
  rs_qbox *q = &k->q;
  static const int dts[4] = {RESHARD_BF16, RESHARD_BF16, RESHARD_FP16, RESHARD_FP32};
  static const int64_t blocks[][2] = {{128, 128}, {8, 8}, {16, 24}, {32, 64}, {7, 13},
                                      {1, 8},     {3, 16}, {5, 40},  {4, 12},  {36, 20}};
  /* bf16 in most boxes, rows aligned in most of those: the vector loops */
  q->in_dtype = dts[rnd(&s) % 4];
  q->ndim = (rnd(&s) % 4) ? 2 : 3;
  const int nd = q->ndim;
  *wide = rnd(&s) % 16 == 0;
  if (*wide) { /* rows past the kernel's 256 threads' groups of 8 */
    q->block[0] = rnd_in(&s, 1, 3), q->block[1] = 8 * rnd_in(&s, 257, 300);
  } else {
    const int b = (int)(rnd(&s) % (sizeof blocks / sizeof *blocks));
    q->block[0] = blocks[b][0], q->block[1] = blocks[b][1];
  }
  for (int d = 0; d < nd - 2; d++) q->extent[d] = rnd_in(&s, 1, 3);
  /* whole blocks or ragged ones */
  for (int d = 0; d < 2; d++) {
    const int64_t n = rnd_in(&s, 1, *wide ? 2 : 3), blk = q->block[d];
    int64_t e = (rnd(&s) % 3) ? n * blk : (n - 1) * blk + rnd_in(&s, 1, blk);
    if (d == 1 && e > 8 && rnd(&s) % 2) e -= e % 8; /* ragged, rows of codes still aligned */
    q->extent[nd - 2 + d] = e;
  }
  const int64_t R = q->extent[nd - 2], C = q->extent[nd - 1];
  /* row stride: dense, padded to 8 elements, or odd; columns contiguous
   * or every other element */
  const int64_t cs = (rnd(&s) % 10) ? 1 : 2;
  const int64_t pad = (rnd(&s) % 5 == 0) ? rnd_in(&s, 1, 5) : ((rnd(&s) % 2) ? 8 * rnd_in(&s, 0, 2) : 0);
  q->in_stride[nd - 1] = cs;
  q->in_stride[nd - 2] = C * cs + pad;
  int64_t plane = R * q->in_stride[nd - 2] + ((rnd(&s) % 2) ? 8 : 0);
  for (int d = nd - 3; d >= 0; d--) {
    q->in_stride[d] = plane;
    plane *= q->extent[d];
  }
  q->in_off = (rnd(&s) % 5) ? 16 * (uint64_t)rnd_in(&s, 0, 3) : (uint64_t)esize(q->in_dtype) * (uint64_t)rnd_in(&s, 1, 7);
  q->in_buf = 0;
  q->code_off = (rnd(&s) % 5) ? 8 * (uint64_t)rnd_in(&s, 0, 3) : (uint64_t)rnd_in(&s, 1, 7);
  q->scale_off = 4 * (uint64_t)rnd_in(&s, 0, 3);
  k->in_bytes = q->in_off + (uint64_t)plane * esize(q->in_dtype) + 16;
  /* (a tail past the box as long as a thread's batch of rows could
   * overrun: all sentinel) */
  k->code_bytes = q->code_off + (uint64_t)rs_qbox_elems(q) + (uint64_t)(RS_Q8_BATCH * RS_KERNEL_THREADS * C) + 16;
  k->scale_bytes = q->scale_off + 4 * (uint64_t)rs_qbox_blocks(q) + 16;
  /* 16-byte aligned bases (cudaMalloc's are 256-byte aligned), so the
   * offsets above decide the alignment */
  k->in = aligned_alloc(64, (k->in_bytes + 63) / 64 * 64);
  k->codes = aligned_alloc(64, (k->code_bytes + 63) / 64 * 64);
  k->scales = aligned_alloc(64, (k->scale_bytes + 63) / 64 * 64);
  memset(k->in, 0x5a, k->in_bytes);
  int64_t planes = 1;
  for (int d = 0; d < nd - 2; d++) planes *= q->extent[d];
  const int64_t nbr = (R + q->block[0] - 1) / q->block[0], nbc = (C + q->block[1] - 1) / q->block[1];
  for (int64_t p = 0; p < planes; p++)
    for (int64_t br = 0; br < nbr; br++)
      for (int64_t bc = 0; bc < nbc; bc++) {
        const uint64_t r = rnd(&s) % 20;
        const int kind = r < 8 ? V_WEIGHT : (int)(1 + (r - 8) % (V_KINDS - 1));
        fill_block(k, &s, p, br, bc, kind);
      }
}

static void free_box(kbox *k) {
  free(k->in);
  free(k->codes);
  free(k->scales);
}

/* Quantizes every block of the box as the kernel does
 * (support/quant_emul.h, as the emulated device), in an order from `order` (a GPU runs its
 * blocks in any order and at once: a block writing another's codes must
 * not go unseen), or forced scalar; returns how many blocks took the
 * vector loops. */
static int64_t run_kernel_body(kbox *k, int force_scalar, uint64_t order) {
  memset(k->codes, 0xa5, k->code_bytes);
  memset(k->scales, 0xa5, k->scale_bytes);
  const rs_qbox *q = &k->q;
  const uint64_t n = rs_qblock_count(q);
  int64_t vec = 0;
  uint64_t *perm = malloc(n * sizeof *perm);
  for (uint64_t g = 0; g < n; g++) perm[g] = g;
  for (uint64_t g = n; g > 1; g--) {
    const uint64_t j = rnd(&order) % g, t = perm[g - 1];
    perm[g - 1] = perm[j], perm[j] = t;
  }
  for (uint64_t x = 0; x < n; x++) {
    vec += rs_emul_quant_block(q, k->in, perm[x], k->codes, k->scales, force_scalar);
  }
  free(perm);
  return vec;
}

/* Checks the box's codes and scales against the reference; prints up to
 * a few differences; returns how many. */
static int64_t check_box(const kbox *k, uint64_t seed, const char *what) {
  const rs_qbox *q = &k->q;
  const int nd = q->ndim, dt = q->in_dtype;
  const int64_t R = q->extent[nd - 2], C = q->extent[nd - 1];
  const int64_t nbr = (R + q->block[0] - 1) / q->block[0], nbc = (C + q->block[1] - 1) / q->block[1];
  int64_t planes = 1, bad = 0;
  for (int d = 0; d < nd - 2; d++) planes *= q->extent[d];
#define KBAD(...)                                                               \
  do {                                                                          \
    if (bad++ < 5) {                                                            \
      printf("seed %llu (RS_QK_SEED replays it), %s: ", (unsigned long long)seed, what); \
      printf(__VA_ARGS__);                                                      \
      printf("\n");                                                             \
    }                                                                           \
  } while (0)
  for (int64_t p = 0; p < planes; p++)
    for (int64_t br = 0; br < nbr; br++)
      for (int64_t bc = 0; bc < nbc; bc++) {
        const int64_t r0 = br * q->block[0], c0 = bc * q->block[1];
        const int64_t r1 = r0 + q->block[0] < R ? r0 + q->block[0] : R;
        const int64_t c1 = c0 + q->block[1] < C ? c0 + q->block[1] : C;
        double amax = 0;
        int nan = 0;
        for (int64_t i = r0; i < r1; i++)
          for (int64_t j = c0; j < c1; j++) {
            const double x = decode(dt, elem(k, p, i, j));
            if (isnan(x)) nan = 1;
            else if (fabs(x) > amax) amax = fabs(x);
          }
        const uint64_t blk = (uint64_t)((p * nbr + br) * nbc + bc);
        float got_s;
        memcpy(&got_s, k->scales + q->scale_off + 4 * blk, 4);
        float want_s = NAN;
        if (!nan) rs_ref_quant_e4m3(0.0f, (float)amax, &want_s);
        if (nan ? !isnan(got_s) : memcmp(&got_s, &want_s, 4) != 0)
          KBAD("plane %lld block (%lld, %lld): scale %g, want %g", (long long)p, (long long)br, (long long)bc,
               (double)got_s, (double)want_s);
        for (int64_t i = r0; i < r1; i++)
          for (int64_t j = c0; j < c1; j++) {
            const unsigned got = k->codes[q->code_off + (uint64_t)((p * R + i) * C + j)];
            const double x = decode(dt, elem(k, p, i, j));
            const int64_t want = nan ? 0x7f : rs_ref_quant_e4m3((float)x, (float)amax, NULL);
            /* a NaN block's codes are 0x7f, and so is an infinity times the
             * factor 0 (a NaN, whose sign the hardware picks: the code's
             * does not follow it, pack/convert.h rs_cvt_quant_e4m3) */
            const int ok = nan || want < 0 ? got == 0x7f : got == (unsigned)want;
            if (!ok)
              KBAD("plane %lld element (%lld, %lld) = %a: code %02x, want %02llx (amax %a)", (long long)p,
                   (long long)i, (long long)j, x, got, (long long)want, amax);
          }
      }
  for (size_t j = 0; j < k->code_bytes; j++)
    if ((j < q->code_off || j >= q->code_off + (uint64_t)rs_qbox_elems(q)) && k->codes[j] != 0xa5)
      KBAD("code byte %zu outside the box written", j);
  for (size_t j = 0; j < k->scale_bytes; j++)
    if ((j < q->scale_off || j >= q->scale_off + 4 * (uint64_t)rs_qbox_blocks(q)) && k->scales[j] != 0xa5)
      KBAD("scale byte %zu outside the box written", j);
#undef KBAD
  return bad;
}

/* One seed: the kernel's body (vector loops where it takes them) against
 * the reference, then forced scalar, byte for byte the same. */
static int run_seed(uint64_t seed, int64_t *vec_blocks, int64_t *blocks, int64_t *wide_vec) {
  kbox k;
  int wide;
  random_box(seed, &k, &wide);
  const int64_t v = run_kernel_body(&k, 0, seed);
  int64_t bad = check_box(&k, seed, "kernel body");
  unsigned char *c = malloc(k.code_bytes), *s = malloc(k.scale_bytes);
  memcpy(c, k.codes, k.code_bytes);
  memcpy(s, k.scales, k.scale_bytes);
  run_kernel_body(&k, 1, seed + 1);
  bad += check_box(&k, seed, "scalar loops");
  if (memcmp(c, k.codes, k.code_bytes) || memcmp(s, k.scales, k.scale_bytes)) {
    printf("seed %llu (RS_QK_SEED replays it): the vector loops' bytes differ from the scalar loops'\n",
           (unsigned long long)seed);
    bad++;
  }
  *vec_blocks += v;
  *blocks += rs_qbox_blocks(&k.q);
  if (wide) *wide_vec += v;
  free(c);
  free(s);
  free_box(&k);
  return bad != 0;
}

static void random_boxes(void **state) {
  (void)state;
  const char *e = getenv("RS_QK_SEED");
  int64_t vec = 0, blocks = 0, wide_vec = 0;
  if (e) {
    assert_int_equal(run_seed(strtoull(e, NULL, 0), &vec, &blocks, &wide_vec), 0);
    return;
  }
  int failed = 0;
  for (uint64_t seed = 1; seed <= (uint64_t)rs_test_scaled(1000); seed++) failed += run_seed(seed, &vec, &blocks, &wide_vec);
  printf("random_boxes: %lld of %lld blocks took the vector loops (%lld in rows wider than the threads)\n",
         (long long)vec, (long long)blocks, (long long)wide_vec);
  assert_int_equal(failed, 0);
  /* both loops were tried, and the wide rows' vector loop */
  assert_true(vec > 0 && vec < blocks);
  assert_true(wide_vec > 0);
}

/* A bf16 weight shard as vLLM holds one of DeepSeek-V3's (rows of a
 * multiple of 128, 128 x 128 blocks): every block takes the vector loops;
 * the same box one element off its alignment takes none; both are exact. */
static void aligned_blocks(void **state) {
  (void)state;
  for (int shift = 0; shift < 3; shift++) { /* aligned; input off; codes off */
    kbox k;
    memset(&k, 0, sizeof k);
    rs_qbox *q = &k.q;
    q->ndim = 2, q->in_dtype = RESHARD_BF16;
    q->extent[0] = 256, q->extent[1] = 384 + (shift == 1 ? 8 : 0);
    q->block[0] = q->block[1] = 128;
    q->in_stride[1] = 1, q->in_stride[0] = 384 + 8; /* a padded row */
    q->in_off = shift == 1 ? 2 : 0;
    q->code_off = shift == 2 ? 4 : 0, q->scale_off = 0;
    k.in_bytes = q->in_off + 256 * 392 * 2 + 16;
    k.code_bytes = q->code_off + (uint64_t)rs_qbox_elems(q) + 16;
    k.scale_bytes = 4 * (uint64_t)rs_qbox_blocks(q) + 16;
    k.in = aligned_alloc(64, (k.in_bytes + 63) / 64 * 64);
    k.codes = aligned_alloc(64, (k.code_bytes + 63) / 64 * 64);
    k.scales = aligned_alloc(64, (k.scale_bytes + 63) / 64 * 64);
    memset(k.in, 0x5a, k.in_bytes);
    uint64_t s = 99 + (uint64_t)shift;
    const int64_t nbc = (q->extent[1] + 127) / 128;
    for (int64_t br = 0; br < 2; br++)
      for (int64_t bc = 0; bc < nbc; bc++) fill_block(&k, &s, 0, br, bc, (int)((br * nbc + bc) % V_KINDS));
    const int64_t v = run_kernel_body(&k, 0, 7);
    assert_int_equal(v, shift ? 0 : rs_qbox_blocks(q));
    assert_int_equal(check_box(&k, (uint64_t)shift, shift ? "misaligned box" : "aligned box"), 0);
    printf("aligned_blocks: %s: %lld of %lld blocks in the vector loops\n",
           shift == 0 ? "aligned" : shift == 1 ? "input 2 bytes off" : "codes 4 bytes off", (long long)v,
           (long long)rs_qbox_blocks(q));
    free_box(&k);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(random_boxes),
      cmocka_unit_test(aligned_blocks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
