/* The NCCL path's multi-rank hazards (issue 23), each against the emulated
 * device (mock_device.h): ranks as threads over one mocked NCCL world in
 * which work runs in stream order, NCCL work of a communicator in issue
 * order, channels hold few messages, peers connect lazily, and a host wait
 * that could never end is cut and counted as a hang.
 *
 * Every test moves real data where data moves (checked byte for byte with
 * the public self-test) and asserts what must never happen: a hang, a
 * message matched to a receive of another size, an abort or destroy of
 * the caller's communicator, a use of a communicator after its abort. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "device-emul/mock_device.h"
#include "plan/plan.h"
#include "plan/relay.h"
#include "reshard.h"
#include "reshard_nccl.h"
#include "reshard_selftest.h"
#include "support/random_layout.h"

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A tensor of rows x cols fp32 named `name`, rows sharded over `ranks` on
 * the source and columns over the same ranks in reverse on the
 * destination: every rank of the list exchanges with every other. */
static void add_exchange(reshard_layout_t *src, reshard_layout_t *dst, const char *name, int64_t rows,
                         int64_t cols, const int *ranks, int n) {
  int64_t shape[2] = {rows, cols};
  int t, m, b, sn[1] = {n};
  int rev[MAXR];
  for (int i = 0; i < n; i++) rev[i] = ranks[n - 1 - i];
  reshard_placement_t p0[1] = {reshard_shard(0)}, p1[1] = {reshard_shard(1)};
  assert_int_equal(reshard_layout_add_tensor(src, name, RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_tensor(dst, name, RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(src, 1, sn, ranks, &m), 0);
  assert_int_equal(reshard_layout_place(src, t, m, p0, &b), 0);
  assert_int_equal(reshard_layout_add_mesh(dst, 1, sn, rev, &m), 0);
  assert_int_equal(reshard_layout_place(dst, t, m, p1, &b), 0);
}

/* All n ranks exchange one 32n x 32n tensor. */
static void layouts_all(int n, reshard_layout_t **src, reshard_layout_t **dst) {
  int ranks[MAXR];
  for (int i = 0; i < n; i++) ranks[i] = i;
  assert_int_equal(reshard_layout_create(src), 0);
  assert_int_equal(reshard_layout_create(dst), 0);
  add_exchange(*src, *dst, "w", 32 * n, 32 * n, ranks, n);
}

/* ------------------------------------------------------------ worlds */

typedef struct hz_rank {
  int rank, n;
  void *ctx;
  int failed;
  char why[256];
} hz_rank;

typedef void (*hz_fn)(hz_rank *r);

static hz_fn cur_fn;
static void *thread_main(void *p) {
  hz_rank *r = p;
  mock_reset(r->rank, r->n);
  M.log_off = 1;
  cur_fn(r);
  return NULL;
}

#define RFAIL(r, ...)                                                   \
  do {                                                                  \
    if (!(r)->failed) snprintf((r)->why, sizeof (r)->why, __VA_ARGS__); \
    (r)->failed = 1;                                                    \
  } while (0)

/* Runs fn on n rank threads of a fresh world; fails the test if any rank
 * failed, or on a hang, a size mismatch or a use after abort. */
static void run_world(int n, int chan_cap, hz_fn fn, void *ctx) {
  mock_world_begin(n, chan_cap);
  world.hang_ms = 1500;
  hz_rank r[MAXR];
  pthread_t th[MAXR];
  cur_fn = fn;
  for (int i = 0; i < n; i++) {
    r[i] = (hz_rank){i, n, ctx, 0, ""};
    pthread_create(&th[i], NULL, thread_main, &r[i]);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  long hangs = world.hangs, bad = world.bad_size, uaf = world.use_after_free;
  long pab = world.parent_aborts, pde = world.parent_destroys;
  mock_world_end();
  world.hang_ms = 3000;
  for (int i = 0; i < n; i++)
    if (r[i].failed) fail_msg("rank %d: %s", i, r[i].why);
  if (hangs || bad || uaf || pab || pde)
    fail_msg("%ld hangs, %ld size mismatches, %ld uses after abort, %ld aborts and %ld destroys of the "
             "caller's communicator", hangs, bad, uaf, pab, pde);
}

typedef struct hz_plan {
  reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  reshard_selftest_t s, d;
} hz_plan;

static uint32_t hz_flags; /* options.flags of make_plan (set before a world) */

static reshard_result_t make_plan(reshard_comm_t *c, hz_plan *p, int n, size_t staging, int64_t timeout_ms) {
  memset(p, 0, sizeof *p);
  layouts_all(n, &p->src, &p->dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = staging;
  o.timeout_ms = timeout_ms;
  o.flags = hz_flags;
  return reshard_plan_create(c, p->src, p->dst, &o, &p->plan);
}

static reshard_result_t run_plan(hz_plan *p, int rank, int step) {
  reshard_selftest_free(&p->s);
  if (reshard_selftest_alloc(&p->s, p->src, rank, step)) return RESHARD_ERROR_OUT_OF_MEMORY;
  if (!p->d.nbuf && reshard_selftest_alloc(&p->d, p->dst, rank, -1)) return RESHARD_ERROR_OUT_OF_MEMORY;
  return reshard_plan_execute(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf, (void *const *)p->d.ptr,
                              (size_t)p->d.nbuf, NULL);
}

static void free_plan(hz_plan *p) {
  reshard_plan_destroy(p->plan);
  reshard_selftest_free(&p->s);
  reshard_selftest_free(&p->d);
  reshard_layout_destroy(p->src);
  reshard_layout_destroy(p->dst);
}

/* A rank's reshard communicator over the caller's and its plan of
 * layouts_all (make_plan); NULL (the rank failed, said why) otherwise. */
static reshard_comm_t *open_rank(hz_rank *r, hz_plan *p, size_t staging, int64_t timeout_ms) {
  reshard_comm_t *c = NULL;
  memset(p, 0, sizeof *p);
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) {
    RFAIL(r, "comm: %s", reshard_last_error());
    return NULL;
  }
  if (make_plan(c, p, r->n, staging, timeout_ms)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    return NULL;
  }
  return c;
}

/* --------------------------------------------------- 1. setup failures */

/* One rank cannot allocate its staging: before, plan creation succeeded,
 * that rank's first execute failed with nothing queued and its peers'
 * queued transfers waited forever (destroy then hung). Now the staging is
 * allocated while the plan is created, before its last agreement: every
 * rank fails creation (OUT_OF_MEMORY there, REMOTE elsewhere). */
static void setup_oom_rank(hz_rank *r) {
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) { RFAIL(r, "comm: %s", reshard_last_error()); return; }
  if (r->rank == 2) M.fail_nccl_mem = 1;
  hz_plan p;
  reshard_result_t e = make_plan(c, &p, r->n, 4096, 500);
  reshard_result_t want = r->rank == 2 ? RESHARD_ERROR_OUT_OF_MEMORY : RESHARD_ERROR_REMOTE;
  if (e != want) {
    RFAIL(r, "plan_create gave %s (%s), expected %s", reshard_result_string(e), reshard_last_error(),
          reshard_result_string(want));
    if (!e && run_plan(&p, r->rank, 0) == RESHARD_SUCCESS) mock_stream_drain(NULL);
  }
  free_plan(&p);
  reshard_comm_destroy(c);
}

static void setup_failure_fails_creation(void **state) {
  (void)state;
  run_world(4, 1, setup_oom_rank, NULL);
}

/* One rank fails partway through queuing an execute (its second round):
 * its peers queued everything and returned. Nobody may hang: the failed
 * rank aborts reshard's private communicator; the peers' destroy waits
 * for their work until the deadline, then aborts theirs. */
static void partial_queue_rank(hz_rank *r) {
  hz_plan p;
  reshard_comm_t *c = open_rank(r, &p, 4096, 300);
  if (!c) return;
  if (p.plan->nrounds < 3) RFAIL(r, "only %d rounds", p.plan->nrounds);
  if (r->rank == 1) {
    M.group_end_result = ncclSystemError;
    M.group_end_fail_at = M.groups + 2;
  }
  reshard_result_t e = run_plan(&p, r->rank, 0);
  if (r->rank == 1 && e != RESHARD_ERROR_BACKEND)
    RFAIL(r, "execute gave %s, expected BACKEND", reshard_result_string(e));
  if (r->rank != 1 && e != RESHARD_SUCCESS) RFAIL(r, "execute: %s", reshard_last_error());
  int64_t t0 = ms_now();
  free_plan(&p);
  reshard_comm_destroy(c);
  int64_t dt = ms_now() - t0;
  if (dt > 2500) RFAIL(r, "destroy took %lld ms (deadline 300 ms)", (long long)dt);
  if (mock_stream_drain(NULL)) RFAIL(r, "the caller's stream never completes");
}

static void partial_queue_failure_no_hang(void **state) {
  (void)state;
  run_world(4, 1, partial_queue_rank, NULL);
}

/* ------------------------------------------ 2. the caller's communicator */

/* A nonblocking enqueue that never completes: TIMEOUT, and reshard aborts
 * only what it created. The caller's communicator stays alive (another
 * reshard communicator over it still moves data), reshard_comm_destroy
 * never destroys it, and nothing uses the aborted communicator again. */
static void caller_comm_rank(hz_rank *r) {
  reshard_comm_t *c1 = NULL, *c2 = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c1) || reshard_comm_create_nccl(MOCK_PARENT, &c2))
    { RFAIL(r, "comm: %s", reshard_last_error()); return; }
  hz_plan p1, p2;
  if (make_plan(c1, &p1, r->n, 4096, 200) || make_plan(c2, &p2, r->n, 4096, 5000))
    { RFAIL(r, "plan_create: %s", reshard_last_error()); return; }
  if (r->rank == 0) {
    M.inprogress_polls = -1;
    reshard_result_t e = run_plan(&p1, r->rank, 0);
    M.inprogress_polls = 0;
    if (e != RESHARD_ERROR_TIMEOUT) RFAIL(r, "execute gave %s, expected TIMEOUT", reshard_result_string(e));
    e = run_plan(&p1, r->rank, 0);
    if (e != RESHARD_ERROR_INVALID_USAGE) RFAIL(r, "execute after the failure gave %s", reshard_result_string(e));
  }
  free_plan(&p1);
  reshard_comm_destroy(c1);
  /* the other reshard communicator over the same NCCL communicator */
  if (run_plan(&p2, r->rank, 1) || mock_stream_drain(NULL))
    { RFAIL(r, "execute on the second communicator: %s", reshard_last_error()); return; }
  if (reshard_selftest_check(&p2.d, p2.dst, r->rank, 1, "second comm"))
    RFAIL(r, "wrong data on the second communicator");
  free_plan(&p2);
  reshard_comm_destroy(c2);
}

