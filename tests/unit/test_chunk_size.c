/* The derived chunk size (docs/ARCHITECTURE.md, step 5): a stream takes
 * at most min(its bytes, chunk) of a round's staging, so a rank with one
 * long stream and several tiny ones gets messages almost as large as its
 * whole budget, not budget / (2 x streams), and still stays within the
 * budget. Messages are filled across box boundaries. Data is checked
 * byte for byte with the harness. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "plan/plan.h"
#include "plan/relay.h"
#include "support/harness.h"

enum { NRANKS = 5, BIG = 65536, TINY = 16 };
#define STAGING ((size_t)65536)

/* Source: "big" on rank 1, "tiny<r>" on rank r (1..4). Destination:
 * everything on rank 0, so rank 0 has four receive streams, one long. */
static void build(reshard_layout_t **src, reshard_layout_t **dst) {
  reshard_placement_t rep = reshard_replicate();
  int one = 1;
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L;
    assert_int_equal(reshard_layout_create(&L), RESHARD_SUCCESS);
    int t, m, b;
    int64_t shape = BIG;
    assert_int_equal(reshard_layout_add_tensor(L, "big", RESHARD_FP32, 1, &shape, &t), RESHARD_SUCCESS);
    int rank = side ? 1 : 0;
    assert_int_equal(reshard_layout_add_mesh(L, 1, &one, &rank, &m), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_place(L, t, m, &rep, &b), RESHARD_SUCCESS);
    for (int r = 1; r < NRANKS; r++) {
      char name[16];
      snprintf(name, sizeof name, "tiny%d", r);
      shape = TINY;
      assert_int_equal(reshard_layout_add_tensor(L, name, RESHARD_FP32, 1, &shape, &t), RESHARD_SUCCESS);
      rank = side ? r : 0;
      assert_int_equal(reshard_layout_add_mesh(L, 1, &one, &rank, &m), RESHARD_SUCCESS);
      assert_int_equal(reshard_layout_place(L, t, m, &rep, &b), RESHARD_SUCCESS);
    }
    *(side ? src : dst) = L;
  }
}

typedef struct stats_args {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  reshard_plan_stats_t st[16];
} stats_args;

static int stats_rank(int rank, reshard_comm_t *comm, void *arg) {
  stats_args *a = arg;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, a->src, a->dst, &a->opts, &plan) != RESHARD_SUCCESS) return 1;
  int bad = reshard_plan_get_stats(plan, &a->st[rank]) != RESHARD_SUCCESS;
  reshard_plan_destroy(plan);
  return bad;
}

/* Two executes on nranks, every destination element and the bytes
 * around each fragment checked by the harness. */
static void sync_twice(int nranks, const reshard_layout_t *src, const reshard_layout_t *dst, const reshard_options_t *opts) {
  static th_sync_args s;
  memset(&s, 0, sizeof s);
  s.src = src;
  s.dst = dst;
  s.opts = *opts;
  s.steps = 2;
  assert_int_equal(th_sync(nranks, &s), 0);
}

static void test_long_stream_gets_most_of_the_budget(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  build(&src, &dst);
  static stats_args a;
  memset(&a, 0, sizeof a);
  a.src = src;
  a.dst = dst;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.staging_bytes = STAGING;
  assert_int_equal(th_run_ranks(NRANKS, stats_rank, &a), 0);
  /* rank 0: three tiny streams of 64 bytes (one staging slot each) and
   * the long one, which gets the rest of the three quarters of half the
   * budget that the chunk bound may use (a quarter is for spreading long
   * streams), or more where the trial cuts fit more */
  const size_t bound = (STAGING / 2 / 4 * 3 - 3 * 64) & ~(size_t)63;
  const size_t chunk = a.st[0].chunk_bytes;
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(a.st[r].chunk_bytes, chunk);
    assert_true(a.st[r].staging_bytes <= STAGING);
  }
  assert_true(chunk >= bound && chunk <= STAGING / 2);
  assert_true(bound > STAGING / (2 * 4)); /* the old per-stream share */
  const int rounds = (int)((BIG * 4 + chunk - 1) / chunk);
  assert_int_equal(a.st[0].num_chunks, rounds);
  assert_int_equal(a.st[1].num_chunks, rounds);

  sync_twice(NRANKS, src, dst, &a.opts);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* A long stream among short ones: rank 0 receives "long" (256 KiB) from
 * rank 1 and a 4 KiB tensor from each of ranks 2..8. The seven short
 * streams hold the chunk to about 3 KiB, but the long stream spreads: its
 * messages are its bytes over the spread rounds (about 7 KiB, from the
 * quarter of the half-budget set aside), so it ends with the plan instead
 * of trickling 3 KiB a round for twice as many rounds. */
