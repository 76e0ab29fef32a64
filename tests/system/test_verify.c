/* RESHARD_FLAG_VERIFY: position-keyed box checksums catch a corrupted
 * byte and elements swapped in flight (same bytes, wrong places), name
 * the tensor, the peer and the box, and pass byte-exact transfers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "reshard.h"
#include "support/fault_comm.h"
#include "support/harness.h"

#define NR 4
#define MSG 1024

static reshard_layout_t *side(const char *name, reshard_dtype_t dt, int64_t rows, int64_t cols, int shard_dim,
                              int nranks, int first) {
  reshard_layout_t *L;
  int64_t shape[2] = {rows, cols};
  int t, m, b;
  assert_int_equal(reshard_layout_create(&L), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_tensor(L, name, dt, 2, shape, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh_strided(L, 1, (int[]){nranks}, first, 1, &m), RESHARD_SUCCESS);
  reshard_placement_t p[1] = {shard_dim < 0 ? reshard_replicate() : reshard_shard(shard_dim)};
  assert_int_equal(reshard_layout_place(L, t, m, p, &b), RESHARD_SUCCESS);
  return L;
}

/* Clean transfers with verify on: byte-exact, every element and the
 * bytes outside fragments (the harness checks). */
static void verify_passes_clean_transfers(void **state) {
  (void)state;
  struct {
    reshard_dtype_t dt;
    int src_dim, dst_dim, dst_first;
    size_t chunk;
  } cases[] = {
      {RESHARD_FP32, 0, 1, 0, 0},     /* transpose, colocated: local copies too */
      {RESHARD_FP32, 0, 1, 0, 256},   /* the same in many rounds */
      {RESHARD_BF16, 1, 0, 4, 0},     /* disjoint sides */
      {RESHARD_INT8, 0, -1, 4, 512},  /* gather to replicas */
      {RESHARD_FP64, -1, 0, 0, 1024}, /* replicated source */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    reshard_layout_t *src = side("w", cases[i].dt, 32, 24, cases[i].src_dim, NR, 0);
    reshard_layout_t *dst = side("w", cases[i].dt, 32, 24, cases[i].dst_dim, NR, cases[i].dst_first);
    th_sync_args a = {.src = src, .dst = dst, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 2};
    a.opts.flags = RESHARD_FLAG_VERIFY;
    a.opts.chunk_bytes = cases[i].chunk;
    int64_t bad = th_sync(cases[i].dst_first ? 2 * NR : NR, &a);
    if (bad) fail_msg("case %zu: %lld wrong", i, (long long)bad);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
  }
}

typedef struct run {
  const reshard_layout_t *src, *dst;
  uint32_t flags;
  tf_fault fault;
  reshard_result_t code[NR];
  char msg[NR][MSG];
  int64_t bad[NR];
  int problems;
} run;

static int run_rank(int rank, reshard_comm_t *comm, void *arg) {
  run *x = arg;
  tf_install(comm, &x->fault);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 500;
  o.flags = x->flags;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, x->src, x->dst, &o, &plan)) {
    __atomic_fetch_add(&x->problems, 1, __ATOMIC_RELAXED);
    return 1;
  }
  th_side s, d;
  if (th_side_alloc(&s, x->src, rank, 5) || th_side_alloc(&d, x->dst, rank, -1)) return 1;
  x->code[rank] = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                       (size_t)d.nbuf, NULL);
  snprintf(x->msg[rank], MSG, "%s", reshard_last_error());
  if (x->code[rank] == RESHARD_SUCCESS) x->bad[rank] = th_side_check(&d, x->dst, rank, 5, "verify");
  th_side_free(&s);
  th_side_free(&d);
  reshard_plan_destroy(plan);
  return 0;
}

/* Rank 0's first data message (to rank 1: the shifted round robin) is
 * damaged in flight. */
static void corrupt(tf_kind kind, uint32_t flags, run *x) {
  memset(x, 0, sizeof *x);
  x->src = side("layers.0.mlp.w", RESHARD_FP32, 32, 24, 0, NR, 0);
  x->dst = side("layers.0.mlp.w", RESHARD_FP32, 32, 24, 1, NR, 0);
  x->flags = flags;
  x->fault = (tf_fault){kind, 0, 128, 0, 0, 0};
  assert_int_equal(th_run_ranks(NR, run_rank, x), 0);
  assert_int_equal(x->problems, 0);
  assert_true(x->fault.fired);
  reshard_layout_destroy((reshard_layout_t *)x->src);
  reshard_layout_destroy((reshard_layout_t *)x->dst);
}

static void expect_caught(const run *x) {
  for (int r = 0; r < NR; r++) {
    if (r == 1) continue;
    if (x->code[r] != RESHARD_SUCCESS) fail_msg("rank %d: %s", r, x->msg[r]);
    assert_int_equal(x->bad[r], 0);
  }
  assert_int_equal(x->code[1], RESHARD_ERROR_MISMATCH);
  const char *want[] = {"execute rank 1", "verify", "tensor 'layers.0.mlp.w'", "received from rank 0", "box start [0, 6]",
                        "extent [8, 6]"};
  for (size_t k = 0; k < sizeof want / sizeof *want; k++)
    if (!strstr(x->msg[1], want[k])) fail_msg("\"%s\" not in \"%s\"", want[k], x->msg[1]);
}

static void verify_catches_flipped_byte(void **state) {
  (void)state;
  run x;
  corrupt(TF_FLIP_BYTE, RESHARD_FLAG_VERIFY, &x);
  expect_caught(&x);
}

/* Two elements swapped: the same bytes, at the wrong coordinates. */
static void verify_catches_swapped_elements(void **state) {
  (void)state;
  run x;
  corrupt(TF_SWAP_ELEMENTS, RESHARD_FLAG_VERIFY, &x);
  expect_caught(&x);
}

/* Without the flag the same damage goes unnoticed by execute (the
 * harness sees it): what verify is for. */
static void without_verify_damage_passes(void **state) {
  (void)state;
  run x;
  corrupt(TF_FLIP_BYTE, 0, &x);
  assert_int_equal(x.code[1], RESHARD_SUCCESS);
  assert_true(x.bad[1] > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(verify_passes_clean_transfers), cmocka_unit_test(verify_catches_flipped_byte),
      cmocka_unit_test(verify_catches_swapped_elements), cmocka_unit_test(without_verify_damage_passes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