static void caller_comm_never_aborted(void **state) {
  (void)state;
  run_world(2, 0, caller_comm_rank, NULL);
}

/* A nonblocking caller's communicator: NCCL runs the split in the parent's
 * mode and reports its progress and outcome on the parent, storing the
 * child when done. A failed split is an error, not a half-made
 * communicator. */
static void nonblocking_parent_rank(hz_rank *r) {
  M.parent_nonblocking = 1;
  reshard_comm_t *c = NULL;
  if (r->rank == 1) M.split_result = ncclSystemError;
  reshard_result_t e = reshard_comm_create_nccl(MOCK_PARENT, &c);
  M.split_result = ncclSuccess;
  if (r->rank == 1) {
    if (e != RESHARD_ERROR_BACKEND || c) RFAIL(r, "a failed split gave %s", reshard_result_string(e));
  } else if (e) {
    RFAIL(r, "comm: %s", reshard_last_error());
  } else {
    reshard_comm_destroy(c);
  }
  /* both split again: a working communicator moves data */
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) {
    RFAIL(r, "comm: %s", reshard_last_error());
    return;
  }
  hz_plan p;
  if (make_plan(c, &p, r->n, 4096, 2000)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    return;
  }
  if (run_plan(&p, r->rank, 0) || mock_stream_drain(NULL)) RFAIL(r, "execute: %s", reshard_last_error());
  else if (reshard_selftest_check(&p.d, p.dst, r->rank, 0, "nonblocking parent")) RFAIL(r, "wrong data");
  free_plan(&p);
  reshard_comm_destroy(c);
}