enum { SPREAD_RANKS = 9, SHORT = 1024 };
static void test_long_stream_spreads(void **state) {
  (void)state;
  reshard_layout_t *side[2];
  reshard_placement_t rep = reshard_replicate();
  int one = 1;
  for (int k = 0; k < 2; k++) {
    assert_int_equal(reshard_layout_create(&side[k]), RESHARD_SUCCESS);
    for (int r = 1; r < SPREAD_RANKS; r++) {
      char name[16];
      snprintf(name, sizeof name, r == 1 ? "long" : "short%d", r);
      int64_t shape = r == 1 ? BIG : SHORT;
      int rank = k ? 0 : r, m, t, b;
      assert_int_equal(reshard_layout_add_tensor(side[k], name, RESHARD_FP32, 1, &shape, &t), RESHARD_SUCCESS);
      assert_int_equal(reshard_layout_add_mesh(side[k], 1, &one, &rank, &m), RESHARD_SUCCESS);
      assert_int_equal(reshard_layout_place(side[k], t, m, &rep, &b), RESHARD_SUCCESS);
    }
  }
  static stats_args a;
  memset(&a, 0, sizeof a);
  a.src = side[0];
  a.dst = side[1];
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.staging_bytes = STAGING;
  assert_int_equal(th_run_ranks(SPREAD_RANKS, stats_rank, &a), 0);
  const size_t chunk = a.st[0].chunk_bytes;
  for (int r = 0; r < SPREAD_RANKS; r++) assert_true(a.st[r].staging_bytes <= STAGING);
  assert_true(chunk < SHORT * 4); /* the short streams bind the chunk */
  const int chunk_rounds = (int)((BIG * 4 + chunk - 1) / chunk);
  /* 284 KiB over an eighth of the budget: 36 rounds, messages of 7296 B */
  assert_int_equal(a.st[0].num_chunks, 36);
  assert_int_equal(a.st[1].num_chunks, 36);
  assert_true(2 * a.st[0].num_chunks < chunk_rounds);
  assert_int_equal(a.st[0].recv_messages, 36 + (SPREAD_RANKS - 2) * (SHORT * 4 > chunk ? 2 : 1));

  sync_twice(SPREAD_RANKS, side[0], side[1], &a.opts);
  reshard_layout_destroy(side[0]);
  reshard_layout_destroy(side[1]);
}

/* When every stream fits at once, one round carries everything, bounded
 * by half the budget. */
static void test_everything_fits_in_one_round(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  build(&src, &dst);
  static stats_args a;
  memset(&a, 0, sizeof a);
  a.src = src;
  a.dst = dst;
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.staging_bytes = 16 * STAGING; /* half holds all 256 KiB + 4 slots */
  assert_int_equal(th_run_ranks(NRANKS, stats_rank, &a), 0);
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(a.st[r].chunk_bytes, 8 * STAGING);
    assert_int_equal(a.st[r].num_chunks, 1);
    assert_true(a.st[r].staging_bytes <= 16 * STAGING);
  }
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* n f32 tensors of rows x cols (1 x rows x cols with lead), all from
 * rank 1 to rank 0 (one stream), cut with chunk_bytes = chunk: want
 * messages each way and rounds, then a byte-exact sync. */
static void one_stream_shaped(int n, int lead, int64_t rows, int64_t cols, size_t chunk, int want) {
  reshard_layout_t *side[2];
  reshard_placement_t rep = reshard_replicate();
  int one = 1;
  for (int k = 0; k < 2; k++) {
    assert_int_equal(reshard_layout_create(&side[k]), RESHARD_SUCCESS);
    int rank = k ? 0 : 1, m, t, b;
    assert_int_equal(reshard_layout_add_mesh(side[k], 1, &one, &rank, &m), RESHARD_SUCCESS);
    for (int i = 0; i < n; i++) {
      char name[16];
      snprintf(name, sizeof name, "t%d", i);
      int64_t shape[3] = {1, rows, cols};
      assert_int_equal(reshard_layout_add_tensor(side[k], name, RESHARD_FP32, lead ? 3 : 2, lead ? shape : shape + 1, &t),
                       RESHARD_SUCCESS);
      assert_int_equal(reshard_layout_place(side[k], t, m, &rep, &b), RESHARD_SUCCESS);
    }
  }
  static stats_args a;
  memset(&a, 0, sizeof a);
  a.src = side[0];
  a.dst = side[1];
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.chunk_bytes = chunk;
  assert_int_equal(th_run_ranks(2, stats_rank, &a), 0);
  assert_int_equal(a.st[0].chunk_bytes, chunk);
  assert_int_equal(a.st[0].recv_messages, want);
  assert_int_equal(a.st[1].send_messages, want);
  assert_int_equal(a.st[0].num_chunks, want);

  sync_twice(2, side[0], side[1], &a.opts);
  reshard_layout_destroy(side[0]);
  reshard_layout_destroy(side[1]);
}

