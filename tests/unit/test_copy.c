/* rs_copy_init / rs_copy_run against a naive element-by-element reference
 * that knows nothing about merging or runs; casting descriptors
 * (rs_copy_init_cvt) against the same walk, each element cast by
 * rs_cvt_elem (whose values test_convert checks against an independent
 * reference). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pack/convert.h"
#include "pack/copy.h"

/* ------------------------------------------------------------------ */
/* Reference and helpers                                               */
/* ------------------------------------------------------------------ */

/* Walks the full box in row-major order, one element at a time. */
static void ref_copy(int ndim, const int64_t *extent, size_t es,
                     const unsigned char *src, uint64_t src_off,
                     const int64_t *ss, unsigned char *dst, uint64_t dst_off,
                     const int64_t *ds) {
  int64_t idx[RS_COPY_MAX_DIMS] = {0};
  for (;;) {
    int64_t so = (int64_t)src_off, d = (int64_t)dst_off;
    for (int k = 0; k < ndim; k++) {
      so += idx[k] * ss[k] * (int64_t)es;
      d += idx[k] * ds[k] * (int64_t)es;
    }
    for (size_t b = 0; b < es; b++)
      dst[d + (int64_t)b] = src[so + (int64_t)b];
    int k = ndim - 1;
    while (k >= 0 && ++idx[k] == extent[k])
      idx[k--] = 0;
    if (k < 0)
      return;
  }
}

static uint64_t box_elems(int ndim, const int64_t *extent) {
  uint64_t n = 1;
  for (int k = 0; k < ndim; k++)
    n *= (uint64_t)extent[k];
  return n;
}

/* Byte span [lo, hi) the box touches relative to the offset. */
static void box_span(int ndim, const int64_t *extent, size_t es,
                     const int64_t *stride, int64_t *lo, int64_t *hi) {
  *lo = 0;
  *hi = (int64_t)es;
  for (int k = 0; k < ndim; k++) {
    int64_t reach = (extent[k] - 1) * stride[k] * (int64_t)es;
    if (reach < 0)
      *lo += reach;
    else
      *hi += reach;
  }
}

static void fill_sentinel(unsigned char *p, size_t n, unsigned char flip) {
  for (size_t i = 0; i < n; i++)
    p[i] = (unsigned char)((i * 131u + 7u) ^ flip);
}

/* Runs both the descriptor and the reference into a sentinel-filled
 * destination and compares every byte of it. Two sentinels that differ in
 * every byte ensure a missed write cannot hide behind a source byte that
 * happens to equal the sentinel. Returns the first differing byte or -1. */
static int64_t check_copy(int ndim, const int64_t *extent, size_t es,
                          const unsigned char *src, uint64_t src_off,
                          const int64_t *ss, size_t dst_size,
                          uint64_t dst_off, const int64_t *ds, rs_copy *out) {
  rs_copy c;
  rs_copy_init(&c, ndim, extent, es, 3, src_off, ss, RS_BUF_STAGING, dst_off,
               ds);
  if (out)
    *out = c;
  unsigned char *got = malloc(dst_size);
  unsigned char *want = malloc(dst_size);
  assert_non_null(got);
  assert_non_null(want);
  int64_t bad = -1;
  for (int pass = 0; pass < 2 && bad < 0; pass++) {
    unsigned char flip = pass ? 0x5a : 0xa5;
    fill_sentinel(got, dst_size, flip);
    fill_sentinel(want, dst_size, flip);
    rs_copy_run(&c, src, got);
    ref_copy(ndim, extent, es, src, src_off, ss, want, dst_off, ds);
    for (size_t i = 0; i < dst_size; i++)
      if (got[i] != want[i]) {
        bad = (int64_t)i;
        break;
      }
  }
  free(got);
  free(want);
  return bad;
}

static unsigned char *random_bytes(size_t n, uint64_t seed) {
  unsigned char *p = malloc(n ? n : 1);
  assert_non_null(p);
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (unsigned char)(x >> 24);
  }
  return p;
}