static void nonblocking_caller_comm(void **state) {
  (void)state;
  run_world(2, 0, nonblocking_parent_rank, NULL);
}

/* ------------------------------------------- 3. ncclInProgress mid-group */

/* ncclSend/ncclRecv returning ncclInProgress (a nonblocking communicator)
 * is not a reason to stop posting the round. */
static void inprogress_rank(hz_rank *r) {
  hz_plan p;
  reshard_comm_t *c = open_rank(r, &p, 4096, 2000);
  if (!c) return;
  M.p2p_inprogress = 1;
  for (int step = 0; step < 2 && !r->failed; step++) {
    if (run_plan(&p, r->rank, step) || mock_stream_drain(NULL))
      RFAIL(r, "execute %d: %s", step, reshard_last_error());
    else if (reshard_selftest_check(&p.d, p.dst, r->rank, (uint64_t)step, "in progress"))
      RFAIL(r, "wrong data at step %d", step);
  }
  M.p2p_inprogress = 0;
  free_plan(&p);
  reshard_comm_destroy(c);
}

static void inprogress_posts_whole_round(void **state) {
  (void)state;
  run_world(3, 1, inprogress_rank, NULL);
}

/* ------------------------------------------------- 4. issue order */

/* Three plans over one communicator, each between two ranks in both
 * directions, executed in rotated orders: NCCL runs a communicator's work
 * in issue order, so the three ranks wait on each other in a cycle. The
 * rule (one issue order per communicator) is the caller's; what reshard
 * guarantees is that nobody hangs: reshard_plan_get_status fails the plan
 * at its execute's deadline (and ends the work), destroy ends then too. */
static void rotated_rank(hz_rank *r) {
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) { RFAIL(r, "comm: %s", reshard_last_error()); return; }
  reshard_layout_t *src[3], *dst[3];
  reshard_plan_t *plan[3];
  reshard_selftest_t s[3], d[3];
  for (int k = 0; k < 3; k++) {
    int pair[2] = {k, (k + 1) % 3};
    assert_int_equal(reshard_layout_create(&src[k]), 0);
    assert_int_equal(reshard_layout_create(&dst[k]), 0);
    add_exchange(src[k], dst[k], "x", 64, 64, pair, 2);
    reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
    o.staging_bytes = 4096;
    o.timeout_ms = 300;
    if (reshard_plan_create(c, src[k], dst[k], &o, &plan[k])) { RFAIL(r, "plan %d: %s", k, reshard_last_error()); return; }
    reshard_selftest_alloc(&s[k], src[k], r->rank, 0);
    reshard_selftest_alloc(&d[k], dst[k], r->rank, -1);
  }
  /* rank i runs plan i, then plan i-1: the two it takes part in, rotated */
  int order[2] = {r->rank, (r->rank + 2) % 3};
  for (int j = 0; j < 2; j++) {
    int k = order[j];
    reshard_result_t e = reshard_plan_execute(plan[k], (void *const *)s[k].ptr, (size_t)s[k].nbuf,
                                              (void *const *)d[k].ptr, (size_t)d[k].nbuf, NULL);
    if (e) RFAIL(r, "execute of plan %d: %s", k, reshard_last_error());
  }
  /* waiting the way that cannot hang: polling the status, which fails the
   * plan at its execute's deadline and ends the work */
  int64_t t0 = ms_now();
  reshard_plan_status_t st = {.struct_size = sizeof st};
  while (ms_now() - t0 < 3000 && !reshard_plan_get_status(plan[order[1]], &st) && !st.failed)
    if (cudaStreamQuery(NULL) == cudaSuccess) break;
  int64_t dt = ms_now() - t0;
  if (!st.failed || st.failure != RESHARD_ERROR_TIMEOUT || dt > 2500)
    RFAIL(r, "status after %lld ms: failed %d with %s (%s)", (long long)dt, st.failed,
          reshard_result_string(st.failure), st.failure_message);
  t0 = ms_now();
  for (int k = 0; k < 3; k++) reshard_plan_destroy(plan[k]);
  reshard_comm_destroy(c);
  dt = ms_now() - t0;
  if (dt > 2500) RFAIL(r, "destroy took %lld ms (deadline 300 ms)", (long long)dt);
  mock_stream_drain(NULL);
  for (int k = 0; k < 3; k++) {
    reshard_selftest_free(&s[k]);
    reshard_selftest_free(&d[k]);
    reshard_layout_destroy(src[k]);
    reshard_layout_destroy(dst[k]);
  }
}