static void one_stream(int n, int64_t rows, int64_t cols, size_t chunk, int want) {
  one_stream_shaped(n, 0, rows, cols, chunk, want);
}

/* Two 24 KiB tensors in one stream with 16 KiB messages: the second box's
 * first slab fills the room the first box left, so 48 KiB take three
 * messages, not four. */
static void test_boxes_fill_open_messages(void **state) {
  (void)state;
  one_stream(2, 48, 128, 16384, 3);
}

/* A relay: rank 0 holds t (2 KiB), ranks 1 and 2 replicate it; each gets
 * its 1 KiB part from rank 0 in round 0 and forwards it in round 2. With
 * the minimum budget (4096: 2048 bytes a half), the three 1 KiB streams of
 * rank 1 do not fit a half at once (chunk 640), but the cut never has more
 * than one send and one receive of rank 1 in a round, so the whole half
 * (one message per part) fits: staging 2 x (1024 + 1024). */
static void test_cut_fits_more_than_all_streams_at_once(void **state) {
  (void)state;
  reshard_layout_t *side[2];
  reshard_placement_t rep = reshard_replicate();
  for (int k = 0; k < 2; k++) {
    assert_int_equal(reshard_layout_create(&side[k]), RESHARD_SUCCESS);
    int n = k ? 2 : 1, ranks[2] = {k ? 1 : 0, 2}, m, t, b;
    assert_int_equal(reshard_layout_add_mesh(side[k], 1, &n, ranks, &m), RESHARD_SUCCESS);
    int64_t shape = 512;
    assert_int_equal(reshard_layout_add_tensor(side[k], "t", RESHARD_FP32, 1, &shape, &t), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_place(side[k], t, m, &rep, &b), RESHARD_SUCCESS);
  }
  const uint64_t saved = rs_relay_min_part_bytes;
  rs_relay_min_part_bytes = 0;
  static stats_args a;
  memset(&a, 0, sizeof a);
  a.src = side[0];
  a.dst = side[1];
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.opts.staging_bytes = 4096;
  a.opts.relay = 1;
  assert_int_equal(th_run_ranks(3, stats_rank, &a), 0);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(a.st[r].chunk_bytes, 2048);
    assert_true(a.st[r].staging_bytes <= 4096);
  }
  assert_int_equal(a.st[1].recv_messages, 2); /* its part, the other's forward */
  assert_int_equal(a.st[1].send_messages, 1);
  assert_int_equal(a.st[1].staging_bytes, 4096);

  sync_twice(3, side[0], side[1], &a.opts);
  rs_relay_min_part_bytes = saved;
  reshard_layout_destroy(side[0]);
  reshard_layout_destroy(side[1]);
}

/* Four 12 KiB tensors in one stream with 16 KiB messages: a box under the
 * cap that does not fit what is left of the open message tops it up with
 * whole rows and goes on in the next, so 48 KiB take three full messages,
 * not four three-quarter ones. */
static void test_medium_boxes_top_up(void **state) {
  (void)state;
  one_stream(4, 48, 64, 16384, 3);
}

/* The same as 1 x 48 x 64 tensors (a stacked-expert slice is [1, rows,
 * cols]): a dim of extent 1 is no slab, so the box tops up the open
 * message with rows of the next dim; it went whole to the next message
 * before, four messages three-quarters full. */
static void test_leading_unit_dims_top_up(void **state) {
  (void)state;
  one_stream_shaped(4, 1, 48, 64, 16384, 3);
}

typedef struct peers_args {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  reshard_plan_stats_t st;
  reshard_peer_stats_t peers[4];
  size_t npeers;
} peers_args;

