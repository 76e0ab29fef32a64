/* RESHARD_FLAG_DOUBLE_BUFFER: each execute writes the inactive copy of
 * the destination and flips copies only when every rank succeeded. A
 * failure (ranks at different versions, or a send failing mid-transfer)
 * leaves the active copy byte-identical and the committed version
 * unchanged on every rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec_state.h"
#include "plan/plan.h"
#include "reshard.h"
#include "support/fault_comm.h"
#include "support/harness.h"

#define NR 4
#define MSG 1024

/* [64, 64] f32, rows over 4 ranks -> columns over the same 4 ranks: every
 * rank sends to and receives from every other one and copies its diagonal
 * block locally; chunk_bytes 256 makes several rounds per peer. */
static void transpose(reshard_layout_t **src, reshard_layout_t **dst, int disjoint) {
  int64_t shape[2] = {64, 64};
  reshard_layout_t *L[2];
  for (int side = 0; side < 2; side++) {
    int t, m, b;
    /* disjoint: sources on ranks 0-1, destinations on ranks 2-3 */
    int n = disjoint ? NR / 2 : NR, first = disjoint && side ? NR / 2 : 0;
    assert_int_equal(reshard_layout_create(&L[side]), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_add_tensor(L[side], "w", RESHARD_FP32, 2, shape, &t), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_add_mesh_strided(L[side], 1, (int[]){n}, first, 1, &m), RESHARD_SUCCESS);
    reshard_placement_t p[1] = {reshard_shard(side)};
    assert_int_equal(reshard_layout_place(L[side], t, m, p, &b), RESHARD_SUCCESS);
  }
  *src = L[0];
  *dst = L[1];
}

enum { FAIL_VERSION, FAIL_SEND };

typedef struct run {
  const reshard_layout_t *src, *dst;
  int how;
  int disjoint;
  int bad_rank; /* FAIL_VERSION: passes another version at step 3 */
  tf_fault fault;
  int problems;
  int inactive_written[NR]; /* step 3 wrote into copy 0 before failing */
  reshard_result_t code3[NR];
  char msg3[NR][MSG];
} run;

#define CHECK(cond, ...)                                         \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "rank %d: line %d: ", rank, __LINE__);     \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      __atomic_fetch_add(&x->problems, 1, __ATOMIC_RELAXED);                                             \
    }                                                            \
  } while (0)

static reshard_plan_status_t status_of(const reshard_plan_t *plan) {
  reshard_plan_status_t st = {.struct_size = sizeof st};
  if (reshard_plan_get_status(plan, &st)) st.struct_size = 0;
  return st;
}

static reshard_result_t step(const reshard_plan_t *plan, const run *x, int rank, uint64_t version,
                             uint64_t data_step, th_side *c0, th_side *c1) {
  th_side s;
  if (th_side_alloc(&s, x->src, rank, (int64_t)data_step)) return RESHARD_ERROR_OUT_OF_MEMORY;
  void **d = calloc(2 * (size_t)c0->nbuf + 1, sizeof *d);
  for (int i = 0; i < c0->nbuf; i++) {
    d[i] = c0->ptr[i];
    d[c0->nbuf + i] = c1->ptr[i];
  }
  reshard_result_t r = reshard_plan_execute_version(plan, version, (void *const *)s.ptr, (size_t)s.nbuf,
                                                    (void *const *)d, 2 * (size_t)c0->nbuf, NULL);
  free(d);
  th_side_free(&s);
  return r;
}