static void rotated_order_never_hangs(void **state) {
  (void)state;
  run_world(3, 0, rotated_rank, NULL);
}

/* Plan creation right after an execute whose work takes long on the GPU:
 * its agreement must not be timed against that backlog (NCCL would run
 * the agreement's allreduce only after the execute's transfers). */
static void backlog_rank(hz_rank *r) {
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) { RFAIL(r, "comm: %s", reshard_last_error()); return; }
  hz_plan a, b;
  if (make_plan(c, &a, r->n, 4096, 10000)) { RFAIL(r, "plan_create a: %s", reshard_last_error()); return; }
  if (a.plan->nrounds < 4) RFAIL(r, "only %d rounds", a.plan->nrounds);
  M.kernel_ns = 60 * 1000000LL; /* every pack and unpack: 60 ms of GPU time */
  if (run_plan(&a, r->rank, 0)) RFAIL(r, "execute a: %s", reshard_last_error());
  reshard_result_t e = make_plan(c, &b, r->n, 8192, 250);
  if (e) RFAIL(r, "plan_create b behind the backlog: %s: %s", reshard_result_string(e), reshard_last_error());
  M.kernel_ns = 0;
  if (mock_stream_drain(NULL)) RFAIL(r, "execute a never completes");
  else if (reshard_selftest_check(&a.d, a.dst, r->rank, 0, "backlog")) RFAIL(r, "wrong data");
  free_plan(&a);
  free_plan(&b);
  reshard_comm_destroy(c);
}

static void agreement_independent_of_backlog(void **state) {
  (void)state;
  run_world(2, 0, backlog_rank, NULL);
}

/* ------------------------------------------------- 5. late peers */

/* A peer that comes to its first execute later than the deadline (the
 * inference ranks waiting for the trainers): the early rank's execute
 * only enqueues, it neither waits for the peer to connect nor aborts;
 * the data arrives once the peer runs. */
static void late_rank(hz_rank *r) {
  hz_plan p;
  reshard_comm_t *c = open_rank(r, &p, 4096, 300);
  if (!c) return;
  if (r->rank == 1) sleep_ms(700);
  int64_t t0 = ms_now();
  reshard_result_t e = run_plan(&p, r->rank, 0);
  int64_t dt = ms_now() - t0;
  if (e) RFAIL(r, "execute: %s", reshard_last_error());
  if (dt > 400) RFAIL(r, "execute took %lld ms to enqueue", (long long)dt);
  if (mock_stream_drain(NULL)) RFAIL(r, "the execute never completes");
  else if (reshard_selftest_check(&p.d, p.dst, r->rank, 0, "late peer")) RFAIL(r, "wrong data");
  free_plan(&p);
  reshard_comm_destroy(c);
}

static void late_peer_first_execute(void **state) {
  (void)state;
  run_world(2, 0, late_rank, NULL);
}

/* ------------------------------------------------- 6. the buffer table */

/* Executes with new buffer addresses each time, faster than the GPU (here:
 * never, the peer does not come): once the table ring is full, execute
 * must not wait without a deadline. */
static void table_rank(hz_rank *r) {
  hz_plan p;
  reshard_comm_t *c = open_rank(r, &p, 4096, 300);
  if (!c) return;
  if (r->rank == 0) {
    /* every execute with its own source buffers (all kept alive) */
    reshard_selftest_t s[8];
    reshard_selftest_alloc(&p.d, p.dst, r->rank, -1);
    reshard_result_t e = RESHARD_SUCCESS;
    int64_t t0 = ms_now();
    int k = 0;
    for (; k < 8 && !e; k++) {
      reshard_selftest_alloc(&s[k], p.src, r->rank, k);
      e = reshard_plan_execute(p.plan, (void *const *)s[k].ptr, (size_t)s[k].nbuf, (void *const *)p.d.ptr,
                               (size_t)p.d.nbuf, NULL);
    }
    int64_t dt = ms_now() - t0;
    if (e != RESHARD_ERROR_TIMEOUT || !strstr(reshard_last_error(), "buffer table"))
      RFAIL(r, "executes gave %s (%s), expected TIMEOUT", reshard_result_string(e), reshard_last_error());
    if (dt > 2500) RFAIL(r, "executes took %lld ms (deadline 300 ms)", (long long)dt);
    free_plan(&p);
    reshard_comm_destroy(c);
    mock_stream_drain(NULL);
    while (k-- > 0) reshard_selftest_free(&s[k]);
    return;
  }
  free_plan(&p);
  reshard_comm_destroy(c);
}

static void table_ring_wait_has_deadline(void **state) {
  (void)state;
  run_world(2, 0, table_rank, NULL);
}

/* ------------------------------------------ 7. staging per communicator */