/* ------------------------------------------------------------------ */
/* Random cases                                                        */
/* ------------------------------------------------------------------ */

typedef struct {
  uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
  /* xorshift64*; the seed is mixed first so that consecutive case seeds
   * give unrelated streams. */
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1DULL;
}

static int64_t rng_range(rng *r, int64_t lo, int64_t hi) { /* [lo, hi] */
  return lo + (int64_t)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

#define MAX_ELEMS 65536
#define MAX_SPAN_ELEMS (1 << 20)
#define NUM_RANDOM_CASES 1500
#define SEED_BASE 0x9E3779B97F4A7C15ULL

/* Strides of a (possibly padded) dense tensor whose dims are laid out in
 * `perm` order (perm[0] outermost in memory), optionally with broadcast
 * (zero) and reversed (negative) dims. Returns the element offset that
 * makes the lowest touched address 0. */
static int64_t random_strides(rng *r, int ndim, const int64_t *extent,
                              int64_t *stride, int allow_zero) {
  int perm[RS_COPY_MAX_DIMS];
  for (int k = 0; k < ndim; k++)
    perm[k] = k;
  int mode = (int)rng_range(r, 0, 2); /* 0 row-major, 1 reversed, 2 shuffled */
  if (mode == 1) {
    for (int k = 0; k < ndim / 2; k++) {
      int t = perm[k];
      perm[k] = perm[ndim - 1 - k];
      perm[ndim - 1 - k] = t;
    }
  } else if (mode == 2) {
    for (int k = ndim - 1; k > 0; k--) {
      int j = (int)rng_range(r, 0, k);
      int t = perm[k];
      perm[k] = perm[j];
      perm[j] = t;
    }
  }
  int pad_on = rng_range(r, 0, 2) == 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    int64_t s = pad_on ? rng_range(r, 1, 2) : 1;
    for (int k = ndim - 1; k >= 0; k--) {
      int d = perm[k];
      stride[d] = s;
      int64_t pad = pad_on && rng_range(r, 0, 2) == 0 ? rng_range(r, 1, 3) : 0;
      s = s * extent[d] + pad;
    }
    if (s <= MAX_SPAN_ELEMS)
      break;
    pad_on = 0; /* padding compounded past the buffer budget */
  }
  int64_t off = 0;
  for (int k = 0; k < ndim; k++) {
    if (allow_zero && rng_range(r, 0, 9) == 0)
      stride[k] = 0;
    if (rng_range(r, 0, 7) == 0) {
      stride[k] = -stride[k];
      off += (extent[k] - 1) * -stride[k];
    }
  }
  return off;
}

static void print_case(uint64_t seed, int ndim, const int64_t *extent,
                       size_t es, uint64_t so, const int64_t *ss, uint64_t dof,
                       const int64_t *ds) {
  print_error("case seed=0x%016llx ndim=%d elem_size=%zu src_off=%llu "
              "dst_off=%llu\n",
              (unsigned long long)seed, ndim, es, (unsigned long long)so,
              (unsigned long long)dof);
  for (int k = 0; k < ndim; k++)
    print_error("  dim %d: extent=%lld src_stride=%lld dst_stride=%lld\n", k,
                (long long)extent[k], (long long)ss[k], (long long)ds[k]);
}