static int run_rank(int rank, reshard_comm_t *comm, void *arg) {
  run *x = arg;
  if (x->how == FAIL_SEND) tf_install(comm, &x->fault);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 500;
  o.chunk_bytes = 256;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, x->src, x->dst, &o, &plan)) {
    fprintf(stderr, "rank %d: plan_create: %s\n", rank, reshard_last_error());
    __atomic_fetch_add(&x->problems, 1, __ATOMIC_RELAXED);
    return 1;
  }
  th_side c0, c1;
  if (th_side_alloc(&c0, x->dst, rank, -1) || th_side_alloc(&c1, x->dst, rank, -1)) return 1;
  reshard_plan_status_t st = status_of(plan);
  CHECK(st.active_copy == -1 && st.committed_version == 0, "before any execute: active %d version %llu",
        st.active_copy, (unsigned long long)st.committed_version);

  /* the wrong number of destination buffers (on a plan of its own: a
   * rejected call takes its place, tells its partners and fails the plan):
   * refused, nothing written; every rank calls, as every execute of a
   * double-buffered plan must, and none succeeds */
  {
    reshard_plan_t *once = NULL;
    if (reshard_plan_create(comm, x->src, x->dst, &o, &once)) return 1;
    th_side s;
    if (th_side_alloc(&s, x->src, rank, 1)) return 1;
    const int holds = c0.nbuf && c0.ptr[0];
    /* while another execute of the plan runs, even a call with bad
     * arguments is refused locally for the overlap: no call number, no
     * agreement, no commit beside the running one's */
    once->busy = 1;
    reshard_result_t r = reshard_plan_execute(once, (void *const *)s.ptr, (size_t)s.nbuf,
                                              holds ? (void *const *)c0.ptr : NULL, holds ? (size_t)c0.nbuf : 0, NULL);
    CHECK(r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "must not overlap") && once->exec_calls == 0,
          "overlapping call: %d %s, %llu calls", (int)r, reshard_last_error(), (unsigned long long)once->exec_calls);
    once->busy = 0;
    r = reshard_plan_execute(once, (void *const *)s.ptr, (size_t)s.nbuf, holds ? (void *const *)c0.ptr : NULL,
                             holds ? (size_t)c0.nbuf : 0, NULL);
    if (holds)
      CHECK(r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "2 x 1") &&
                strstr(reshard_last_error(), "partners were told"),
            "single copy: %d %s", (int)r, reshard_last_error());
    else
      CHECK(r != RESHARD_SUCCESS, "a partner's rejected call succeeded here");
    for (int b = 0; b < c0.nbuf; b++)
      for (size_t k = 0; k < c0.bytes[b]; k++) CHECK(c0.ptr[b][k] == TH_SENTINEL, "the rejected call wrote copy 0");
    /* the plan failed with the rejected call: the next call is refused
     * before it starts an agreement (no call number taken) */
    if (holds) {
      const uint64_t calls = once->exec_calls;
      r = reshard_plan_execute(once, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)c0.ptr, (size_t)c0.nbuf,
                               NULL);
      CHECK(r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "failed earlier") &&
                once->exec_calls == calls,
            "next call: %d %s", (int)r, reshard_last_error());
    }
    th_side_free(&s);
    reshard_plan_destroy(once);
  }

  /* step 1 lands in copy 0 */
  reshard_result_t r = step(plan, x, rank, 1, 1, &c0, &c1);
  CHECK(r == RESHARD_SUCCESS, "step 1: %s", reshard_last_error());
  st = status_of(plan);
  CHECK(st.active_copy == 0 && st.committed_version == 1 && st.executes_completed == 1, "after step 1: %d %llu",
        st.active_copy, (unsigned long long)st.committed_version);
  CHECK(th_side_check(&c0, x->dst, rank, 1, "copy 0") == 0, "copy 0 after step 1");
  CHECK(th_side_written(&c1) == 0, "step 1 wrote copy 1");

  /* step 2 lands in copy 1; copy 0 keeps step 1 */
  r = step(plan, x, rank, 2, 2, &c0, &c1);
  CHECK(r == RESHARD_SUCCESS, "step 2: %s", reshard_last_error());
  st = status_of(plan);
  CHECK(st.active_copy == 1 && st.committed_version == 2 && st.executes_completed == 2, "after step 2: %d %llu",
        st.active_copy, (unsigned long long)st.committed_version);
  CHECK(th_side_check(&c1, x->dst, rank, 2, "copy 1") == 0, "copy 1 after step 2");
  CHECK(th_side_check(&c0, x->dst, rank, 1, "copy 0") == 0, "copy 0 after step 2");

  /* step 3 fails somewhere: copy 1 stays exactly step 2 */
  th_side snap, snap0;
  if (th_side_alloc(&snap, x->dst, rank, -1) || th_side_alloc(&snap0, x->dst, rank, -1)) return 1;
  for (int b = 0; b < c1.nbuf; b++) {
    if (c1.bytes[b]) memcpy(snap.ptr[b], c1.ptr[b], c1.bytes[b]);
    if (c0.bytes[b]) memcpy(snap0.ptr[b], c0.ptr[b], c0.bytes[b]);
  }
  uint64_t v3 = x->how == FAIL_VERSION && rank == x->bad_rank ? 4 : 3;
  if (x->how == FAIL_SEND && rank == x->fault.rank) x->fault.kind = TF_FAIL_SEND;
  x->code3[rank] = step(plan, x, rank, v3, 3, &c0, &c1);
  snprintf(x->msg3[rank], MSG, "%s", reshard_last_error());
  CHECK(x->code3[rank] != RESHARD_SUCCESS, "step 3 succeeded");
  st = status_of(plan);
  CHECK(st.active_copy == 1 && st.committed_version == 2 && st.executes_completed == 2, "after step 3: %d %llu",
        st.active_copy, (unsigned long long)st.committed_version);
  CHECK(st.failed && st.failure == x->code3[rank] && st.failed_call == 2 && st.failed_version == v3,
        "status after step 3: failed %d failure %d call %llu", st.failed, (int)st.failure,
        (unsigned long long)st.failed_call);
  for (int b = 0; b < c1.nbuf; b++)
    CHECK(!c1.bytes[b] || !memcmp(snap.ptr[b], c1.ptr[b], c1.bytes[b]), "the active copy changed (buffer %d)", b);
  CHECK(th_side_check(&c1, x->dst, rank, 2, "copy 1") == 0, "copy 1 after the failure");
  for (int b = 0; b < c0.nbuf; b++)
    x->inactive_written[rank] |= c0.bytes[b] && memcmp(snap0.ptr[b], c0.ptr[b], c0.bytes[b]);
  th_side_free(&snap);
  th_side_free(&snap0);
  th_side_free(&c0);
  th_side_free(&c1);
  reshard_plan_destroy(plan);
  return 0;
}