/* Several plans on one communicator (one per layer group) share one
 * staging pool: GPU memory does not grow with the number of plans. */
static void pool_rank(hz_rank *r) {
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) { RFAIL(r, "comm: %s", reshard_last_error()); return; }
  hz_plan p[4];
  size_t most = 0;
  for (int k = 0; k < 4; k++) {
    if (make_plan(c, &p[k], r->n, (size_t)16384 << (k & 1), 2000))
      { RFAIL(r, "plan_create %d: %s", k, reshard_last_error()); return; }
    size_t need = 2 * (p[k].plan->send_half + p[k].plan->recv_half);
    if (need > most) most = need;
  }
  for (int step = 0; step < 2 && !r->failed; step++)
    for (int k = 0; k < 4 && !r->failed; k++) {
      if (run_plan(&p[k], r->rank, step)) RFAIL(r, "execute %d: %s", k, reshard_last_error());
      else if (mock_stream_drain(NULL)) RFAIL(r, "execute %d never completes", k);
      else if (reshard_selftest_check(&p[k].d, p[k].dst, r->rank, (uint64_t)step, "pool")) RFAIL(r, "wrong data");
    }
  /* two ranks, each at most one pool of the largest plan's size */
  if (world.staging_peak > 2 * most)
    RFAIL(r, "staging peaked at %zu bytes for 2 ranks; one pool each is %zu", world.staging_peak, most);
  for (int k = 0; k < 4; k++) free_plan(&p[k]);
  reshard_comm_destroy(c);
}

static void staging_pool_per_comm(void **state) {
  (void)state;
  world.staging_peak = world.staging_live = 0;
  run_world(2, 0, pool_rank, NULL);
}

/* ------------------------------------------------- 8. relay forwards */

/* Relay plans through the device executor: a forward reads this rank's
 * destination buffers, so its copies must resolve against the destination
 * table, and its round's pack must wait for the unpacks that wrote the
 * data, not only for the transfer that freed its staging half. A fixed
 * tp=2 -> tp=2 x dp=4 layout and random layout pairs, several rounds
 * (small staging), byte for byte. */
typedef struct relay_ctx {
  const rl_pair *pair;
  size_t staging;
  long forwards;
  pthread_mutex_t mu;
} relay_ctx;

static void relay_rank(hz_rank *r) {
  relay_ctx *x = r->ctx;
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) {
    RFAIL(r, "comm: %s", reshard_last_error());
    return;
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = x->staging;
  o.relay = 1;
  o.timeout_ms = 2000;
  reshard_plan_t *plan = NULL;
  reshard_result_t e = reshard_plan_create(c, x->pair->src, x->pair->dst, &o, &plan);
  if (e) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    reshard_comm_destroy(c);
    return;
  }
  long fw = 0;
  for (size_t i = 0; i < plan->nsends; i++) fw += plan->sends[i].fwd != 0;
  pthread_mutex_lock(&x->mu);
  x->forwards += fw;
  pthread_mutex_unlock(&x->mu);
  reshard_selftest_t s, d;
  memset(&s, 0, sizeof s);
  if (reshard_selftest_alloc(&d, x->pair->dst, r->rank, -1)) RFAIL(r, "alloc");
  M.kernel_ns = r->rank % 2 ? 1000000 : 0; /* some ranks' GPUs slower */
  for (int step = 0; step < 2 && !r->failed; step++) {
    reshard_selftest_free(&s);
    if (reshard_selftest_alloc(&s, x->pair->src, r->rank, step)) {
      RFAIL(r, "alloc");
      break;
    }
    if (reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf,
                             NULL) ||
        mock_stream_drain(NULL))
      RFAIL(r, "execute %d: %s", step, reshard_last_error());
    else if (reshard_selftest_check(&d, x->pair->dst, r->rank, (uint64_t)step, "device relay"))
      RFAIL(r, "wrong data at step %d", step);
  }
  M.kernel_ns = 0;
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_comm_destroy(c);
}

/* tp=2 -> tp=2 x dp=4 (ranks 0-1 -> 2-9): every destination replica
 * relays, two tensors of different element sizes. */
static void relay_layouts(rl_pair *pair) {
  memset(pair, 0, sizeof *pair);
  pair->nranks = 10;
  assert_int_equal(reshard_layout_create(&pair->src), 0);
  assert_int_equal(reshard_layout_create(&pair->dst), 0);
  int64_t sw[2] = {64, 48}, sb[1] = {1000};
  int tw, tb, m, b;
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L = side ? pair->dst : pair->src;
    assert_int_equal(reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, sw, &tw), 0);
    assert_int_equal(reshard_layout_add_tensor(L, "b", RESHARD_BF16, 1, sb, &tb), 0);
  }
  int s2[1] = {2}, d42[2] = {4, 2};
  reshard_placement_t p0[1] = {reshard_shard(0)}, rs1[2] = {reshard_replicate(), reshard_shard(1)};
  reshard_placement_t rs0[2] = {reshard_replicate(), reshard_shard(0)};
  assert_int_equal(reshard_layout_add_mesh_strided(pair->src, 1, s2, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(pair->src, tw, m, p0, &b), 0);
  assert_int_equal(reshard_layout_place(pair->src, tb, m, p0, &b), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(pair->dst, 2, d42, 2, 1, &m), 0);
  assert_int_equal(reshard_layout_place(pair->dst, tw, m, rs1, &b), 0);
  assert_int_equal(reshard_layout_place(pair->dst, tb, m, rs0, &b), 0);
}

