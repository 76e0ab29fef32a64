/* The tools' first stages: the stage store (bench/stage_store.h) gives
 * back the stage put, field by field, for random segments (every field
 * over its range, any dims, negative strides, 64-bit offsets), laid out in
 * stream order with its push order when the creation had sorted it, and
 * the same when decoded into memory of an earlier, larger or smaller,
 * stage; a creation's first-replica twin (plan.h rs_plan_agreed.twin) is
 * the stage a creation with RESHARD_FLAG_FIRST_REPLICA keeps, and leaves
 * the creation's own stage as it is without one, on random layouts. The
 * seed is printed on failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "plan/plan.h"
#include "plan_measure.h"
#include "stage_store.h"
#include "support/random_layout.h"

static uint64_t rng_state;

static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Mostly small values, sometimes anything: both ends of the varints. */
static int64_t any64(void) {
  switch (rnd() % 4) {
    case 0: return (int64_t)rnd();
    case 1: return -(int64_t)(rnd() % 1000);
    default: return (int64_t)(rnd() % 5000);
  }
}

static int32_t any32(void) { return (int32_t)any64(); }

/* A random stage of n segments: runs of segments share most fields, as a
 * creation's do, so that the store's differences are exercised both ways. */
static void random_stage(rs_plan_stage *st, size_t n, int sort) {
  memset(st, 0, sizeof *st);
  rs_seg s;
  memset(&s, 0, sizeof s);
  for (size_t i = 0; i < n; i++) {
    if (i == 0 || rnd() % 4 == 0) { /* a new stream */
      s.dir = (int32_t)(rnd() % 3);
      s.from = any32();
      s.to = any32();
      s.peer = any32();
      s.group = rnd() % 2 ? -1 : any32();
      s.origin = any32();
      s.level = (int32_t)(rnd() % 3);
      s.ndim = (int32_t)(rnd() % (RESHARD_MAX_DIMS + 1));
      s.tensor = any32();
      s.vtensor = any32();
      s.buffer = any32();
      s.esize = (uint32_t)any64();
      s.fwd = (int32_t)(rnd() % 2);
    }
    for (int d = 0; d < RESHARD_MAX_DIMS; d++) {
      if (rnd() % 3 == 0) s.extent[d] = any64();
      if (rnd() % 5 == 0) s.strides[d] = any64();
      if (rnd() % 2 == 0) s.gstart[d] = any64();
    }
    s.off = rnd() % 2 ? s.off + (uint64_t)(rnd() % 100000) : rnd();
    s.bytes = (uint64_t)any64();
    s.dep = rnd() % 2 ? -1 : any64();
    s.ndep = any32();
    s.dep_off = rnd() % 2 ? 0 : (uint64_t)any64();
    s.pipe = (int32_t)(rnd() % 2);
    s.besize = (uint32_t)(rnd() % 9);
    s.bdtype = (int32_t)(rnd() % RESHARD_NUM_DTYPES);
    s.wdtype = (int32_t)(rnd() % RESHARD_NUM_DTYPES);
    s.box = rnd() % 3 ? s.box : any32();
    s.piece = rnd() % 3 ? s.piece + 1 : (uint32_t)any64();
    assert_int_equal(rs_seg_vec_push(&st->segs, &s), RESHARD_SUCCESS);
  }
  if (sort) { /* as a creation sizing its streams leaves them */
    rs_streams sz;
    assert_int_equal(rs_streams_size(NULL, &st->segs, &sz), RESHARD_SUCCESS);
    rs_streams_free(&sz);
  }
  st->nlocals = rnd() % 5;
  st->locals = calloc(st->nlocals + 1, sizeof *st->locals);
  assert_non_null(st->locals);
  for (size_t k = 0; k < st->nlocals * sizeof *st->locals; k++) ((unsigned char *)st->locals)[k] = (unsigned char)rnd();
  if (rnd() % 2) {
    st->local_vbox = calloc(st->nlocals + 1, sizeof *st->local_vbox);
    assert_non_null(st->local_vbox);
    for (size_t k = 0; k < st->nlocals * sizeof *st->local_vbox; k++)
      ((unsigned char *)st->local_vbox)[k] = (unsigned char)rnd();
  }
  st->spread = any32();
  st->digest = rnd();
  for (int k = 0; k < RS_PHASE_CANDIDATES; k++) st->phase_est[k] = rnd() % 2 ? rnd() : UINT64_MAX;
  for (int k = 0; k < RS_WIDE_CANDIDATES; k++) st->pace_cand[k] = (rs_pace){rnd(), rnd() % 7, rnd() % 5};
}

