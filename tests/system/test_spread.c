/* Source-side spreading (src/plan/spread.h, issue 20): where some source
 * ranks of an NVLink domain hold far more of what leaves the domain than
 * the others, plan creation copies slices of their sole-held data to the
 * others over NVLink first, and those send them on.
 *
 * Every destination element is checked against the self-test's values
 * from global coordinates, and every byte outside destination fragments
 * against its sentinel (reshard_selftest_check_from), over two steps so
 * that the scratch is reused.
 *
 * moe_stage: one pipeline stage's experts with one replica each (two
 * ranks of a domain of eight hold them, the other six hold a replicated
 * dense tensor): the cost model keeps the spread plan, predicts it faster
 * than the plain one, the busiest rank's egress falls, and the bytes are
 * right; RESHARD_FLAG_NO_SPREAD gives the plain plan.
 * balanced: every rank holds as much as the others: nothing spreads.
 * random_layouts: seeded random pairs with RESHARD_FLAG_SPREAD_ALWAYS on
 * a topology (relays and small staging on some), byte-exact whether or
 * not they spread; the suite must spread in a good share of them.
 * RS_SPREAD_SEED=<n> replays one seed verbosely.
 * flags: the two flags together are refused on every rank.
 * alloc_faults: each allocation of a spreading creation on a rank that
 * takes copies fails in turn: either every rank fails (that rank with
 * OUT_OF_MEMORY, the others REMOTE), or, where the scratch itself could
 * not be had, every rank keeps the plain plan, which moves every byte
 * right; the sweep must meet that fallback. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/alloc.h"
#include "plan/plan.h"
#include "plan/spread.h"
#include "reshard.h"
#include "reshard_selftest.h"
#include "support/harness.h"
#include "support/random_layout.h"
#include "support/test_scale.h"

typedef struct run {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  int steps;
  reshard_result_t expect; /* plan creation's result on every rank */
  /* results */
  int spread[64];         /* per rank: the plan spreads */
  uint64_t egress[64];    /* per rank: bytes sent out of its domain (main plan) */
  double seconds;         /* predicted (with a topology) */
  int64_t bad;
  int failures;
  pthread_mutex_t lock;
} run;