static void relay_forwards_on_device(void **state) {
  (void)state;
  relay_ctx x = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rs_relay_min_part_bytes = 0; /* relay every part, however small */
  for (int k = 0; k < 4; k++) {
    rl_pair pair;
    relay_layouts(&pair);
    x.pair = &pair;
    x.staging = k < 2 ? 4096 : 65536;
    run_world(pair.nranks, k % 2, relay_rank, &x);
    reshard_layout_destroy(pair.src);
    reshard_layout_destroy(pair.dst);
  }
  long fixed = x.forwards;
  assert_true(fixed > 0);
  const char *e0 = getenv("RS_SEED0");
  uint64_t seed0 = e0 ? strtoull(e0, NULL, 10) : (uint64_t)time(NULL);
  for (int it = 0; it < 40; it++) {
    uint64_t seed = seed0 + (uint64_t)it * 7919;
    rl_pair pair;
    if (rl_pair_make(seed, RL_ANY, &pair)) fail_msg("seed %llu: layout generation failed", (unsigned long long)seed);
    x.pair = &pair;
    x.staging = 4096;
    printf("relay seed %llu (RS_SEED0=%llu replays from here)\n", (unsigned long long)seed, (unsigned long long)seed);
    run_world(pair.nranks, it % 2, relay_rank, &x);
    rl_pair_free(&pair);
  }
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  printf("relay forwards on the device: %ld forward messages (%ld in the fixed layouts)\n", x.forwards, fixed);
}

/* ------------------------------------------ agreement on the device */

/* Ranks out of step (issue 17, item 3): rank 1 passes another weight
 * version for the second step (or skips a step). Every rank exchanges
 * with every other, so every rank's agreement fails on the device: no
 * destination byte of that call is written anywhere (the buffers still
 * hold the first step, byte for byte), reshard_plan_get_status reports
 * MISMATCH naming the partner and both calls and versions, the plan
 * refuses later executes, and nobody hangs. */
typedef struct agree_ctx {
  int skip; /* rank 1 skips step 1 instead of passing another version */
} agree_ctx;

static void agree_rank(hz_rank *r) {
  agree_ctx *x = r->ctx;
  hz_plan p;
  reshard_comm_t *c = open_rank(r, &p, 4096, 400);
  if (!c) return;
  reshard_selftest_alloc(&p.d, p.dst, r->rank, -1);
  for (int step = 0; step < 2 && !r->failed; step++) {
    reshard_selftest_free(&p.s);
    reshard_selftest_alloc(&p.s, p.src, r->rank, step);
    uint64_t version = (uint64_t)step + 1;
    if (r->rank == 1 && step == 1) {
      if (x->skip) version = 3; /* its step 1 is the others' step 2 */
      else version = 7;
    }
    if (reshard_plan_execute_version(p.plan, version, (void *const *)p.s.ptr, (size_t)p.s.nbuf,
                                     (void *const *)p.d.ptr, (size_t)p.d.nbuf, NULL))
      RFAIL(r, "execute %d: %s", step, reshard_last_error());
    if (mock_stream_drain(NULL)) RFAIL(r, "execute %d never completes", step);
  }
  /* the first step's bytes, untouched by the second */
  if (reshard_selftest_check(&p.d, p.dst, r->rank, 0, "agreement")) RFAIL(r, "a mismatched call wrote data");
  reshard_plan_status_t st = {.struct_size = sizeof st};
  reshard_plan_get_status(p.plan, &st);
  char want[64];
  snprintf(want, sizeof want, "partner rank %d", r->rank == 1 ? 0 : 1);
  if (!st.failed || st.failure != RESHARD_ERROR_MISMATCH || !strstr(st.failure_message, want) ||
      !strstr(st.failure_message, x->skip ? "version 3" : "version 7"))
    RFAIL(r, "status: failed %d with %s (%s)", st.failed, reshard_result_string(st.failure), st.failure_message);
  if (run_plan(&p, r->rank, 2) != RESHARD_ERROR_INVALID_USAGE) RFAIL(r, "an execute after the mismatch was taken");
  free_plan(&p);
  reshard_comm_destroy(c);
  mock_stream_drain(NULL);
}

static void agreement_mismatch_on_device(void **state) {
  (void)state;
  agree_ctx x = {0};
  run_world(3, 1, agree_rank, &x);
  x.skip = 1;
  run_world(3, 0, agree_rank, &x);
}

/* RESHARD_FLAG_SYNC: execute itself returns the call's result. The first
 * step's data is in place when execute returns (no stream wait), and the
 * mismatched call returns MISMATCH on every rank. */