/* got[k] must be want's segment w (every field; dims past ndim 0). */
static int same_seg(const rs_seg *g, const rs_seg *w) {
  if (g->peer != w->peer || g->buffer != w->buffer || g->ndim != w->ndim || g->tensor != w->tensor ||
      g->vtensor != w->vtensor || g->esize != w->esize || g->off != w->off || g->bytes != w->bytes ||
      g->dir != w->dir || g->from != w->from || g->to != w->to || g->group != w->group || g->origin != w->origin ||
      g->level != w->level || g->dep != w->dep || g->ndep != w->ndep || g->fwd != w->fwd || g->dep_off != w->dep_off || g->pipe != w->pipe ||
      g->besize != w->besize || g->bdtype != w->bdtype || g->wdtype != w->wdtype || g->box != w->box ||
      g->piece != w->piece)
    return 0;
  for (int d = 0; d < RESHARD_MAX_DIMS; d++) {
    const int in = d < w->ndim;
    if (g->extent[d] != (in ? w->extent[d] : 0) || g->strides[d] != (in ? w->strides[d] : 0) ||
        g->gstart[d] != (in ? w->gstart[d] : 0))
      return 0;
  }
  return 1;
}

static void check_same(const rs_plan_stage *got, const rs_plan_stage *want, int rank, uint64_t seed) {
  const size_t n = want->segs.n;
  if (got->segs.n != n) fail_msg("seed %llu rank %d: %zu segments back, %zu put", (unsigned long long)seed, rank, got->segs.n, n);
  uint32_t *wi = calloc(n + 1, sizeof *wi), *wo = calloc(n + 1, sizeof *wo);
  uint32_t *gi = calloc(n + 1, sizeof *gi), *go = calloc(n + 1, sizeof *go);
  assert_true(wi && wo && gi && go);
  const int sorted = rs_seg_vec_order(&want->segs, wi, wo) == 0;
  /* a sorted stage comes back laid out in that order, its sort kept */
  if (sorted && n && rs_seg_vec_order(&got->segs, gi, go) != 0)
    fail_msg("seed %llu rank %d: the sort was not kept", (unsigned long long)seed, rank);
  /* and an unsorted one without a sort (none left from reused memory) */
  if (!sorted && rs_seg_vec_order(&got->segs, gi, go) == 0)
    fail_msg("seed %llu rank %d: a sort came back with an unsorted stage", (unsigned long long)seed, rank);
  for (size_t k = 0; k < n; k++) {
    const size_t w = sorted ? wi[k] : k;
    if (!same_seg(&got->segs.v[k], &want->segs.v[w]))
      fail_msg("seed %llu rank %d: segment %zu differs from the one put (%zu)", (unsigned long long)seed, rank, k, w);
    if (sorted && (gi[k] != k || go[k] != wo[k]))
      fail_msg("seed %llu rank %d: place %zu: index %u push order %u, want %zu and %u", (unsigned long long)seed, rank, k,
               gi[k], go[k], k, wo[k]);
  }
  free(wi);
  free(wo);
  free(gi);
  free(go);
  if (got->nlocals != want->nlocals || got->spread != want->spread || got->digest != want->digest ||
      (got->local_vbox != NULL) != (want->local_vbox != NULL) ||
      memcmp(got->phase_est, want->phase_est, sizeof got->phase_est) ||
      memcmp(got->pace_cand, want->pace_cand, sizeof got->pace_cand) ||
      (want->nlocals && memcmp(got->locals, want->locals, want->nlocals * sizeof *want->locals)) ||
      (want->local_vbox && want->nlocals &&
       memcmp(got->local_vbox, want->local_vbox, want->nlocals * sizeof *want->local_vbox)))
    fail_msg("seed %llu rank %d: the header, locals or their boxes differ", (unsigned long long)seed, rank);
}

static void round_trip(void **state) {
  (void)state;
  const char *env = getenv("RESHARD_TEST_SEED");
  const uint64_t seed0 = env ? strtoull(env, NULL, 0) : 20261201;
  enum { RANKS = 9 };
  for (uint64_t seed = seed0; seed < seed0 + 6; seed++) {
    rng_state = seed;
    ss_store *store;
    assert_int_equal(ss_store_create(RANKS, &store), RESHARD_SUCCESS);
    rs_plan_stage put[RANKS];
    for (int r = 0; r < RANKS; r++) {
      /* sizes 0 .. several thousand; odd ranks sorted */
      size_t n = r == 0 ? 0 : (size_t)(rnd() % (r < 4 ? 40 : 4000));
      random_stage(&put[r], n, r % 2);
      assert_int_equal(ss_store_put(store, r, &put[r]), RESHARD_SUCCESS);
      assert_int_equal(ss_store_segments(store, r), n);
    }
    /* read back twice, in different orders, into one reused stage: its
     * memory is larger or smaller than the next rank's */
    rs_plan_stage got = {0};
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < RANKS; i++) {
        int r = pass ? RANKS - 1 - i : (i * 4) % RANKS;
        reshard_result_t res = ss_store_get(store, r, &got);
        if (res) fail_msg("seed %llu rank %d: get failed: %s", (unsigned long long)seed, r, reshard_last_error());
        check_same(&got, &put[r], r, seed);
      }
    rs_plan_stage_free(&got);
    for (int r = 0; r < RANKS; r++) rs_plan_stage_free(&put[r]);
    ss_store_free(store);
  }
}

