/* Tensors beyond 2^31 elements and 4 GiB: planning in 64-bit, and data
 * moved at global coordinates past 2^32 (small fragments of huge logical
 * tensors, so the test needs no memory to speak of). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>

#include "reshard.h"
#include "support/harness.h"

typedef struct plan_args {
  const reshard_layout_t *src, *dst;
  reshard_plan_stats_t st[8];
  int rc[8];
} plan_args;

static int plan_only(int rank, reshard_comm_t *comm, void *p) {
  plan_args *a = p;
  reshard_plan_t *plan = NULL;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  a->rc[rank] = reshard_plan_create(comm, a->src, a->dst, &o, &plan);
  if (a->rc[rank]) fprintf(stderr, "rank %d: %s\n", rank, reshard_last_error());
  else reshard_plan_get_stats(plan, &a->st[rank]);
  reshard_plan_destroy(plan);
  return a->rc[rank] != 0;
}

/* A 65536 x 65536 bf16 tensor: 2^32 elements, 8 GiB. Rows over 4 ranks to
 * columns over 4 others: every destination receives 2 GiB, in messages no
 * larger than the agreed chunk. Planning only. */
static void plan_8gib_tensor(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  int64_t shape[2] = {65536, 65536};
  int t, m, b;
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  assert_int_equal(reshard_layout_add_tensor(src, "huge", RESHARD_BF16, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_tensor(dst, "huge", RESHARD_BF16, 2, shape, &t), 0);
  int four[1] = {4};
  reshard_placement_t rows[1] = {reshard_shard(0)}, cols[1] = {reshard_shard(1)};
  assert_int_equal(reshard_layout_add_mesh_strided(src, 1, four, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(src, t, m, rows, &b), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(dst, 1, four, 4, 1, &m), 0);
  assert_int_equal(reshard_layout_place(dst, t, m, cols, &b), 0);
  size_t bytes;
  assert_int_equal(reshard_layout_buffer_bytes(dst, 0, 5, &bytes), 0);
  assert_true(bytes == (size_t)2 << 30);
  plan_args a = {src, dst, {{0}}, {0}};
  assert_int_equal(th_run_ranks(8, plan_only, &a), 0);
  size_t sent = 0;
  for (int r = 0; r < 8; r++) {
    sent += a.st[r].send_bytes;
    if (r >= 4) {
      assert_true(a.st[r].recv_bytes == (size_t)2 << 30);
      assert_true(a.st[r].recv_messages * a.st[r].chunk_bytes >= a.st[r].recv_bytes);
    }
  }
  assert_true(sent == (size_t)8 << 30);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* A 1-D int8 tensor of 2^33 elements of which only the last 4096 exist on
 * the source (raw fragment) and the last 1000 are wanted, split over two
 * destination ranks: offsets and coordinates beyond 2^32, checked byte for
 * byte with values computed from the global index. */
static void moves_past_2_32(void **state) {
  (void)state;
  const int64_t n = (int64_t)1 << 33;
  reshard_layout_t *src, *dst;
  int t, b;
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  assert_int_equal(reshard_layout_add_tensor(src, "long", RESHARD_INT8, 1, &n, &t), 0);
  assert_int_equal(reshard_layout_add_tensor(dst, "long", RESHARD_INT8, 1, &n, &t), 0);
  /* The source holds two raw fragments, a tiny one at the start on rank 0
   * and the tail on rank 1 (the planner must find a holder for every
   * wanted element); the middle is never requested. */
  int64_t s0 = 0, e0 = 16, s1 = n - 4096, e1 = 4096;
  assert_int_equal(reshard_layout_allow_partial(src, t), 0); /* both sides hold slices only */
  assert_int_equal(reshard_layout_allow_partial(dst, t), 0);
  assert_int_equal(reshard_layout_add_buffer(src, "head", 0, 16, &b), 0);
  reshard_fragment_t f0 = {t, b, &s0, &e0, 0, NULL};
  assert_int_equal(reshard_layout_add_fragment(src, &f0), 0);
  assert_int_equal(reshard_layout_add_buffer(src, "tail", 1, 4096 + 64, &b), 0);
  reshard_fragment_t f1 = {t, b, &s1, &e1, 64, NULL};
  assert_int_equal(reshard_layout_add_fragment(src, &f1), 0);
  int64_t d0 = n - 1000, de0 = 600, d1 = n - 400, de1 = 400;
  assert_int_equal(reshard_layout_add_buffer(dst, "d2", 2, 700, &b), 0);
  reshard_fragment_t g0 = {t, b, &d0, &de0, 50, NULL};
  assert_int_equal(reshard_layout_add_fragment(dst, &g0), 0);
  assert_int_equal(reshard_layout_add_buffer(dst, "d3", 3, 400, &b), 0);
  reshard_fragment_t g1 = {t, b, &d1, &de1, 0, NULL};
  assert_int_equal(reshard_layout_add_fragment(dst, &g1), 0);
  th_sync_args a = {.src = src, .dst = dst, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 2};
  assert_int_equal(th_sync(4, &a), 0);
  assert_true(a.recv_bytes[2] == 600 && a.recv_bytes[3] == 400);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(plan_8gib_tensor),
      cmocka_unit_test(moves_past_2_32),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