static void run_random_case(uint64_t seed) {
  rng r = {seed ^ 0xD1B54A32D192ED03ULL};
  rng_next(&r);
  static const size_t sizes[] = {1, 2, 4, 8, 1, 2, 4, 8, 3, 16};
  static const int64_t caps[] = {1, 4096, 256, 40, 16, 9, 6, 5, 4};
  int ndim = (int)rng_range(&r, 0, RS_COPY_MAX_DIMS);
  size_t es = sizes[rng_range(&r, 0, 9)];
  int64_t extent[RS_COPY_MAX_DIMS];
  for (int k = 0; k < ndim; k++)
    extent[k] = rng_range(&r, 0, 4) == 0 ? 1 : rng_range(&r, 1, caps[ndim]);
  while (box_elems(ndim, extent) > MAX_ELEMS) {
    int big = 0;
    for (int k = 1; k < ndim; k++)
      if (extent[k] > extent[big])
        big = k;
    extent[big] = (extent[big] + 1) / 2;
  }

  int64_t ss[RS_COPY_MAX_DIMS], ds[RS_COPY_MAX_DIMS];
  int64_t s_base = random_strides(&r, ndim, extent, ss, 1);
  /* Destination strides are injective: with aliasing destinations the
   * result would depend on write order, which copy.h does not promise. */
  int64_t d_base = random_strides(&r, ndim, extent, ds, 0);

  uint64_t src_off = (uint64_t)(s_base * (int64_t)es + rng_range(&r, 0, 37));
  uint64_t dst_off = (uint64_t)(d_base * (int64_t)es + rng_range(&r, 0, 37));
  int64_t lo, hi;
  box_span(ndim, extent, es, ss, &lo, &hi);
  size_t src_size = (size_t)((int64_t)src_off + hi) + 64;
  box_span(ndim, extent, es, ds, &lo, &hi);
  size_t dst_size = (size_t)((int64_t)dst_off + hi) + 64;

  unsigned char *src = random_bytes(src_size, seed);
  rs_copy c;
  int64_t bad = check_copy(ndim, extent, es, src, src_off, ss, dst_size,
                           dst_off, ds, &c);
  free(src);

  const char *why = NULL;
  if (bad >= 0)
    why = "destination differs from reference";
  else if (rs_copy_bytes(&c) != box_elems(ndim, extent) * es)
    why = "rs_copy_bytes != elems * elem_size";
  else if (c.run_bytes == 0 || c.run_bytes % es != 0)
    why = "run_bytes not a positive multiple of elem_size";
  else if (c.ndim < 0 || c.ndim > ndim)
    why = "descriptor has more dims than the box";
  else if (c.src_off != src_off || c.dst_off != dst_off || c.src_buf != 3 ||
           c.dst_buf != RS_BUF_STAGING)
    why = "offsets or buffer ids not stored as given";
  for (int k = 0; !why && k < c.ndim; k++)
    if (c.extent[k] < 2)
      why = "unit or empty dim left in descriptor";
  if (why) {
    print_case(seed, ndim, extent, es, src_off, ss, dst_off, ds);
    if (bad >= 0)
      print_error("  first bad destination byte: %lld\n", (long long)bad);
    fail_msg("random case seed=0x%016llx: %s", (unsigned long long)seed, why);
  }
}

static void test_random(void **state) {
  (void)state;
  /* RS_COPY_SEED=<seed> replays a single failing case. */
  const char *one = getenv("RS_COPY_SEED");
  if (one && *one) {
    run_random_case(strtoull(one, NULL, 0));
    return;
  }
  for (uint64_t i = 0; i < NUM_RANDOM_CASES; i++)
    run_random_case(SEED_BASE + i);
}

/* rs_copy_compose: a pack (random source strides -> dense staging) and an
 * unpack (dense staging -> random destination strides) of one random box,
 * each merged its own way, composed into one descriptor: running it
 * gives the destination the two steps give, byte for byte (and the bytes
 * around the box untouched, since both start from the same sentinel).
 * A third of the cases cast in the pack (the sender narrows) and a third
 * in the unpack (the receiver widens), between random float dtypes. */
