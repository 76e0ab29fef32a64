/* reshard_plan_rejoin's state after the agreements (exec/state.c,
 * rs_plan_rejoin_state), over an in-process world of 4 ranks whose
 * communicators play a transport that replaces ranks (the UCX tests,
 * tests/ucx/test_ucx_rejoin.c keep, run the real thing with a killed
 * process; a commit in doubt cannot be arranged there at will). Sources on
 * ranks 0-1, double-buffered destinations on ranks 2-3, [32, 24] f32 rows
 * -> columns. After versions 1 to 3, every rank's plan is set to what a
 * death inside version 3's commit can leave on the staying ranks: rank
 * 3's vote in doubt (its copy holding version 3 whole, the active copy
 * still version 2), and either every other rank committed version 3
 * (every vote was a success: roll forward) or none did, each failed
 * (roll back). The communicator counts one rejoin, every rank
 * calls reshard_plan_rejoin (no newcomer: all ranks are staying, so every
 * word agrees), and then: rank 3's active copy holds the agreed version
 * whole, every element checked, failures are cleared, and version 4 runs
 * and is checked on every rank. Also refused: the rejoin of a plan two
 * rejoins behind (INVALID_USAGE), nothing changed.
 *
 * would_differ: rank 3 plays a newcomer (reshard_plan_create against the
 * others' reshard_plan_rejoin) whose creation would plan otherwise
 * though its layouts are the same (another build: its first agreement's
 * spread-rounds word is raised, its digest untouched): only the staying
 * ranks see a reduction differ from their recorded one, and they carry
 * it into the next agreement, so every rank fails (MISMATCH on the
 * staying ranks, REMOTE naming rank 0's finding on the newcomer), the
 * kept plans unchanged (version 2 whole in the active copy); then a right
 * newcomer, and version 3 on every rank, every element checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "exec/exec_state.h"
#include "plan/plan.h"
#include "reshard.h"
#include "support/harness.h"
#include "transport/transport.h"

#define NR 4

typedef struct run {
  const reshard_layout_t *src, *dst;
  int forward; /* ranks 0 to 2 committed version 3 */
  int problems;
} run;

static void layouts(reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t shape[2] = {32, 24};
  reshard_layout_t *L[2];
  for (int side = 0; side < 2; side++) {
    int t, m, b;
    assert_int_equal(reshard_layout_create(&L[side]), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_add_tensor(L[side], "w", RESHARD_FP32, 2, shape, &t), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_add_mesh_strided(L[side], 1, (int[]){2}, side ? 2 : 0, 1, &m), RESHARD_SUCCESS);
    reshard_placement_t p[1] = {reshard_shard(side)};
    assert_int_equal(reshard_layout_place(L[side], t, m, p, &b), RESHARD_SUCCESS);
  }
  *src = L[0];
  *dst = L[1];
}

#define CHECK(cond, ...)                 \
  do {                                   \
    if (!(cond)) {                       \
      printf("rank %d: ", rank);         \
      printf(__VA_ARGS__);               \
      printf("\n");                      \
      __atomic_fetch_add(&r->problems, 1, __ATOMIC_RELAXED); \
      goto out;                          \
    }                                    \
  } while (0)

static reshard_result_t exec_v(const reshard_plan_t *plan, th_side *s, const reshard_layout_t *src, void **dp,
                               size_t nd, uint64_t v) {
  reshard_selftest_fill(s, src, v);
  return reshard_plan_execute_version(plan, v, (void *const *)s->ptr, (size_t)s->nbuf, dp, nd, NULL);
}

/* One rank's side of a case: its source, two destination copies
 * (double buffering), its plan. */
typedef struct world {
  th_side s, d[2];
  void *dp[8];
  size_t nd;
  reshard_options_t o;
  reshard_plan_t *plan;
} world;

/* Allocates w's buffers, creates its plan and moves versions 1 to last;
 * 0, or -1 with a problem counted. */