static void sync_rank(hz_rank *r) {
  hz_plan p;
  reshard_comm_t *c = open_rank(r, &p, 4096, 1000);
  if (!c) return;
  reshard_selftest_alloc(&p.d, p.dst, r->rank, -1);
  for (int step = 0; step < 2 && !r->failed; step++) {
    reshard_selftest_free(&p.s);
    reshard_selftest_alloc(&p.s, p.src, r->rank, step);
    uint64_t version = r->rank == 2 && step == 1 ? 9 : (uint64_t)step + 1;
    reshard_result_t e = reshard_plan_execute_version(p.plan, version, (void *const *)p.s.ptr, (size_t)p.s.nbuf,
                                                      (void *const *)p.d.ptr, (size_t)p.d.nbuf, NULL);
    if (step == 0 && e) RFAIL(r, "execute 0: %s", reshard_last_error());
    if (step == 0 && reshard_selftest_check(&p.d, p.dst, r->rank, 0, "sync")) RFAIL(r, "data not there on return");
    if (step == 1 && (e != RESHARD_ERROR_MISMATCH || !strstr(reshard_last_error(), "version 9")))
      RFAIL(r, "the mismatched execute gave %s (%s)", reshard_result_string(e), reshard_last_error());
  }
  if (reshard_selftest_check(&p.d, p.dst, r->rank, 0, "sync")) RFAIL(r, "a mismatched call wrote data");
  free_plan(&p);
  reshard_comm_destroy(c);
  mock_stream_drain(NULL);
}

/* An abort ends pending transfers early, and the launches behind them on
 * reshard's streams then run: the unpacks must find the gate closed, not
 * write the half-received staging. Ranks 0 and 1 exchange a tensor; rank
 * 2 only copies locally, but the plan is a relay plan (relay 1), whose
 * verdict every rank reduces. At the second step rank 2 does not come:
 * ranks 0 and 1 swap headers and agree, their reduction waits for rank 2
 * until the deadline, the poll aborts, and their unpacks run. Before the
 * fix (gates closed before the abort, dev_comm.c) they wrote the stale
 * receive half: the first step's data over the destination, which the
 * test had overwritten with a pattern. */
static void abort_gate_rank(hz_rank *r) {
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) { RFAIL(r, "comm: %s", reshard_last_error()); return; }
  hz_plan p;
  memset(&p, 0, sizeof p);
  assert_int_equal(reshard_layout_create(&p.src), 0);
  assert_int_equal(reshard_layout_create(&p.dst), 0);
  add_exchange(p.src, p.dst, "a", 64, 64, (int[]){0, 1}, 2);
  add_exchange(p.src, p.dst, "b", 16, 16, (int[]){2}, 1);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 300;
  o.relay = 1;
  if (reshard_plan_create(c, p.src, p.dst, &o, &p.plan)) { RFAIL(r, "plan_create: %s", reshard_last_error()); return; }
  if (run_plan(&p, r->rank, 0) || mock_stream_drain(NULL)) RFAIL(r, "step 0: %s", reshard_last_error());
  else if (reshard_selftest_check(&p.d, p.dst, r->rank, 0, "abort")) RFAIL(r, "step 0 wrong");
  if (r->rank < 2 && !r->failed) {
    for (int b = 0; b < p.d.nbuf; b++)
      if (p.d.ptr[b]) memset(p.d.ptr[b], 0x5a, p.d.bytes[b]);
    if (run_plan(&p, r->rank, 1)) RFAIL(r, "step 1 enqueue: %s", reshard_last_error());
    reshard_plan_status_t st = {.struct_size = sizeof st};
    for (int64_t t0 = ms_now(); !st.failed && ms_now() - t0 < 3000; sleep_ms(5)) reshard_plan_get_status(p.plan, &st);
    if (st.failure != RESHARD_ERROR_TIMEOUT) RFAIL(r, "status %s (%s)", reshard_result_string(st.failure), st.failure_message);
    if (mock_stream_drain(NULL)) RFAIL(r, "the aborted work never drained");
    long changed = 0;
    for (int b = 0; b < p.d.nbuf; b++)
      for (size_t i = 0; p.d.ptr[b] && i < p.d.bytes[b]; i++) changed += p.d.ptr[b][i] != 0x5a;
    if (changed) RFAIL(r, "%ld destination bytes written after the abort", changed);
  }
  free_plan(&p);
  reshard_comm_destroy(c);
}

static void abort_closes_gates(void **state) {
  (void)state;
  run_world(3, 0, abort_gate_rank, NULL);
}

static void sync_flag_returns_the_result(void **state) {
  (void)state;
  hz_flags = RESHARD_FLAG_SYNC;
  run_world(3, 0, sync_rank, NULL);
  hz_flags = 0;
}

/* The same in a relay plan (tp=2 -> tp=2 x dp=4): source rank 0 passes
 * another version for the second step. Members that get rank 0's part
 * only through forwards swap no header with it: without the verdict made
 * global they would write the forwarder's old bytes and report success.
 * Every rank must report MISMATCH, and keep the first step's bytes. */
static void relay_agree_rank(hz_rank *r) {
  rl_pair *pair = r->ctx;
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) {
    RFAIL(r, "comm: %s", reshard_last_error());
    return;
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = 4096;
  o.relay = 1;
  o.timeout_ms = 2000;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(c, pair->src, pair->dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    reshard_comm_destroy(c);
    return;
  }
  reshard_selftest_t s, d;
  memset(&s, 0, sizeof s);
  reshard_selftest_alloc(&d, pair->dst, r->rank, -1);
  for (int step = 0; step < 2 && !r->failed; step++) {
    reshard_selftest_free(&s);
    reshard_selftest_alloc(&s, pair->src, r->rank, step);
    uint64_t version = r->rank == 0 && step == 1 ? 7 : (uint64_t)step + 1;
    if (reshard_plan_execute_version(plan, version, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                     (size_t)d.nbuf, NULL) ||
        mock_stream_drain(NULL))
      RFAIL(r, "execute %d: %s", step, reshard_last_error());
  }
  if (reshard_selftest_check(&d, pair->dst, r->rank, 0, "relay agreement")) RFAIL(r, "a mismatched call wrote data");
  reshard_plan_status_t st = {.struct_size = sizeof st};
  reshard_plan_get_status(plan, &st);
  if (!st.failed || st.failure != RESHARD_ERROR_MISMATCH || st.failed_call != 1)
    RFAIL(r, "status: failed %d with %s at call %llu (%s)", st.failed, reshard_result_string(st.failure),
          (unsigned long long)st.failed_call, st.failure_message);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_comm_destroy(c);
  mock_stream_drain(NULL);
}