static void run_compose_case(uint64_t seed) {
  rng r = {seed ^ 0x9E3779B97F4A7C15ULL};
  rng_next(&r);
  static const size_t sizes[] = {1, 2, 4, 8, 3, 16};
  static const int64_t caps[] = {1, 4096, 256, 40, 16, 9, 6, 5, 4};
  static const reshard_dtype_t floats[] = {RESHARD_FP32, RESHARD_BF16, RESHARD_FP16, RESHARD_FP8_E4M3,
                                           RESHARD_FP8_E5M2};
  const int cast = (int)(seed % 3); /* 0: none, 1: in the pack, 2: in the unpack */
  reshard_dtype_t a = floats[rng_range(&r, 0, 4)], w = floats[rng_range(&r, 0, 4)];
  if (cast && a == w) w = a == RESHARD_FP32 ? RESHARD_BF16 : RESHARD_FP32;
  int ndim = (int)rng_range(&r, 0, RS_COPY_MAX_DIMS);
  size_t es = sizes[rng_range(&r, 0, 5)];
  /* element sizes: source, staging, destination */
  size_t ses = cast ? reshard_dtype_size(a) : es, wes = cast == 1 ? reshard_dtype_size(w) : ses;
  size_t des = cast == 2 ? reshard_dtype_size(w) : wes;
  int64_t extent[RS_COPY_MAX_DIMS], dense[RS_COPY_MAX_DIMS];
  for (int k = 0; k < ndim; k++) extent[k] = rng_range(&r, 0, 3) == 0 ? 1 : rng_range(&r, 1, caps[ndim]);
  while (box_elems(ndim, extent) > MAX_ELEMS) {
    int big = 0;
    for (int k = 1; k < ndim; k++)
      if (extent[k] > extent[big]) big = k;
    extent[big] = (extent[big] + 1) / 2;
  }
  int64_t e = 1;
  for (int k = ndim - 1; k >= 0; k--) dense[k] = e, e *= extent[k];
  int64_t ss[RS_COPY_MAX_DIMS], ds[RS_COPY_MAX_DIMS];
  int64_t s_base = random_strides(&r, ndim, extent, ss, 1);
  int64_t d_base = random_strides(&r, ndim, extent, ds, 0);
  uint64_t src_off = (uint64_t)(s_base * (int64_t)ses + rng_range(&r, 0, 37));
  uint64_t dst_off = (uint64_t)(d_base * (int64_t)des + rng_range(&r, 0, 37));
  uint64_t stage_off = rng_range(&r, 0, 100);
  int64_t lo, hi;
  box_span(ndim, extent, ses, ss, &lo, &hi);
  size_t src_size = (size_t)((int64_t)src_off + hi) + 64;
  box_span(ndim, extent, des, ds, &lo, &hi);
  size_t dst_size = (size_t)((int64_t)dst_off + hi) + 64;
  size_t stage_size = stage_off + box_elems(ndim, extent) * wes + 64;
  unsigned char *src = random_bytes(src_size, seed), *stage = calloc(1, stage_size);
  unsigned char *want = malloc(dst_size), *got = malloc(dst_size);
  fill_sentinel(want, dst_size, 0);
  fill_sentinel(got, dst_size, 0);
  rs_copy pk, un, c;
  if (cast == 1) {
    rs_copy_init_cvt(&pk, ndim, extent, a, 2, src_off, ss, w, RS_BUF_STAGING, stage_off, dense);
    rs_copy_init(&un, ndim, extent, wes, RS_BUF_STAGING, stage_off, dense, 5, dst_off, ds);
  } else if (cast == 2) {
    rs_copy_init(&pk, ndim, extent, ses, 2, src_off, ss, RS_BUF_STAGING, stage_off, dense);
    rs_copy_init_cvt(&un, ndim, extent, a, RS_BUF_STAGING, stage_off, dense, w, 5, dst_off, ds);
  } else {
    rs_copy_init(&pk, ndim, extent, es, 2, src_off, ss, RS_BUF_STAGING, stage_off, dense);
    rs_copy_init(&un, ndim, extent, es, RS_BUF_STAGING, stage_off, dense, 5, dst_off, ds);
  }
  rs_copy_run(&pk, src, stage);
  rs_copy_run(&un, stage, want);
  int rc = rs_copy_compose(&pk, &un, &c);
  if (!rc) rs_copy_run(&c, src, got);
  const char *why = rc ? "compose refused a pack and its unpack"
                   : memcmp(want, got, dst_size) ? "composed copy differs from pack + unpack"
                   : c.src_buf != 2 || c.dst_buf != 5 ? "buffer ids not carried over"
                   : rs_copy_bytes(&c) != box_elems(ndim, extent) * ses ? "wrong byte count"
                   : rs_copy_dst_run(&c) / des * ses != c.run_bytes ? "run not whole elements"
                                                                       : NULL;
  free(src), free(stage), free(want), free(got);
  if (why) {
    if (cast) fprintf(stderr, "cast %s -> %s in the %s\n", reshard_dtype_name(a), reshard_dtype_name(w),
                      cast == 1 ? "pack" : "unpack");
    print_case(seed, ndim, extent, ses, src_off, ss, dst_off, ds);
    fail_msg("compose case seed=0x%016llx: %s", (unsigned long long)seed, why);
  }
}