static int peers_rank(int rank, reshard_comm_t *comm, void *arg) {
  peers_args *a = arg;
  reshard_plan_t *plan = NULL;
  /* one phase, as RESHARD_MAX_PHASES=1, and no pacing: the counts below
   * are per round (with phases, this latency-bound pair would take 2;
   * paced, the stream inside the domain would take the chunk to keep
   * pace with the other; test_phases) */
  rs_plan_force = (rs_plan_agreed){.set_phases = 1, .phases = 1};
  reshard_result_t r = reshard_plan_create(comm, a->src, a->dst, &a->opts, &plan);
  rs_plan_force = (rs_plan_agreed){0};
  if (r != RESHARD_SUCCESS) return 1;
  int bad = 0;
  if (rank == 0) {
    bad |= reshard_plan_get_stats(plan, &a->st) != RESHARD_SUCCESS;
    bad |= reshard_plan_get_peer_stats(plan, a->peers, 4, &a->npeers) != RESHARD_SUCCESS;
  }
  reshard_plan_destroy(plan);
  return bad;
}

/* Inside an NVLink domain, unpaced messages are chunk / 4 on h100-8x400g: rank 0
 * sends "near" (256 KiB) to rank 1, in its domain (rank 1 holds a source
 * fragment, so it is placed with the sources), and "far" (256 KiB) to
 * rank 2, a destination-only rank on the next node. With the topology the
 * near stream takes four times as many messages as the far one, and the
 * chunk both share grows by the staging the near stream leaves; without
 * one they match. Both sync byte for byte within the budget. */
static void test_domain_streams_take_smaller_messages(void **state) {
  (void)state;
  reshard_layout_t *side[2];
  reshard_placement_t rep = reshard_replicate();
  static const char *names[3] = {"near", "far", "pad"};
  const int src_rank[3] = {0, 0, 1}, dst_rank[3] = {1, 2, 2};
  const int64_t shape[3] = {BIG, BIG, TINY};
  int one = 1;
  for (int k = 0; k < 2; k++) {
    assert_int_equal(reshard_layout_create(&side[k]), RESHARD_SUCCESS);
    for (int i = 0; i < 3; i++) {
      int rank = k ? dst_rank[i] : src_rank[i], m, t, b;
      assert_int_equal(reshard_layout_add_tensor(side[k], names[i], RESHARD_FP32, 1, &shape[i], &t), RESHARD_SUCCESS);
      assert_int_equal(reshard_layout_add_mesh(side[k], 1, &one, &rank, &m), RESHARD_SUCCESS);
      assert_int_equal(reshard_layout_place(side[k], t, m, &rep, &b), RESHARD_SUCCESS);
    }
  }
  static peers_args a[2];
  size_t msgs[2][2];
  for (int topo = 0; topo < 2; topo++) {
    memset(&a[topo], 0, sizeof a[topo]);
    a[topo].src = side[0];
    a[topo].dst = side[1];
    a[topo].opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
    a[topo].opts.staging_bytes = STAGING;
    a[topo].opts.topology = topo ? "h100-8x400g" : NULL;
    assert_int_equal(th_run_ranks(3, peers_rank, &a[topo]), 0);
    assert_true(a[topo].st.staging_bytes <= STAGING);
    assert_int_equal(a[topo].npeers, 2);
    for (int i = 0; i < 2; i++) {
      assert_int_equal(a[topo].peers[i].peer, i + 1);
      assert_int_equal(a[topo].peers[i].send_bytes, BIG * 4);
      msgs[topo][i] = a[topo].peers[i].send_messages;
    }
    sync_twice(3, side[0], side[1], &a[topo].opts);
  }
  const size_t chunk = a[1].st.chunk_bytes;
  assert_int_equal(msgs[0][0], msgs[0][1]);
  assert_int_equal(msgs[1][1], (BIG * 4 + chunk - 1) / chunk);
  assert_int_equal(msgs[1][0], (BIG * 4 + chunk / 4 / 64 * 64 - 1) / (chunk / 4 / 64 * 64));
  assert_true(msgs[1][0] >= 3 * msgs[1][1]);
  assert_true(chunk > a[0].st.chunk_bytes);
  reshard_layout_destroy(side[0]);
  reshard_layout_destroy(side[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_long_stream_gets_most_of_the_budget),
      cmocka_unit_test(test_long_stream_spreads),
      cmocka_unit_test(test_everything_fits_in_one_round),
      cmocka_unit_test(test_boxes_fill_open_messages),
      cmocka_unit_test(test_cut_fits_more_than_all_streams_at_once),
      cmocka_unit_test(test_domain_streams_take_smaller_messages),
      cmocka_unit_test(test_medium_boxes_top_up),
      cmocka_unit_test(test_leading_unit_dims_top_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