static int world_open(world *w, run *r, int rank, reshard_comm_t *comm, uint64_t last) {
  memset(w, 0, sizeof *w);
  w->o = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  w->o.timeout_ms = 5000;
  w->o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  CHECK(!th_side_alloc(&w->s, r->src, rank, -1) && !th_side_alloc(&w->d[0], r->dst, rank, -1) &&
            !th_side_alloc(&w->d[1], r->dst, rank, -1), "alloc");
  w->nd = (size_t)w->d[0].nbuf;
  for (size_t b = 0; b < w->nd; b++) w->dp[b] = w->d[0].ptr[b], w->dp[w->nd + b] = w->d[1].ptr[b];
  CHECK(reshard_plan_create(comm, r->src, r->dst, &w->o, &w->plan) == RESHARD_SUCCESS, "plan_create: %s",
        reshard_last_error());
  for (uint64_t v = 1; v <= last; v++)
    CHECK(exec_v(w->plan, &w->s, r->src, w->dp, 2 * w->nd, v) == RESHARD_SUCCESS, "version %llu: %s",
          (unsigned long long)v, reshard_last_error());
  return 0;
out:
  return -1;
}

static void world_close(world *w) {
  reshard_plan_destroy(w->plan);
  th_side_free(&w->s);
  th_side_free(&w->d[0]);
  th_side_free(&w->d[1]);
}

/* Makes the plan look as a death inside version 3's commit leaves it
 * (see the top). Between two barriers of the world: no call runs. */
static void as_after_a_death(reshard_plan_t *p, int rank, int forward) {
  const char *why = "the replaced rank did not answer";
  if (rank == 3) { /* voted to commit 3, did not learn the outcome */
    p->doubt_version = 3;
    p->doubt_call = 2;
    p->doubt_copy = p->active_copy;
    p->active_copy = 1 - p->active_copy;
    p->committed_version = 2;
    p->completed--;
  } else if (!forward) { /* nothing committed: failed */
    if (p->active_copy >= 0) p->active_copy = 1 - p->active_copy;
    p->committed_version = 2;
    p->completed--;
    rs_plan_mark_failed(p, 2, 3, RESHARD_ERROR_TIMEOUT, why);
  }
}

static int rank_fn(int rank, reshard_comm_t *comm, void *arg) {
  run *r = arg;
  static _Thread_local rs_transport_ops ops; /* this rank's: replaces ranks */
  ops = *comm->ops;
  ops.replaces_ranks = 1;
  comm->ops = &ops;
  world w;
  if (world_open(&w, r, rank, comm, 3)) goto out;
  th_side *d = w.d;
  reshard_result_t res = reshard_plan_rejoin(w.plan);
  CHECK(res == RESHARD_ERROR_INVALID_USAGE, "a rejoin before any rejoin: %s", reshard_result_string(res));
  as_after_a_death(w.plan, rank, r->forward);
  comm->rejoins += 2;
  res = reshard_plan_rejoin(w.plan);
  CHECK(res == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "2 rejoins passed"),
        "two rejoins behind: %s: %s", reshard_result_string(res), reshard_last_error());
  comm->rejoins -= 1;
  res = reshard_plan_rejoin(w.plan);
  CHECK(res == RESHARD_SUCCESS, "plan_rejoin: %s: %s", reshard_result_string(res), reshard_last_error());
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  reshard_plan_get_status(w.plan, &st);
  const uint64_t want = r->forward ? 3 : 2;
  CHECK(!st.failed && st.in_doubt_version == 0 && st.committed_version == want, "after the rejoin: failed %d doubt "
        "%llu committed %llu (want %llu)", st.failed, (unsigned long long)st.in_doubt_version,
        (unsigned long long)st.committed_version, (unsigned long long)want);
  if (rank >= 2)
    CHECK(th_side_check(&d[st.active_copy], r->dst, rank, want, "after the rejoin") == 0,
          "active copy %d does not hold version %llu whole", st.active_copy, (unsigned long long)want);
  CHECK(exec_v(w.plan, &w.s, r->src, w.dp, 2 * w.nd, 4) == RESHARD_SUCCESS, "version 4: %s", reshard_last_error());
  reshard_plan_get_status(w.plan, &st);
  CHECK(st.committed_version == 4 && !st.failed, "version 4 not committed");
  if (rank >= 2)
    CHECK(th_side_check(&d[st.active_copy], r->dst, rank, 4, "version 4") == 0, "version 4 not whole");