static void run_case(int how, int disjoint) {
  run x;
  memset(&x, 0, sizeof x);
  transpose((reshard_layout_t **)&x.src, (reshard_layout_t **)&x.dst, disjoint);
  x.how = how;
  x.disjoint = disjoint;
  x.bad_rank = disjoint ? 0 : 2;
  /* rank 0's third data message (chunks are 256 bytes; control messages
   * are at most 32) */
  x.fault = (tf_fault){TF_NONE, 0, 200, 2, 0, 0};
  assert_int_equal(th_run_ranks(NR, run_rank, &x), 0);
  assert_int_equal(x.problems, 0);
  if (how == FAIL_VERSION) {
    assert_int_equal(x.code3[x.bad_rank], RESHARD_ERROR_MISMATCH);
    assert_non_null(strstr(x.msg3[x.bad_rank], "version 4"));
  } else {
    assert_true(x.fault.fired);
    assert_int_equal(x.code3[0], RESHARD_ERROR_BACKEND);
    assert_non_null(strstr(x.msg3[0], "injected failure"));
    /* the failure came mid-transfer: data had landed in inactive copies */
    int written = 0;
    for (int r = 0; r < NR; r++) written += x.inactive_written[r];
    assert_true(written > 0);
    /* the others never get rank 0's message, or learn from the commit */
    for (int r = 1; r < NR; r++)
      if (x.code3[r] != RESHARD_ERROR_TIMEOUT && x.code3[r] != RESHARD_ERROR_REMOTE)
        fail_msg("rank %d: %d: %s", r, (int)x.code3[r], x.msg3[r]);
  }
  reshard_layout_destroy((reshard_layout_t *)x.src);
  reshard_layout_destroy((reshard_layout_t *)x.dst);
}

static void commit_then_version_mismatch(void **state) {
  (void)state;
  run_case(FAIL_VERSION, 0);
}

static void commit_then_send_failure(void **state) {
  (void)state;
  run_case(FAIL_SEND, 0);
}

/* Source-only ranks (no destination buffers) take part in every commit;
 * one of them is at another version. */
static void commit_disjoint_sides(void **state) {
  (void)state;
  run_case(FAIL_VERSION, 1);
}

/* The first execute of a double-buffered plan is refused on one rank (a
 * short buffer) while the other's is fine; with identical layouts the
 * ranks exchange no data, so the other learns of it at the commit. It
 * says that nothing was committed before, not "copy -1 still holds
 * version 0" (issue 42, item 8), and names the rank that failed and its
 * reason, not "another rank failed" (item 4). */
typedef struct first_case {
  const reshard_layout_t *L;
  reshard_result_t code[2];
  char msg[2][MSG];
} first_case;

static int first_rank(int rank, reshard_comm_t *comm, void *arg) {
  first_case *c = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 5000;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, c->L, c->L, &o, &plan)) return 1;
  float w[8] = {0}, d0[8], d1[8];
  reshard_buffer_t sb[1] = {{w, rank == 1 ? 4 : sizeof w}}, db[2] = {{d0, sizeof d0}, {d1, sizeof d1}};
  c->code[rank] = reshard_plan_execute_sized(plan, 1, sb, 1, db, 2, NULL);
  snprintf(c->msg[rank], MSG, "%s", reshard_last_error());
  reshard_plan_destroy(plan);
  return 0;
}

static void commit_first_call_refused(void **state) {
  (void)state;
  reshard_layout_t *L;
  int t, m, b;
  assert_int_equal(reshard_layout_create(&L), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_tensor(L, "w", RESHARD_FP32, 1, (int64_t[]){16}, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh_strided(L, 1, (int[]){2}, 0, 1, &m), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_place(L, t, m, (reshard_placement_t[]){reshard_shard(0)}, &b), RESHARD_SUCCESS);
  first_case c = {.L = L};
  assert_int_equal(th_run_ranks(2, first_rank, &c), 0);
  assert_int_equal(c.code[1], RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(c.code[0], RESHARD_ERROR_REMOTE);
  if (!strstr(c.msg[0], "nothing committed, no version was committed before") || strstr(c.msg[0], "copy -1"))
    fail_msg("rank 0: %s", c.msg[0]);
  char reason[48];
  snprintf(reason, sizeof reason, "%.40s", c.msg[1]);
  if (!strstr(c.msg[0], "rank 1 failed execute call") || !strstr(c.msg[0], reason))
    fail_msg("rank 0 does not name rank 1 and \"%s\": %s", reason, c.msg[0]);
  reshard_layout_destroy(L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(commit_then_version_mismatch),
      cmocka_unit_test(commit_first_call_refused),
      cmocka_unit_test(commit_then_send_failure),
      cmocka_unit_test(commit_disjoint_sides),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