static int run_rank(int rank, reshard_comm_t *comm, void *arg) {
  run *a = arg;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, a->src, a->dst, &a->opts, &plan);
  if (a->expect) {
    int ok = r == a->expect && !plan;
    if (!ok) fprintf(stderr, "rank %d: plan_create gave %s, expected %s\n", rank, reshard_result_string(r),
                     reshard_result_string(a->expect));
    pthread_mutex_lock(&a->lock);
    a->failures += !ok;
    pthread_mutex_unlock(&a->lock);
    return !ok;
  }
  if (r) {
    fprintf(stderr, "rank %d: plan_create failed: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
    pthread_mutex_lock(&a->lock);
    a->failures++;
    pthread_mutex_unlock(&a->lock);
    return 1;
  }
  int fails = 0;
  double seconds = 0;
  if (plan->has_topo) {
    reshard_estimate_t e = RESHARD_ESTIMATE_INITIALIZER;
    if (reshard_plan_estimate(plan, &e)) {
      fprintf(stderr, "rank %d: estimate failed: %s\n", rank, reshard_last_error());
      fails++;
    }
    seconds = e.seconds;
  }
  uint64_t egress = 0;
  for (size_t i = 0; plan->has_topo && i < plan->npeers; i++)
    if (plan->map.domain[plan->peers[i].peer] != plan->map.domain[rank]) egress += plan->peers[i].send_bytes;
  int64_t bad = 0;
  reshard_selftest_t dst;
  if (reshard_selftest_alloc(&dst, a->dst, rank, -1)) fails++;
  for (int step = 0; step < a->steps && !fails; step++) {
    reshard_selftest_t src;
    if (reshard_selftest_alloc(&src, a->src, rank, step)) {
      fails++;
      break;
    }
    r = reshard_plan_execute(plan, (void *const *)src.ptr, (size_t)src.nbuf, (void *const *)dst.ptr,
                             (size_t)dst.nbuf, NULL);
    if (r) {
      fprintf(stderr, "rank %d: execute failed: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
      fails++;
    } else {
      bad += reshard_selftest_check_from(&dst, a->dst, a->src, rank, (uint64_t)step, "spread");
    }
    reshard_selftest_free(&src);
  }
  reshard_selftest_free(&dst);
  pthread_mutex_lock(&a->lock);
  if (rank < 64) {
    a->spread[rank] = plan->spread != NULL;
    a->egress[rank] = egress;
  }
  if (rank == 0) a->seconds = seconds;
  a->bad += bad;
  a->failures += fails;
  pthread_mutex_unlock(&a->lock);
  reshard_plan_destroy(plan);
  return fails || bad;
}

static void run_world(int nranks, run *a) {
  a->bad = 0;
  a->failures = 0;
  memset(a->spread, 0, sizeof a->spread);
  memset(a->egress, 0, sizeof a->egress);
  pthread_mutex_init(&a->lock, NULL);
  th_run_ranks(nranks, run_rank, a);
  pthread_mutex_destroy(&a->lock);
}

static reshard_result_t placed(reshard_layout_t *L, const char *name, int t, int mesh, const reshard_placement_t *pl,
                               int *b) {
  reshard_part_t part = {t, mesh, pl, NULL};
  return reshard_layout_add_fused(L, name, 0, 1, 1, &part, b);
}

/* Ranks 0..7 (one h100-8x400g domain) hold the source: "experts"
 * [4, rows, 512] bf16 split over ranks 0 and 1 by expert (one replica
 * each), "dense" [256, 256] f32 replicated on all eight (or, balanced,
 * the experts split over all eight). Ranks 8..15 take both split by rows. */
static void moe_layouts_q(int64_t rows, int balanced, int fp8, reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t es[3] = {balanced ? 8 : 4, rows, 512}, ds[2] = {256, 256};
  int e, d, m, b;
  assert_int_equal(reshard_layout_create(src), 0);
  assert_int_equal(reshard_layout_add_tensor(*src, "experts", RESHARD_BF16, 3, es, &e), 0);
  assert_int_equal(reshard_layout_add_tensor(*src, "dense", RESHARD_FP32, 2, ds, &d), 0);
  int r8[8] = {0, 1, 2, 3, 4, 5, 6, 7}, sh8[1] = {8}, sh2[1] = {2};
  assert_int_equal(reshard_layout_add_mesh(*src, 1, balanced ? sh8 : sh2, r8, &m), 0);
  reshard_placement_t s0 = {RESHARD_PLACEMENT_SHARD, 0, NULL}, rep = {RESHARD_PLACEMENT_REPLICATE, 0, NULL};
  assert_int_equal(placed(*src, "experts", e, m, &s0, &b), 0);
  int m8;
  assert_int_equal(reshard_layout_add_mesh(*src, 1, sh8, r8, &m8), 0);
  assert_int_equal(placed(*src, "dense", d, m8, &rep, &b), 0);

  assert_int_equal(reshard_layout_create(dst), 0);
  const int64_t block[2] = {128, 128};
  if (fp8)
    assert_int_equal(reshard_layout_add_tensor_blocked(*dst, "experts", RESHARD_FP8_E4M3, 3, es, block, &e), 0);
  else
    assert_int_equal(reshard_layout_add_tensor(*dst, "experts", RESHARD_BF16, 3, es, &e), 0);
  assert_int_equal(reshard_layout_add_tensor(*dst, "dense", RESHARD_FP32, 2, ds, &d), 0);
  int q8[8] = {8, 9, 10, 11, 12, 13, 14, 15};
  assert_int_equal(reshard_layout_add_mesh(*dst, 1, sh8, q8, &m), 0);
  reshard_placement_t s1 = {RESHARD_PLACEMENT_SHARD, 1, NULL};
  assert_int_equal(placed(*dst, "experts", e, m, &s1, &b), 0);
  assert_int_equal(placed(*dst, "dense", d, m, &s0, &b), 0);
  if (fp8) /* the scales, [experts, rows / 128, 4], split like their weight */
    assert_int_equal(placed(*dst, "experts_scale_inv", e + 1, m, &s1, &b), 0);
}

static void moe_layouts(int64_t rows, int balanced, reshard_layout_t **src, reshard_layout_t **dst) {
  moe_layouts_q(rows, balanced, 0, src, dst);
}

static void moe_stage(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  moe_layouts(1024, 0, &src, &dst); /* 4 MiB of experts, 2 MiB on each of ranks 0 and 1 */
  static run a;
  memset(&a, 0, sizeof a);
  a.src = src, a.dst = dst, a.steps = 2;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.topology = "h100-8x400g";
  a.opts.relay = 0;
  a.opts.flags = RESHARD_FLAG_NO_SPREAD;
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  assert_int_equal(a.bad, 0);
  const double plain = a.seconds;
  const uint64_t plain_egress = a.egress[0];
  for (int q = 0; q < 16; q++) assert_int_equal(a.spread[q], 0);
  assert_true(plain_egress >= ((uint64_t)2 << 20)); /* rank 0 sends its experts itself */

  a.opts.flags = 0; /* the cost model decides */
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  assert_int_equal(a.bad, 0);
  for (int q = 0; q < 16; q++) assert_int_equal(a.spread[q], 1);
  fprintf(stderr, "moe_stage: predicted %.1f us spread (pre-plan included) against %.1f us plain; rank 0 sends "
          "%llu bytes out of its domain against %llu\n",
          a.seconds * 1e6, plain * 1e6, (unsigned long long)a.egress[0], (unsigned long long)plain_egress);
  assert_true(a.seconds < plain);
  assert_true(a.egress[0] < plain_egress / 2);
  /* the idle ranks send now */
  for (int q = 2; q < 8; q++) assert_true(a.egress[q] > a.egress[0] / 4);

  /* relays on top: still byte-exact */
  a.opts.relay = 1;
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  assert_int_equal(a.bad, 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* Block quantization and spreading together: the main plan of a
 * quantizing plan spreads the codes and scales the experts' ranks made. */
static void moe_stage_fp8(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  moe_layouts_q(1024, 0, 1, &src, &dst);
  static run a;
  memset(&a, 0, sizeof a);
  a.src = src, a.dst = dst, a.steps = 2;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.topology = "h100-8x400g";
  a.opts.flags = RESHARD_FLAG_NO_SPREAD;
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  assert_int_equal(a.bad, 0);
  const uint64_t plain_egress = a.egress[0];
  a.opts.flags = RESHARD_FLAG_SPREAD_ALWAYS;
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  assert_int_equal(a.bad, 0);
  for (int q = 0; q < 8; q++) assert_int_equal(a.spread[q], 1);
  fprintf(stderr, "moe_stage_fp8: rank 0 sends %llu bytes out of its domain against %llu\n",
          (unsigned long long)a.egress[0], (unsigned long long)plain_egress);
  assert_true(a.egress[0] < plain_egress / 2);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void balanced(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  moe_layouts(512, 1, &src, &dst);
  static run a;
  memset(&a, 0, sizeof a);
  a.src = src, a.dst = dst, a.steps = 1;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.topology = "h100-8x400g";
  a.opts.flags = RESHARD_FLAG_SPREAD_ALWAYS;
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  assert_int_equal(a.bad, 0);
  for (int q = 0; q < 16; q++) assert_int_equal(a.spread[q], 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void flags(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  moe_layouts(8, 0, &src, &dst);
  static run a;
  memset(&a, 0, sizeof a);
  a.src = src, a.dst = dst, a.steps = 1;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.flags = RESHARD_FLAG_NO_SPREAD | RESHARD_FLAG_SPREAD_ALWAYS;
  a.expect = RESHARD_ERROR_INVALID_ARGUMENT;
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  /* without a topology nothing spreads, whatever the flag */
  a.opts.flags = RESHARD_FLAG_SPREAD_ALWAYS;
  a.expect = RESHARD_SUCCESS;
  run_world(16, &a);
  assert_int_equal(a.failures, 0);
  assert_int_equal(a.bad, 0);
  for (int q = 0; q < 16; q++) assert_int_equal(a.spread[q], 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static int one_seed(uint64_t seed, int verbose, int *spread) {
  rl_pair pair;
  if (rl_pair_make(seed, RL_ANY, &pair)) return 1;
  if (verbose) rl_pair_print(&pair, stderr);
  static run a;
  memset(&a, 0, sizeof a);
  a.src = pair.src, a.dst = pair.dst, a.steps = 2;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  /* presets with NVLink domains (the source side fills the first one,
   * ranks only on the destination side start the next) */
  a.opts.topology = seed % 2 ? "h100-8x400g" : "gb200-nvl72";
  a.opts.flags = RESHARD_FLAG_SPREAD_ALWAYS;
  a.opts.relay = (int)(seed % 3) - 1;
  if (seed % 4 == 1) a.opts.staging_bytes = 4096;
  run_world(pair.nranks, &a);
  int any = 0;
  for (int q = 0; q < pair.nranks && q < 64; q++) any |= a.spread[q];
  *spread = any;
  int bad = a.failures || a.bad;
  if (bad) {
    fprintf(stderr, "random_layouts: seed %llu failed (%d failures, %lld wrong), relay %d, topology %s, staging %zu; "
            "replay with RS_SPREAD_SEED=%llu\n",
            (unsigned long long)seed, a.failures, (long long)a.bad, a.opts.relay, a.opts.topology,
            a.opts.staging_bytes, (unsigned long long)seed);
    if (!verbose) rl_pair_print(&pair, stderr);
  }
  rl_pair_free(&pair);
  return bad;
}

static void random_layouts(void **state) {
  (void)state;
  const char *one = getenv("RS_SPREAD_SEED");
  if (one) {
    int sp;
    assert_int_equal(one_seed(strtoull(one, NULL, 10), 1, &sp), 0);
    return;
  }
  int failed = 0, spread = 0, n = (int)rs_test_scaled(300);
  for (int i = 0; i < n; i++) {
    int sp = 0;
    failed += one_seed(0x5eed0000u + (uint64_t)i, 0, &sp);
    spread += sp;
  }
  fprintf(stderr, "random_layouts: %d of %d pairs spread\n", spread, n);
  assert_int_equal(failed, 0);
  assert_true(spread >= (n >= 100 ? n / 10 : 1));
}

typedef struct sweep {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  int victim;
  long n;
  pthread_barrier_t bar;
  int fired;
  reshard_result_t r[16];
  int spread[16];
  int64_t bad;
} sweep;

static int sweep_rank(int rank, reshard_comm_t *comm, void *arg) {
  sweep *s = arg;
  if (rank == s->victim) rs_alloc_fail_after(s->n);
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, s->src, s->dst, &s->opts, &plan);
  if (rank == s->victim) {
    s->fired = rs_alloc_fault_fired();
    rs_alloc_fail_after(-1);
  }
  s->r[rank] = r;
  s->spread[rank] = plan && plan->spread;
  pthread_barrier_wait(&s->bar);
  int64_t bad = 0;
  if (plan) {
    reshard_selftest_t in, out;
    if (reshard_selftest_alloc(&in, s->src, rank, 1) || reshard_selftest_alloc(&out, s->dst, rank, -1)) {
      bad = 1;
    } else {
      if (reshard_plan_execute(plan, (void *const *)in.ptr, (size_t)in.nbuf, (void *const *)out.ptr, (size_t)out.nbuf,
                               NULL))
        bad = 1;
      else
        bad = reshard_selftest_check_from(&out, s->dst, s->src, rank, 1, "alloc_faults");
      reshard_selftest_free(&in);
      reshard_selftest_free(&out);
    }
    reshard_plan_destroy(plan);
  }
  __atomic_fetch_add(&s->bad, bad, __ATOMIC_RELAXED);
  return 0;
}

/* One creation with rank s->victim's allocation s->n failing: 0 past
 * the last allocation (a clean spread plan), 1 failed everywhere, 2 fell
 * back to the plain plan everywhere. */
static int sweep_one(sweep *s, int fp8) {
  assert_int_equal(pthread_barrier_init(&s->bar, NULL, 16), 0);
  s->fired = 0;
  th_run_ranks(16, sweep_rank, s);
  pthread_barrier_destroy(&s->bar);
  assert_int_equal(s->bad, 0);
  if (!s->fired) {
    for (int q = 0; q < 16; q++) assert_int_equal(s->r[q], RESHARD_SUCCESS);
    assert_int_equal(s->spread[0], 1);
    return 0;
  }
  if (s->r[s->victim] == RESHARD_SUCCESS) {
    for (int q = 0; q < 16; q++) {
      assert_int_equal(s->r[q], RESHARD_SUCCESS);
      assert_int_equal(s->spread[q], 0);
    }
    return 2;
  }
  for (int q = 0; q < 16; q++)
    if (s->r[q] != (q == s->victim ? RESHARD_ERROR_OUT_OF_MEMORY : RESHARD_ERROR_REMOTE))
      fail_msg("%s, rank %d's allocation %ld failed: rank %d returned %s", fp8 ? "fp8" : "bf16", s->victim, s->n, q,
               reshard_result_string(s->r[q]));
  return 1;
}

/* Sweeps the allocations of rank `victim` in creation: each fails in
 * turn (RESHARD_TEST_SCALE < 1: every 1/scale-th, then the last ones
 * densely, where the scratch is allocated); counts the creations that
 * failed everywhere and those that fell back to the plain plan. */
static void sweep_allocs(int fp8, int victim, int *failures, int *fallbacks) {
  reshard_layout_t *src, *dst;
  moe_layouts_q(fp8 ? 256 : 64, 0, fp8, &src, &dst);
  static sweep s;
  memset(&s, 0, sizeof s);
  s.src = src, s.dst = dst;
  s.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  s.opts.topology = "h100-8x400g";
  s.opts.relay = 0;
  s.opts.flags = RESHARD_FLAG_SPREAD_ALWAYS;
  s.victim = victim;
  const double scale = rs_test_scale();
  const long stride = scale < 1 ? (long)(1 / scale + 0.5) : 1;
  int counts[3] = {0, 0, 0}, k = 1;
  long n = 0, swept = 0;
  for (; n < 100000 && k; n += stride) {
    s.n = n;
    k = sweep_one(&s, fp8);
    counts[k]++;
    swept++;
  }
  for (long m = n - 2 * stride + 1; stride > 1 && m < n - stride; m++) { /* the last ones, densely */
    if (m < 0) continue;
    s.n = m;
    k = sweep_one(&s, fp8);
    counts[k]++;
    swept++;
  }
  *failures = counts[1];
  *fallbacks = counts[2];
  fprintf(stderr, "alloc_faults: %s, rank %d: %ld allocations swept (every %ld-th, then the last densely), %d failed "
          "creation everywhere, %d fell back to the plain plan\n", fp8 ? "fp8" : "bf16", victim, swept, stride,
          *failures, *fallbacks);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void alloc_faults(void **state) {
  (void)state;
  int failures, fallbacks;
  sweep_allocs(0, 2, &failures, &fallbacks); /* rank 2 takes copies from rank 0 */
  assert_true(fallbacks >= 1);
  assert_true(failures > 0);
  /* a source rank of a quantizing plan: its rewrite, its quantization
   * scratch, the spreading decision (its peers plan the rewritten
   * layouts; a failure here must read REMOTE there, not MISMATCH) */
  sweep_allocs(1, 0, &failures, &fallbacks);
  assert_true(failures > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(moe_stage),
      cmocka_unit_test(moe_stage_fp8),
      cmocka_unit_test(balanced),
      cmocka_unit_test(flags),
      cmocka_unit_test(random_layouts),
      cmocka_unit_test(alloc_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