static void test_compose_random(void **state) {
  (void)state;
  const char *one = getenv("RS_COPY_SEED");
  if (one && *one) {
    run_compose_case(strtoull(one, NULL, 0));
    return;
  }
  for (uint64_t i = 0; i < NUM_RANDOM_CASES; i++) run_compose_case(SEED_BASE + 7 * i);
  /* not a pack and its unpack: refused */
  int64_t ext[1] = {4}, one_s[1] = {1};
  rs_copy a, b2, c;
  rs_copy_init(&a, 1, ext, 4, 0, 0, one_s, RS_BUF_STAGING, 0, one_s);
  rs_copy_init(&b2, 1, ext, 4, RS_BUF_STAGING, 16, one_s, 0, 0, one_s);
  assert_int_equal(rs_copy_compose(&a, &b2, &c), -1);
  /* both casting (two conversions of one element): refused */
  rs_copy_init_cvt(&a, 1, ext, RESHARD_FP32, 0, 0, one_s, RESHARD_BF16, RS_BUF_STAGING, 0, one_s);
  rs_copy_init_cvt(&b2, 1, ext, RESHARD_BF16, RS_BUF_STAGING, 0, one_s, RESHARD_FP16, 0, 0, one_s);
  assert_int_equal(rs_copy_compose(&a, &b2, &c), -1);
}

/* ------------------------------------------------------------------ */
/* Specific shapes                                                     */
/* ------------------------------------------------------------------ */

/* Source and destination buffers big enough for the small cases below. */
#define SMALL_BUF 8192

static void expect_matches_ref(int ndim, const int64_t *extent, size_t es,
                               uint64_t so, const int64_t *ss, uint64_t dof,
                               const int64_t *ds, rs_copy *c) {
  unsigned char *src = random_bytes(SMALL_BUF, 12345);
  int64_t bad = check_copy(ndim, extent, es, src, so, ss, SMALL_BUF, dof, ds, c);
  free(src);
  assert_int_equal(bad, -1);
  assert_int_equal(rs_copy_bytes(c), box_elems(ndim, extent) * es);
}

static void test_contiguous_is_one_run(void **state) {
  (void)state;
  const int64_t extent[3] = {4, 5, 6};
  const int64_t st[3] = {30, 6, 1};
  rs_copy c;
  expect_matches_ref(3, extent, 4, 8, st, 100, st, &c);
  assert_int_equal(c.ndim, 0);
  assert_int_equal(c.run_bytes, 4 * 5 * 6 * 4);
  assert_int_equal(c.src_off, 8);
  assert_int_equal(c.dst_off, 100);
}

static void test_scalar_box(void **state) {
  (void)state;
  rs_copy c;
  expect_matches_ref(0, NULL, 8, 16, NULL, 3, NULL, &c);
  assert_int_equal(c.ndim, 0);
  assert_int_equal(c.run_bytes, 8);
}

