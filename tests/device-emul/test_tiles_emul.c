/* The kernels' tile body (kernels/rs_tile.h), run on the CPU one simulated
 * thread after another, against the host reference rs_copy_run: random
 * descriptors (transposes, odd element sizes, misaligned offsets, reversed
 * dims), every tile size path and thread count, byte-exact over the whole
 * destination (bytes outside the box must keep their sentinel). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

/* Every access of width w must be w-aligned on both sides, as on a GPU. */
static unsigned long long misaligned;
#define RS_TILE_CHECK_ALIGN(d, s, w) \
  misaligned += (((uintptr_t)(d) | (uintptr_t)(s)) & ((w) - 1)) != 0
#include "device/device.h"
#include "device-emul/rand_copies.h"
#include "kernels/rs_tile.h"

static void emulate(const rs_copy *c, size_t n, uint64_t tile_bytes,
                    unsigned nthreads, const unsigned char *src,
                    unsigned char *dst) {
  uint64_t nt = rs_tiles_count(c, n, tile_bytes);
  rs_tile *t = malloc((nt ? nt : 1) * sizeof *t);
  assert_non_null(t);
  rs_tiles_build(c, n, 0, tile_bytes, t);
  for (uint64_t i = 0; i < nt; i++) {
    assert_true(t[i].desc < n);
    assert_true(t[i].b1 > t[i].b0 && t[i].b1 <= c[t[i].desc].run_bytes);
    for (unsigned tid = 0; tid < nthreads; tid++)
      rs_tile_copy(&c[t[i].desc], &t[i], src, dst, tid, nthreads);
  }
  free(t);
}

static void random_batches(void **state) {
  (void)state;
  uint64_t seed0 = 0x5eedULL ^ (uint64_t)time(NULL);
  const uint64_t tiles[] = {16, 64, 4096, 65536};
  const unsigned threads[] = {1, 3, 32, 256};
  for (int iter = 0; iter < 300; iter++) {
    uint64_t seed = seed0 + (uint64_t)iter * 7919, s = seed;
    size_t n = (size_t)rc_range(&s, 1, 6);
    rs_copy c[6];
    uint64_t sb = 0, db = 0;
    for (size_t i = 0; i < n; i++) {
      uint64_t sl, dl;
      rc_copy(&s, sb, db, &c[i], &sl, &dl);
      sb += sl;
      db += dl;
    }
    unsigned char *src = malloc(sb), *ref = malloc(db), *got = malloc(db);
    assert_true(src && ref && got);
    for (uint64_t i = 0; i < sb; i++) src[i] = (unsigned char)(rc_rand(&s) >> 56);
    memset(ref, 0xa5, db);
    for (size_t i = 0; i < n; i++) rs_copy_run(&c[i], src, ref);
    uint64_t tb = tiles[iter % 4];
    unsigned nth = threads[(iter / 4) % 4];
    /* misaligned bases: the same box at every address alignment */
    memset(got, 0xa5, db);
    emulate(c, n, tb, nth, src, got);
    if (misaligned) fail_msg("seed %llu: %llu misaligned accesses", (unsigned long long)seed, misaligned);
    if (memcmp(ref, got, db) != 0) {
      uint64_t i = 0;
      while (ref[i] == got[i]) i++;
      fail_msg("seed %llu: tile %llu threads %u: byte %llu differs (%02x, reference %02x)",
               (unsigned long long)seed, (unsigned long long)tb, nth, (unsigned long long)i, got[i], ref[i]);
    }
    free(src);
    free(ref);
    free(got);
  }
}

/* Tiles of long runs are 16-byte aligned slices, so the width choice is
 * the same as for whole runs; short runs pack whole into tiles. */
static void tile_shapes(void **state) {
  (void)state;
  rs_copy c;
  int64_t ext[2] = {3, 1000}, ss[2] = {1000, 1}, ds[2] = {2000, 1};
  rs_copy_init(&c, 2, ext, 8, 0, 0, ss, 0, 0, ds);
  assert_int_equal(c.ndim, 1);
  assert_int_equal(c.run_bytes, 8000);
  assert_int_equal(rs_tiles_count(&c, 1, 4096), 6); /* 2 per run */
  rs_tile t[6];
  rs_tiles_build(&c, 1, 5, 4096, t);
  assert_int_equal(t[1].b0, 4096);
  assert_int_equal(t[1].b1, 8000);
  assert_int_equal(t[5].run0, 2);
  assert_int_equal(t[5].desc, 5);
  /* an empty box has no tiles */
  int64_t e0[1] = {0}, one[1] = {1};
  rs_copy_init(&c, 1, e0, 4, 0, 0, one, 0, 0, one);
  assert_int_equal(rs_tiles_count(&c, 1, 4096), 0);
}

/* 64-bit index math: run offsets of a box far beyond 2^31 elements and
 * 2^32 bytes (checked arithmetically: such buffers do not fit here). */
static void offsets_beyond_2_31(void **state) {
  (void)state;
  rs_copy c;
  memset(&c, 0, sizeof c);
  c.ndim = 2;
  c.run_bytes = 2;
  c.extent[0] = 3;
  c.extent[1] = (int64_t)1 << 33;
  c.src_stride[0] = (int64_t)1 << 40;
  c.src_stride[1] = 6;
  c.dst_stride[0] = -((int64_t)1 << 36);
  c.dst_stride[1] = 2;
  int64_t so, dof;
  uint64_t r = 2 * ((uint64_t)1 << 33) + ((uint64_t)1 << 33) - 1; /* the last run */
  rs_tile_run_offsets(&c, r, &so, &dof);
  assert_true(so == 2 * ((int64_t)1 << 40) + (((int64_t)1 << 33) - 1) * 6);
  assert_true(dof == -2 * ((int64_t)1 << 36) + (((int64_t)1 << 33) - 1) * 2);
  assert_true(rs_tiles_count(&c, 1, 65536) == 3 * (((uint64_t)1 << 33) / 32768));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(random_batches),
      cmocka_unit_test(tile_shapes),
      cmocka_unit_test(offsets_beyond_2_31),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