/* A rank never put is an error naming it, not a crash. */
static void missing_rank(void **state) {
  (void)state;
  ss_store *store;
  assert_int_equal(ss_store_create(3, &store), RESHARD_SUCCESS);
  rs_plan_stage got = {0};
  assert_int_equal(ss_store_get(store, 2, &got), RESHARD_ERROR_INTERNAL);
  assert_non_null(strstr(reshard_last_error(), "rank 2"));
  rs_plan_stage_free(&got);
  ss_store_free(store);
}

/* The first stage a creation of rank keeps (and its twin, when asked). */
static void stage_of(const rl_pair *pair, int rank, const reshard_options_t *o, rs_plan_stage *keep, rs_plan_stage *twin,
                     uint64_t seed) {
  memset(keep, 0, sizeof *keep);
  if (twin) memset(twin, 0, sizeof *twin);
  rs_plan_force = (rs_plan_agreed){.stop = RS_PLAN_STOP_STAGE, .keep = keep, .twin = twin};
  reshard_comm_t *comm = NULL;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = pm_plan_rank(pair->src, pair->dst, rank, pair->nranks, o, &comm, &plan);
  rs_plan_force = (rs_plan_agreed){0};
  if (r) {
    rl_pair_print(pair, stderr);
    fail_msg("seed %llu rank %d: the stage failed: %s", (unsigned long long)seed, rank, reshard_last_error());
  }
  pm_plan_free(comm, plan);
}

/* Two stages pushed alike: every segment, local copy and figure. */
static void check_equal_stages(const rs_plan_stage *got, const rs_plan_stage *want, const rl_pair *pair, int rank,
                               uint64_t seed, const char *what) {
  int same = got->segs.n == want->segs.n && got->nlocals == want->nlocals && got->spread == want->spread &&
             got->digest == want->digest && !memcmp(got->phase_est, want->phase_est, sizeof got->phase_est) &&
             !memcmp(got->pace_cand, want->pace_cand, sizeof got->pace_cand) &&
             (!want->nlocals || !memcmp(got->locals, want->locals, want->nlocals * sizeof *want->locals));
  for (size_t k = 0; k < want->segs.n && same; k++) same = same_seg(&got->segs.v[k], &want->segs.v[k]);
  if (!same) {
    rl_pair_print(pair, stderr);
    fail_msg("seed %llu rank %d: %s differs (%zu segments, %zu locals; want %zu, %zu)", (unsigned long long)seed, rank,
             what, got->segs.n, got->nlocals, want->segs.n, want->nlocals);
  }
}

static void twin_is_first_replica_stage(void **state) {
  (void)state;
  const char *env = getenv("RESHARD_TEST_SEED");
  const uint64_t seed0 = env ? strtoull(env, NULL, 0) : 4242;
  for (uint64_t seed = seed0; seed < seed0 + 80; seed++) {
    rl_pair pair;
    if (rl_pair_make(seed, seed % 3 ? RL_ANY : RL_FULL_REPLICAS, &pair)) fail_msg("seed %llu: no layout pair", (unsigned long long)seed);
    reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
    o.relay = 0;
    if (seed % 2) o.topology = "h100-8x400g"; /* the domains steer the direct plan's holders */
    reshard_options_t first = o;
    first.flags |= RESHARD_FLAG_FIRST_REPLICA;
    for (int r = 0; r < pair.nranks; r++) {
      rs_plan_stage with, twin, alone, flagged;
      stage_of(&pair, r, &o, &with, &twin, seed);
      stage_of(&pair, r, &o, &alone, NULL, seed);
      stage_of(&pair, r, &first, &flagged, NULL, seed);
      check_equal_stages(&twin, &flagged, &pair, r, seed, "the twin stage");
      check_equal_stages(&with, &alone, &pair, r, seed, "the stage made with a twin");
      rs_plan_stage_free(&with);
      rs_plan_stage_free(&twin);
      rs_plan_stage_free(&alone);
      rs_plan_stage_free(&flagged);
    }
    rl_pair_free(&pair);
  }
}

/* A twin is refused, changing nothing, where it has no meaning. */
static void twin_refused(void **state) {
  (void)state;
  rl_pair pair;
  assert_int_equal(rl_pair_make(7, RL_FULL_REPLICAS, &pair), 0);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.relay = 0;
  o.flags = RESHARD_FLAG_FIRST_REPLICA;
  rs_plan_stage keep = {0}, twin = {0};
  rs_plan_force = (rs_plan_agreed){.stop = RS_PLAN_STOP_STAGE, .keep = &keep, .twin = &twin};
  reshard_comm_t *comm = NULL;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = pm_plan_rank(pair.src, pair.dst, 0, pair.nranks, &o, &comm, &plan);
  rs_plan_force = (rs_plan_agreed){0};
  assert_int_equal(r, RESHARD_ERROR_INVALID_USAGE);
  assert_non_null(strstr(reshard_last_error(), "twin"));
  assert_int_equal(twin.segs.n, 0);
  assert_null(plan);
  rs_plan_stage_free(&keep);
  rs_plan_stage_free(&twin);
  rl_pair_free(&pair);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip),
      cmocka_unit_test(missing_rank),
      cmocka_unit_test(twin_is_first_replica_stage),
      cmocka_unit_test(twin_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