static void test_row_major_sub_box(void **state) {
  (void)state;
  /* Rows 2..4, columns 5..11 of a 10x20 matrix into a dense 3x7 block. */
  const int64_t extent[2] = {3, 7};
  const int64_t ss[2] = {20, 1};
  const int64_t ds[2] = {7, 1};
  const size_t es = 2;
  rs_copy c;
  expect_matches_ref(2, extent, es, (2 * 20 + 5) * es, ss, 0, ds, &c);
  assert_int_equal(c.ndim, 1);
  assert_int_equal(c.extent[0], 3);
  assert_int_equal(c.run_bytes, 7 * es);
  assert_int_equal(c.src_stride[0], 20 * (int64_t)es);
  assert_int_equal(c.dst_stride[0], 7 * (int64_t)es);
}

static void test_transpose(void **state) {
  (void)state;
  const int64_t extent[2] = {5, 7};
  const int64_t ss[2] = {7, 1};
  const int64_t ds[2] = {1, 5};
  for (size_t es = 1; es <= 16; es *= 2) {
    rs_copy c;
    expect_matches_ref(2, extent, es, 0, ss, 0, ds, &c);
    assert_int_equal(c.ndim, 2);
    assert_int_equal(c.run_bytes, es);
    assert_int_equal(c.extent[0], 5);
    assert_int_equal(c.extent[1], 7);
    assert_int_equal(c.dst_stride[1], 5 * (int64_t)es);
  }
}

static void test_unit_dims_dropped(void **state) {
  (void)state;
  /* The unit dim's odd strides must not stop the others from merging. */
  const int64_t extent[5] = {1, 3, 1, 4, 1};
  const int64_t ss[5] = {1000, 4, 99, 1, 7};
  const int64_t ds[5] = {-5, 4, 77, 1, 0};
  rs_copy c;
  expect_matches_ref(5, extent, 4, 0, ss, 0, ds, &c);
  assert_int_equal(c.ndim, 0);
  assert_int_equal(c.run_bytes, 3 * 4 * 4);

  /* Unit dims go even when the rest cannot merge. */
  const int64_t ss2[5] = {180, 60, 30, 3, 1};
  const int64_t ds2[5] = {12, 4, 4, 1, 1};
  expect_matches_ref(5, extent, 4, 0, ss2, 0, ds2, &c);
  assert_int_equal(c.ndim, 2);
  assert_int_equal(c.extent[0], 3);
  assert_int_equal(c.extent[1], 4);
  assert_int_equal(c.src_stride[1], 3 * 4);
  assert_int_equal(c.run_bytes, 4);
}

static void test_merge_outer_only(void **state) {
  (void)state;
  /* Dims 0 and 1 are contiguous with each other on both sides (a padded
   * row pitch of 8 elements) but not with the innermost dim. */
  const int64_t extent[3] = {3, 4, 6};
  const int64_t ss[3] = {32, 8, 1};
  const int64_t ds[3] = {24, 6, 1};
  rs_copy c;
  expect_matches_ref(3, extent, 4, 0, ss, 0, ds, &c);
  assert_int_equal(c.ndim, 1);
  assert_int_equal(c.extent[0], 12);
  assert_int_equal(c.src_stride[0], 8 * 4);
  assert_int_equal(c.dst_stride[0], 6 * 4);
  assert_int_equal(c.run_bytes, 6 * 4);
}

static void test_copy_bytes(void **state) {
  (void)state;
  const int64_t extent[4] = {2, 3, 5, 7};
  const int64_t ss[4] = {1, 2, 6, 30};
  const int64_t ds[4] = {105, 35, 7, 1};
  rs_copy c;
  rs_copy_init(&c, 4, extent, 8, 0, 0, ss, 1, 0, ds);
  assert_int_equal(rs_copy_bytes(&c), 2 * 3 * 5 * 7 * 8);
  rs_copy_init(&c, 0, extent, 2, 0, 0, ss, 1, 0, ds);
  assert_int_equal(rs_copy_bytes(&c), 2);
}

/* ------------------------------------------------------------------ */
/* Casts                                                               */
/* ------------------------------------------------------------------ */

static const reshard_dtype_t FLOATS[] = {RESHARD_FP32, RESHARD_BF16, RESHARD_FP16, RESHARD_FP8_E4M3,
                                         RESHARD_FP8_E5M2};