static void agreement_mismatch_in_relay_plan(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  rl_pair pair;
  relay_layouts(&pair);
  run_world(pair.nranks, 0, relay_agree_rank, &pair);
  reshard_layout_destroy(pair.src);
  reshard_layout_destroy(pair.dst);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

/* ------------------------------------------------- 9, 10. misuse */

/* An execute inside the caller's own ncclGroupStart would launch nothing
 * (NCCL launches at the outermost ncclGroupEnd), and its unpacks would
 * run before the data: refused, nothing enqueued, and (its partner having
 * queued its half) the communicator poisoned; nobody hangs. */
static void inside_caller_group_rank(hz_rank *r) {
  hz_plan p;
  reshard_comm_t *c = open_rank(r, &p, 4096, 300);
  if (!c) return;
  /* rank 1 runs its call normally, rank 0 inside its own group */
  if (r->rank == 0) ncclGroupStart();
  reshard_result_t e = run_plan(&p, r->rank, 0);
  if (r->rank == 0) {
    ncclGroupEnd();
    if (e != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "ncclGroupStart"))
      RFAIL(r, "execute inside a group gave %s (%s)", reshard_result_string(e), reshard_last_error());
    /* the partner queued its half: this rank's communicator is poisoned,
     * so no later call can pair with it */
    e = run_plan(&p, r->rank, 1);
    if (e != RESHARD_ERROR_INVALID_USAGE) RFAIL(r, "execute after the refusal gave %s", reshard_result_string(e));
  } else if (e) {
    RFAIL(r, "execute: %s", reshard_last_error());
  }
  int64_t t0 = ms_now();
  free_plan(&p);
  reshard_comm_destroy(c);
  if (ms_now() - t0 > 2500) RFAIL(r, "destroy took %lld ms (deadline 300 ms)", (long long)(ms_now() - t0));
  mock_stream_drain(NULL);
}

static void execute_inside_caller_group(void **state) {
  (void)state;
  run_world(2, 0, inside_caller_group_rank, NULL);
}

/* The current device must be the communicator's: refused with both named,
 * at plan creation (on every rank: the others hear of it through the
 * agreement) and at execute. */
static void device_rank(hz_rank *r) {
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) {
    RFAIL(r, "comm: %s", reshard_last_error());
    return;
  }
  hz_plan p;
  if (r->rank == 1) M.device = 1; /* the communicator's is 0 */
  reshard_result_t e = make_plan(c, &p, r->n, 4096, 2000);
  M.device = 0;
  if (r->rank == 1 && (e != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "device 1")))
    RFAIL(r, "plan_create on the wrong device gave %s (%s)", reshard_result_string(e), reshard_last_error());
  if (r->rank == 0 && e != RESHARD_ERROR_REMOTE)
    RFAIL(r, "plan_create with a peer on the wrong device gave %s (%s)", reshard_result_string(e),
          reshard_last_error());
  free_plan(&p);
  /* nothing was queued: the communicator still serves */
  if (make_plan(c, &p, r->n, 4096, 300)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    return;
  }
  for (int step = 0; step < 2 && !r->failed; step++) {
    if (run_plan(&p, r->rank, step) || mock_stream_drain(NULL)) RFAIL(r, "execute: %s", reshard_last_error());
    else if (reshard_selftest_check(&p.d, p.dst, r->rank, (uint64_t)step, "device")) RFAIL(r, "wrong data");
  }
  if (r->rank == 1) M.device = 1;
  e = run_plan(&p, r->rank, 2);
  M.device = 0;
  if (r->rank == 1 && (e != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "device 1")))
    RFAIL(r, "execute on the wrong device gave %s (%s)", reshard_result_string(e), reshard_last_error());
  free_plan(&p);
  reshard_comm_destroy(c);
  mock_stream_drain(NULL);
}

static void wrong_device_refused(void **state) {
  (void)state;
  run_world(2, 0, device_rank, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(setup_failure_fails_creation),
      cmocka_unit_test(partial_queue_failure_no_hang),
      cmocka_unit_test(caller_comm_never_aborted),
      cmocka_unit_test(nonblocking_caller_comm),
      cmocka_unit_test(inprogress_posts_whole_round),
      cmocka_unit_test(rotated_order_never_hangs),
      cmocka_unit_test(agreement_independent_of_backlog),
      cmocka_unit_test(late_peer_first_execute),
      cmocka_unit_test(table_ring_wait_has_deadline),
      cmocka_unit_test(staging_pool_per_comm),
      cmocka_unit_test(relay_forwards_on_device),
      cmocka_unit_test(agreement_mismatch_on_device),
      cmocka_unit_test(agreement_mismatch_in_relay_plan),
      cmocka_unit_test(sync_flag_returns_the_result),
      cmocka_unit_test(abort_closes_gates),
      cmocka_unit_test(execute_inside_caller_group),
      cmocka_unit_test(wrong_device_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