out:
  world_close(&w);
  return 0;
}

/* would_differ's rank 3: its next allreduce (the first agreement of its
 * creation) carries a spread-rounds word one higher (AGREE_SPREAD, word 3
 * in plan/create_agree.c), as another build's planner might. */
static _Thread_local const rs_transport_ops *real_ops;
static _Thread_local int perturb_next;
static reshard_result_t perturbed_allreduce(reshard_comm_t *c, uint64_t *v, int n, int64_t deadline) {
  if (perturb_next && n > 3) {
    perturb_next = 0;
    v[3]++;
  }
  return real_ops->allreduce_max_u64(c, v, n, deadline);
}

static int differ_fn(int rank, reshard_comm_t *comm, void *arg) {
  run *r = arg;
  static _Thread_local rs_transport_ops ops;
  ops = *comm->ops;
  real_ops = comm->ops;
  ops.replaces_ranks = 1;
  ops.allreduce_max_u64 = perturbed_allreduce;
  comm->ops = &ops;
  world w;
  if (world_open(&w, r, rank, comm, 2)) goto out;
  th_side *d = w.d;
  comm->rejoins++;
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  reshard_result_t res;
  if (rank == 3) { /* the newcomer: no plan of its own yet */
    reshard_plan_destroy(w.plan);
    w.plan = NULL;
    perturb_next = 1;
    res = reshard_plan_create(comm, r->src, r->dst, &w.o, &w.plan);
    CHECK(res == RESHARD_ERROR_REMOTE && !w.plan && strstr(reshard_last_error(), "would differ"),
          "the newcomer that would differ: %s: %s", reshard_result_string(res), reshard_last_error());
    res = reshard_plan_create(comm, r->src, r->dst, &w.o, &w.plan);
    CHECK(res == RESHARD_SUCCESS, "the right newcomer: %s: %s", reshard_result_string(res), reshard_last_error());
  } else {
    res = reshard_plan_rejoin(w.plan);
    CHECK(res == RESHARD_ERROR_MISMATCH && strstr(reshard_last_error(), "spread rounds"),
          "a rejoin with a newcomer that would differ: %s: %s", reshard_result_string(res), reshard_last_error());
    reshard_plan_get_status(w.plan, &st);
    CHECK(!st.failed && st.in_doubt_version == 0 && st.committed_version == 2, "after the refused rejoin: failed %d "
          "committed %llu", st.failed, (unsigned long long)st.committed_version);
    if (rank >= 2)
      CHECK(th_side_check(&d[st.active_copy], r->dst, rank, 2, "after the refused rejoin") == 0,
            "version 2 not whole after the refused rejoin");
    res = reshard_plan_rejoin(w.plan);
    CHECK(res == RESHARD_SUCCESS, "plan_rejoin: %s: %s", reshard_result_string(res), reshard_last_error());
  }
  CHECK(exec_v(w.plan, &w.s, r->src, w.dp, 2 * w.nd, 3) == RESHARD_SUCCESS, "version 3: %s", reshard_last_error());
  reshard_plan_get_status(w.plan, &st);
  CHECK(st.committed_version == 3 && !st.failed, "version 3 not committed");
  if (rank >= 2) CHECK(th_side_check(&d[st.active_copy], r->dst, rank, 3, "version 3") == 0, "version 3 not whole");
out:
  world_close(&w);
  return 0;
}

static void run_case(th_rank_fn fn, int forward) {
  reshard_layout_t *src, *dst;
  layouts(&src, &dst);
  run r = {src, dst, forward, 0};
  th_run_ranks(NR, fn, &r);
  assert_int_equal(r.problems, 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void test_would_differ(void **state) {
  (void)state;
  run_case(differ_fn, 0);
}

static void test_rolls_forward(void **state) {
  (void)state;
  run_case(rank_fn, 1);
}

static void test_rolls_back(void **state) {
  (void)state;
  run_case(rank_fn, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rolls_forward),
      cmocka_unit_test(test_rolls_back),
      cmocka_unit_test(test_would_differ),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