/* A random box cast from one float dtype to another: every destination
 * byte equals the element-by-element walk's, with two sentinels; the
 * descriptor reads elems x source size and writes runs of the
 * destination's size. */
static void run_cast_case(uint64_t seed) {
  rng r = {seed ^ 0x8A5CD789635D2DFFULL};
  rng_next(&r);
  int fi = (int)rng_range(&r, 0, 4), ti = (fi + (int)rng_range(&r, 1, 4)) % 5;
  reshard_dtype_t from = FLOATS[fi], to = FLOATS[ti];
  size_t ses = reshard_dtype_size(from), des = reshard_dtype_size(to);
  int ndim = (int)rng_range(&r, 0, 4);
  int64_t extent[RS_COPY_MAX_DIMS];
  for (int k = 0; k < ndim; k++) extent[k] = rng_range(&r, 0, 4) == 0 ? 1 : rng_range(&r, 1, 12);
  int64_t ss[RS_COPY_MAX_DIMS], ds[RS_COPY_MAX_DIMS];
  int64_t s_base = random_strides(&r, ndim, extent, ss, 1), d_base = random_strides(&r, ndim, extent, ds, 0);
  uint64_t src_off = (uint64_t)(s_base * (int64_t)ses + rng_range(&r, 0, 9));
  uint64_t dst_off = (uint64_t)(d_base * (int64_t)des + rng_range(&r, 0, 9));
  int64_t lo, hi;
  box_span(ndim, extent, ses, ss, &lo, &hi);
  size_t src_size = (size_t)((int64_t)src_off + hi) + 16;
  box_span(ndim, extent, des, ds, &lo, &hi);
  size_t dst_size = (size_t)((int64_t)dst_off + hi) + 16;
  unsigned char *src = random_bytes(src_size, seed), *got = malloc(dst_size), *want = malloc(dst_size);
  assert_true(got && want);
  rs_copy c;
  rs_copy_init_cvt(&c, ndim, extent, from, 3, src_off, ss, to, RS_BUF_STAGING, dst_off, ds);
  const char *why = NULL;
  for (int pass = 0; pass < 2 && !why; pass++) {
    unsigned char flip = pass ? 0x5a : 0xa5;
    fill_sentinel(got, dst_size, flip);
    fill_sentinel(want, dst_size, flip);
    rs_copy_run(&c, src, got);
    int64_t idx[RS_COPY_MAX_DIMS] = {0};
    for (int done = 0; !done;) {
      int64_t so = (int64_t)src_off, d = (int64_t)dst_off;
      for (int k = 0; k < ndim; k++) {
        so += idx[k] * ss[k] * (int64_t)ses;
        d += idx[k] * ds[k] * (int64_t)des;
      }
      rs_cvt_elem(to, want + d, from, src + so);
      int k = ndim - 1;
      while (k >= 0 && ++idx[k] == extent[k]) idx[k--] = 0;
      done = k < 0;
    }
    if (memcmp(got, want, dst_size)) why = "destination differs from the element walk";
  }
  if (!why && rs_copy_bytes(&c) != box_elems(ndim, extent) * ses) why = "rs_copy_bytes != elems x source size";
  if (!why && (c.run_bytes % ses || rs_copy_dst_run(&c) != c.run_bytes / ses * des))
    why = "runs not whole elements of each side";
  if (!why && (c.cvt_from != from + 1 || c.cvt_to != to + 1)) why = "dtypes not stored";
  free(src);
  free(got);
  free(want);
  if (why) {
    print_case(seed, ndim, extent, ses, src_off, ss, dst_off, ds);
    fail_msg("cast case seed=0x%016llx (%s -> %s): %s", (unsigned long long)seed, reshard_dtype_name(from),
             reshard_dtype_name(to), why);
  }
}

