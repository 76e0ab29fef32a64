/* Tensors whose dtype differs between the sides (issue 19, item 1): f32,
 * bf16, f16, fp8e4m3 and fp8e5m2 into each other, cast in flight where the
 * wire is narrower. Every destination element is checked against the
 * source's value cast by the self-test's reference (src/selftest/
 * ref_cast.c, written apart from the library's casts), every byte outside
 * the destination fragments against its sentinel (th_sync).
 *
 * random_casts: seeded random layout pairs (tests/support/random_layout.h,
 * RL_CASTS: fused buffers, padding, raw strided fragments, replicas,
 * colocated ranks whose local copies cast), two steps each, half of them
 * with relays asked for (converted tensors stay direct). RS_CAST_SEED=<n>
 * replays one seed and prints its layout calls.
 * wire_bytes: the bytes on the wire are the narrower dtype's, whichever
 * side it is on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "reshard.h"
#include "support/harness.h"
#include "support/random_layout.h"

static int run_seed(uint64_t seed, int verbose) {
  rl_pair pair;
  if (rl_pair_make(seed, RL_CASTS, &pair)) return 1;
  if (verbose) rl_pair_print(&pair, stderr);
  static th_sync_args a;
  memset(&a, 0, sizeof a);
  a.src = pair.src;
  a.dst = pair.dst;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.relay = (int)(seed & 1);
  if (seed % 3 == 0) a.opts.staging_bytes = 4096; /* small staging: boxes cut across messages */
  a.steps = 2;
  int64_t bad = th_sync(pair.nranks, &a);
  if (bad) {
    fprintf(stderr, "random_casts: seed %llu: %lld wrong (%d API failures); layout calls:\n", (unsigned long long)seed,
            (long long)bad, a.api_failures);
    if (!verbose) rl_pair_print(&pair, stderr);
  }
  rl_pair_free(&pair);
  return bad != 0;
}

static void random_casts(void **state) {
  (void)state;
  const char *one = getenv("RS_CAST_SEED");
  if (one && *one) {
    assert_int_equal(run_seed(strtoull(one, NULL, 0), 1), 0);
    return;
  }
  int failed = 0;
  for (uint64_t seed = 1; seed <= 200 && failed < 3; seed++) failed += run_seed(seed, 0);
  assert_int_equal(failed, 0);
}

/* One tensor w [64, 32] of dtype sdt, sharded by rows over ranks 0 and 1,
 * to ranks 2 and 3 as dtype ddt, each holding all of it. */
static void two_to_two(reshard_dtype_t sdt, reshard_dtype_t ddt, th_sync_args *a) {
  reshard_layout_t *src, *dst;
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  int64_t shape[2] = {64, 32};
  int t, m, b, r01[2] = {0, 1}, r23[2] = {2, 3}, two = 2;
  assert_int_equal(reshard_layout_add_tensor(src, "w", sdt, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(src, 1, &two, r01, &m), 0);
  reshard_placement_t s0 = reshard_shard(0), rep = reshard_replicate();
  assert_int_equal(reshard_layout_place(src, t, m, &s0, &b), 0);
  assert_int_equal(reshard_layout_add_tensor(dst, "w", ddt, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(dst, 1, &two, r23, &m), 0);
  assert_int_equal(reshard_layout_place(dst, t, m, &rep, &b), 0);
  memset(a, 0, sizeof *a);
  a->src = src;
  a->dst = dst;
  a->opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a->steps = 2;
  assert_int_equal(th_sync(4, a), 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void wire_bytes(void **state) {
  (void)state;
  static const struct {
    reshard_dtype_t s, d;
    size_t wire; /* bytes per element between ranks */
  } cases[] = {
      {RESHARD_FP32, RESHARD_BF16, 2},     /* the sender casts */
      {RESHARD_BF16, RESHARD_FP32, 2},     /* the receiver casts */
      {RESHARD_BF16, RESHARD_FP16, 2},     /* equal sizes: the receiver casts */
      {RESHARD_FP32, RESHARD_FP8_E4M3, 1}, /* a quarter of the bytes */
      {RESHARD_FP8_E5M2, RESHARD_FP16, 1},
      {RESHARD_FP32, RESHARD_FP32, 4}, /* no cast */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    static th_sync_args a;
    two_to_two(cases[i].s, cases[i].d, &a);
    /* each source rank sends its 32 rows to both destinations */
    for (int r = 0; r < 2; r++) {
      if (a.send_bytes[r] != 2 * 32 * 32 * cases[i].wire)
        fail_msg("%s -> %s: rank %d sent %zu bytes, want %zu", reshard_dtype_name(cases[i].s),
                 reshard_dtype_name(cases[i].d), r, a.send_bytes[r], 2 * 32 * 32 * cases[i].wire);
    }
    for (int r = 2; r < 4; r++) assert_int_equal(a.recv_bytes[r], 64 * 32 * cases[i].wire);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(wire_bytes),
      cmocka_unit_test(random_casts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