static void test_cast_random(void **state) {
  (void)state;
  const char *one = getenv("RS_COPY_SEED");
  if (one && *one) {
    run_cast_case(strtoull(one, NULL, 0));
    return;
  }
  for (uint64_t i = 0; i < 600; i++) run_cast_case(SEED_BASE + i);
}

/* Equal dtypes build the plain copy; a contiguous cast is one run of the
 * source's bytes; registered buffers' composition refuses casts. */
static void test_cast_descriptors(void **state) {
  (void)state;
  int64_t extent[2] = {3, 5}, st[2] = {5, 1};
  rs_copy a, b, p, u, out;
  rs_copy_init_cvt(&a, 2, extent, RESHARD_BF16, 0, 0, st, RESHARD_BF16, 1, 0, st);
  rs_copy_init(&b, 2, extent, 2, 0, 0, st, 1, 0, st);
  assert_memory_equal(&a, &b, sizeof a);
  rs_copy_init_cvt(&a, 2, extent, RESHARD_FP32, 0, 0, st, RESHARD_BF16, 1, 0, st);
  assert_int_equal(a.ndim, 0);
  assert_int_equal(a.run_bytes, 60);
  assert_int_equal(rs_copy_dst_run(&a), 30);
  rs_copy_init_cvt(&p, 2, extent, RESHARD_FP32, 0, 0, st, RESHARD_BF16, RS_BUF_STAGING, 0, st);
  rs_copy_init(&u, 2, extent, 2, RS_BUF_STAGING, 0, st, 1, 0, st);
  /* composed (registered buffers): the pack's cast is the copy's */
  assert_int_equal(rs_copy_compose(&p, &u, &out), 0);
  assert_int_equal(out.cvt_from, RESHARD_FP32 + 1);
  assert_int_equal(out.cvt_to, RESHARD_BF16 + 1);
  assert_int_equal(rs_copy_bytes(&out), 60);
  assert_int_equal(rs_copy_dst_run(&out) * (rs_copy_bytes(&out) / out.run_bytes), 30);
  /* the other side's runs shorter than the cast side's: the composed dims
   * cut inside the pack's one run (f32 source, dense) and the unpack's
   * rows land 7 bf16 apart; and the mirror, the cast in the unpack */
  for (int side = 0; side < 2; side++) {
    int64_t padded[2] = {7, 1};
    float in[15];
    for (int i = 0; i < 15; i++) in[i] = 1.0f + (float)i / 64.0f;
    unsigned char stage[64], want[64], got[64];
    memset(want, 0xA5, sizeof want), memset(got, 0xA5, sizeof got);
    if (side == 0) {
      rs_copy_init_cvt(&p, 2, extent, RESHARD_FP32, 0, 0, st, RESHARD_BF16, RS_BUF_STAGING, 0, st);
      rs_copy_init(&u, 2, extent, 2, RS_BUF_STAGING, 0, st, 1, 0, padded);
    } else {
      rs_copy_init(&p, 2, extent, 4, 0, 0, st, RS_BUF_STAGING, 0, st);
      rs_copy_init_cvt(&u, 2, extent, RESHARD_FP32, RS_BUF_STAGING, 0, st, RESHARD_BF16, 1, 0, padded);
    }
    rs_copy_run(&p, in, stage);
    rs_copy_run(&u, stage, want);
    assert_int_equal(rs_copy_compose(&p, &u, &out), 0);
    assert_true(out.ndim >= 1);
    rs_copy_run(&out, in, got);
    assert_memory_equal(want, got, sizeof want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_contiguous_is_one_run),
      cmocka_unit_test(test_scalar_box),
      cmocka_unit_test(test_row_major_sub_box),
      cmocka_unit_test(test_transpose),
      cmocka_unit_test(test_unit_dims_dropped),
      cmocka_unit_test(test_merge_outer_only),
      cmocka_unit_test(test_copy_bytes),
      cmocka_unit_test(test_compose_random),
      cmocka_unit_test(test_random),
      cmocka_unit_test(test_cast_descriptors),
      cmocka_unit_test(test_cast_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
