/* The per-execute agreement: ranks at different steps fail with
 * RESHARD_ERROR_MISMATCH on both sides of each affected pair (their
 * partners with REMOTE, ranks further away at their deadline), never a
 * hang or mixed data; a failed plan refuses later executes and says why;
 * versions are recorded; overlapping calls of one plan are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "reshard.h"
#include "support/harness.h"

#define NR 4
#define MSG 1024

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void add_whole_rows(reshard_layout_t *L, const char *name, int rank, int64_t rows) {
  int64_t shape[2] = {rows, 16};
  int t = -1, m = -1, b = -1;
  assert_int_equal(reshard_layout_add_tensor(L, name, RESHARD_FP32, 2, shape, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh(L, 1, (int[]){1}, (int[]){rank}, &m), RESHARD_SUCCESS);
  reshard_placement_t rep[1] = {reshard_replicate()};
  assert_int_equal(reshard_layout_place(L, t, m, rep, &b), RESHARD_SUCCESS);
}

static void add_whole(reshard_layout_t *L, const char *name, int rank) { add_whole_rows(L, name, rank, 8); }

/* A chain: 'a' 0 -> 1, 'b' 2 -> 1, 'c' 3 -> 2. Partners: 0-1, 1-2, 2-3. */
static void chain(reshard_layout_t **src, reshard_layout_t **dst) {
  assert_int_equal(reshard_layout_create(src), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_create(dst), RESHARD_SUCCESS);
  add_whole(*src, "a", 0);
  add_whole(*src, "b", 2);
  add_whole(*src, "c", 3);
  add_whole(*dst, "a", 1);
  add_whole(*dst, "b", 1);
  add_whole(*dst, "c", 2);
}

typedef struct run {
  const reshard_layout_t *src, *dst;
  int64_t timeout_ms;
  /* versions[rank][i]: the i-th call's version (0 ends the list) */
  uint64_t versions[NR][4];
  reshard_result_t code[NR][4];
  char msg[NR][4][MSG];
  double secs[NR][4];
  int64_t bad[NR][4];
  int64_t written[NR][4]; /* destination bytes written so far, after each call */
  reshard_result_t after_code[NR]; /* one more call after the list */
  char after_msg[NR][MSG];
  reshard_plan_status_t status[NR];
  int problems;
} run;

static int run_rank(int rank, reshard_comm_t *comm, void *arg) {
  run *x = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = x->timeout_ms;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, x->src, x->dst, &o, &plan)) {
    fprintf(stderr, "rank %d: plan_create: %s\n", rank, reshard_last_error());
    __atomic_fetch_add(&x->problems, 1, __ATOMIC_RELAXED);
    return 1;
  }
  th_side d;
  if (th_side_alloc(&d, x->dst, rank, -1)) return 1;
  int i = 0;
  for (; i < 4 && x->versions[rank][i]; i++) {
    uint64_t v = x->versions[rank][i];
    th_side s;
    if (th_side_alloc(&s, x->src, rank, (int64_t)v)) return 1;
    double t0 = now_s();
    x->code[rank][i] = reshard_plan_execute_version(plan, v, (void *const *)s.ptr, (size_t)s.nbuf,
                                                    (void *const *)d.ptr, (size_t)d.nbuf, NULL);
    x->secs[rank][i] = now_s() - t0;
    snprintf(x->msg[rank][i], MSG, "%s", reshard_last_error());
    if (x->code[rank][i] == RESHARD_SUCCESS) x->bad[rank][i] = th_side_check(&d, x->dst, rank, v, "agreement");
    x->written[rank][i] = th_side_written(&d);
    th_side_free(&s);
  }
  {
    /* a plain execute: the version after the last one */
    uint64_t v = i ? x->versions[rank][i - 1] + 1 : 1;
    th_side s;
    if (th_side_alloc(&s, x->src, rank, (int64_t)v)) return 1;
    x->after_code[rank] = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                               (size_t)d.nbuf, NULL);
    snprintf(x->after_msg[rank], MSG, "%s", reshard_last_error());
    if (x->after_code[rank] == RESHARD_SUCCESS) x->bad[rank][3] = th_side_check(&d, x->dst, rank, v, "after");
    th_side_free(&s);
  }
  /* a caller that did not say how large its struct is gets an error */
  reshard_plan_status_t unsized;
  memset(&unsized, 0, sizeof unsized);
  if (reshard_plan_get_status(plan, &unsized) != RESHARD_ERROR_INVALID_ARGUMENT ||
      !strstr(reshard_last_error(), "struct_size"))
    __atomic_fetch_add(&x->problems, 1, __ATOMIC_RELAXED);
  x->status[rank].struct_size = sizeof x->status[rank];
  if (reshard_plan_get_status(plan, &x->status[rank])) __atomic_fetch_add(&x->problems, 1, __ATOMIC_RELAXED);
  /* the message lives in the plan: keep a copy past destroy */
  static char keep[NR][MSG];
  snprintf(keep[rank], MSG, "%s", x->status[rank].failure_message);
  x->status[rank].failure_message = keep[rank];
  th_side_free(&d);
  reshard_plan_destroy(plan);
  return 0;
}

static void expect_msg(const char *msg, const char *const *subs) {
  for (int k = 0; subs[k]; k++)
    if (!strstr(msg, subs[k])) fail_msg("\"%s\" not in \"%s\"", subs[k], msg);
}
#define EXPECT_MSG(msg, ...) expect_msg((msg), (const char *const[]){__VA_ARGS__, NULL})

/* Rank 0 skips version 2: its second call (version 3) meets rank 1's
 * second call (version 2). */
static void skipped_step(void **state) {
  (void)state;
  run x;
  memset(&x, 0, sizeof x);
  chain((reshard_layout_t **)&x.src, (reshard_layout_t **)&x.dst);
  x.timeout_ms = 500;
  uint64_t v0[4] = {1, 3}, vo[4] = {1, 2};
  memcpy(x.versions[0], v0, sizeof v0);
  for (int r = 1; r < NR; r++) memcpy(x.versions[r], vo, sizeof vo);
  assert_int_equal(th_run_ranks(NR, run_rank, &x), 0);
  assert_int_equal(x.problems, 0);
  /* step 1 moved exactly its data everywhere */
  for (int r = 0; r < NR; r++) {
    if (x.code[r][0] != RESHARD_SUCCESS) fail_msg("rank %d step 1: %s", r, x.msg[r][0]);
    assert_int_equal(x.bad[r][0], 0);
  }
  /* the pair: MISMATCH on both sides, naming both ranks and the steps */
  assert_int_equal(x.code[0][1], RESHARD_ERROR_MISMATCH);
  EXPECT_MSG(x.msg[0][1], "execute rank 0", "rank 1", "expected call 1 version 3", "received call 1 version 2");
  assert_int_equal(x.code[1][1], RESHARD_ERROR_MISMATCH);
  EXPECT_MSG(x.msg[1][1], "execute rank 1", "rank 0", "expected call 1 version 2", "received call 1 version 3");
  /* rank 2 hears it from rank 1. Rank 3 is further away and only sends
   * (eagerly, to rank 2, which drops it): its own part completes, so it
   * may succeed; it must not hang. */
  assert_int_equal(x.code[2][1], RESHARD_ERROR_REMOTE);
  EXPECT_MSG(x.msg[2][1], "rank 1", "mismatch");
  /* from rank 1's status, not at its deadline */
  if (x.secs[2][1] >= 0.45) fail_msg("rank 2 took %.3f s to learn of rank 1's failure", x.secs[2][1]);
  if (x.code[3][1] != RESHARD_SUCCESS && x.code[3][1] != RESHARD_ERROR_REMOTE &&
      x.code[3][1] != RESHARD_ERROR_TIMEOUT)
    fail_msg("rank 3: %d: %s", (int)x.code[3][1], x.msg[3][1]);
  for (int r = 0; r < NR; r++) {
    if (x.secs[r][1] > 3.0) fail_msg("rank %d took %.2f s with a 500 ms timeout", r, x.secs[r][1]);
    if (r == 3 && x.code[3][1] == RESHARD_SUCCESS) {
      /* its next execute finds rank 2 refusing: it stops at its deadline */
      assert_int_equal(x.after_code[3], RESHARD_ERROR_TIMEOUT);
      continue;
    }
    /* the failed plan refuses, saying which call failed and why */
    assert_int_equal(x.after_code[r], RESHARD_ERROR_INVALID_USAGE);
    EXPECT_MSG(x.after_msg[r], "failed earlier, at execute call 1", "destroy the plan");
    assert_true(x.status[r].failed);
    assert_int_equal(x.status[r].failure, x.code[r][1]);
    assert_int_equal(x.status[r].failed_call, 1);
    assert_int_equal(x.status[r].executes_completed, 1);
    assert_int_equal(x.status[r].committed_version, 1);
    assert_int_equal(x.status[r].active_copy, -1);
  }
  EXPECT_MSG(x.after_msg[0], "mismatch", "version 3");
  EXPECT_MSG(x.status[1].failure_message, "expected call 1 version 2");
  reshard_layout_destroy((reshard_layout_t *)x.src);
  reshard_layout_destroy((reshard_layout_t *)x.dst);
}

/* Different versions at the very first call. */
static void different_versions(void **state) {
  (void)state;
  run x;
  memset(&x, 0, sizeof x);
  chain((reshard_layout_t **)&x.src, (reshard_layout_t **)&x.dst);
  x.timeout_ms = 500;
  for (int r = 0; r < NR; r++) x.versions[r][0] = r == 3 ? 8 : 7;
  assert_int_equal(th_run_ranks(NR, run_rank, &x), 0);
  assert_int_equal(x.problems, 0);
  assert_int_equal(x.code[3][0], RESHARD_ERROR_MISMATCH);
  EXPECT_MSG(x.msg[3][0], "execute rank 3", "rank 2", "version 8", "received call 0 version 7");
  assert_int_equal(x.code[2][0], RESHARD_ERROR_MISMATCH);
  EXPECT_MSG(x.msg[2][0], "execute rank 2", "rank 3", "version 7", "received call 0 version 8");
  /* rank 1 waits for rank 2's data, and learns from rank 2's status */
  assert_int_equal(x.code[1][0], RESHARD_ERROR_REMOTE);
  if (x.secs[1][0] >= 0.45) fail_msg("rank 1 took %.3f s to learn of rank 2's failure", x.secs[1][0]);
  /* rank 0 only sends to rank 1: see skipped_step */
  if (x.code[0][0] != RESHARD_SUCCESS && x.code[0][0] != RESHARD_ERROR_REMOTE &&
      x.code[0][0] != RESHARD_ERROR_TIMEOUT)
    fail_msg("rank 0: %d: %s", (int)x.code[0][0], x.msg[0][0]);
  for (int r = 1; r < NR; r++) {
    assert_int_equal(x.status[r].committed_version, 0);
    assert_int_equal(x.status[r].executes_completed, 0);
    assert_true(x.status[r].failed);
    if (x.secs[r][0] > 3.0) fail_msg("rank %d took %.2f s", r, x.secs[r][0]);
  }
  reshard_layout_destroy((reshard_layout_t *)x.src);
  reshard_layout_destroy((reshard_layout_t *)x.dst);
}

/* Round 0's sends leave before the agreement's headers are checked
 * (exec/execute.c), so a partner at another version delivers its data
 * anyway: it must land in staging only and write nothing. Without
 * `direct`: 't' rows x 16 from ranks 0 and 2 (column halves) to rank 1
 * whole, strided receives, posted before the check. With it: 'a' 0 -> 1
 * whole, one contiguous run, a receive that would land in place: at 8
 * rows (512 bytes) it lands in staging, at 1024 rows (64 KiB) it is split
 * into a head that lands in staging and a tail that waits for the check.
 * Rank 0 is at version `v0`, the others at 7: with v0 = 7 the same
 * messages deliver every element (checked) instead. */
static void early_data(int direct, int64_t rows, uint64_t v0) {
  run x;
  memset(&x, 0, sizeof x);
  reshard_layout_t *src, *dst;
  assert_int_equal(reshard_layout_create(&src), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_create(&dst), RESHARD_SUCCESS);
  if (direct) {
    add_whole_rows(src, "a", 0, rows);
    add_whole_rows(dst, "a", 1, rows);
  } else {
    int64_t shape[2] = {rows, 16};
    int t = -1, m = -1, b = -1;
    assert_int_equal(reshard_layout_add_tensor(src, "t", RESHARD_FP32, 2, shape, &t), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_add_mesh(src, 1, (int[]){2}, (int[]){0, 2}, &m), RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_place(src, t, m, (reshard_placement_t[]){reshard_shard(1)}, &b),
                     RESHARD_SUCCESS);
    add_whole_rows(dst, "t", 1, rows);
  }
  x.src = src;
  x.dst = dst;
  x.timeout_ms = 500;
  for (int r = 0; r < 3; r++) x.versions[r][0] = r == 0 ? v0 : 7;
  assert_int_equal(th_run_ranks(3, run_rank, &x), 0);
  assert_int_equal(x.problems, 0);
  if (v0 == 7) {
    for (int r = 0; r < 3; r++) {
      if (x.code[r][0]) fail_msg("rank %d: %s", r, x.msg[r][0]);
      assert_int_equal(x.bad[r][0], 0); /* every element, and nothing outside */
    }
  } else {
    assert_int_equal(x.code[0][0], RESHARD_ERROR_MISMATCH);
    assert_int_equal(x.code[1][0], RESHARD_ERROR_MISMATCH);
    EXPECT_MSG(x.msg[1][0], "execute rank 1", "rank 0", "version 7", "received call 0 version 8");
    if (x.written[1][0]) fail_msg("rank 1 wrote %lld destination bytes of a mismatched call", (long long)x.written[1][0]);
  }
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void early_data_staged(void **state) {
  (void)state;
  early_data(0, 8, 8);
}

static void early_data_direct(void **state) {
  (void)state;
  early_data(1, 8, 8);
}

/* The split round-0 messages (exec/execute.c's head_bytes): strided
 * (head and tail in staging) and direct (tail in place). */
static void early_data_split(void **state) {
  (void)state;
  early_data(0, 1024, 8);
  early_data(1, 1024, 8);
}

static void split_delivers(void **state) {
  (void)state;
  early_data(0, 1024, 7);
  early_data(1, 1024, 7);
  early_data(1, 8, 7);
}

/* Explicit versions need not be consecutive; plain executes continue
 * from the last one. */
static void versions_recorded(void **state) {
  (void)state;
  run x;
  memset(&x, 0, sizeof x);
  chain((reshard_layout_t **)&x.src, (reshard_layout_t **)&x.dst);
  x.timeout_ms = 5000;
  uint64_t v[4] = {10, 20, 35};
  for (int r = 0; r < NR; r++) memcpy(x.versions[r], v, sizeof v);
  assert_int_equal(th_run_ranks(NR, run_rank, &x), 0);
  assert_int_equal(x.problems, 0);
  for (int r = 0; r < NR; r++) {
    for (int i = 0; i < 3; i++) {
      if (x.code[r][i]) fail_msg("rank %d call %d: %s", r, i, x.msg[r][i]);
      assert_int_equal(x.bad[r][i], 0);
    }
    /* the plain execute after the list is version 36 */
    if (x.after_code[r]) fail_msg("rank %d plain execute: %s", r, x.after_msg[r]);
    assert_int_equal(x.bad[r][3], 0);
    assert_false(x.status[r].failed);
    assert_int_equal(x.status[r].failure, RESHARD_SUCCESS);
    assert_string_equal(x.status[r].failure_message, "");
    assert_int_equal(x.status[r].executes_completed, 4);
    assert_int_equal(x.status[r].committed_version, 36);
  }
  reshard_layout_destroy((reshard_layout_t *)x.src);
  reshard_layout_destroy((reshard_layout_t *)x.dst);
}

/* A plain execute on one rank meets an explicit version on the other:
 * plain calls are numbered 1, 2, ... so version 5 disagrees. */
static int plain_vs_explicit_rank(int rank, reshard_comm_t *comm, void *arg) {
  reshard_result_t *codes = arg;
  reshard_layout_t *src, *dst;
  if (reshard_layout_create(&src) || reshard_layout_create(&dst)) return 1;
  float s[4] = {1, 2, 3, 4}, d[4] = {0};
  int64_t shape[1] = {4};
  int t, m, b;
  reshard_placement_t rep[1] = {reshard_replicate()};
  reshard_layout_add_tensor(src, "w", RESHARD_FP32, 1, shape, &t);
  reshard_layout_add_mesh(src, 1, (int[]){1}, (int[]){0}, &m);
  reshard_layout_place(src, t, m, rep, &b);
  reshard_layout_add_tensor(dst, "w", RESHARD_FP32, 1, shape, &t);
  reshard_layout_add_mesh(dst, 1, (int[]){1}, (int[]){1}, &m);
  reshard_layout_place(dst, t, m, rep, &b);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 500;
  reshard_plan_t *plan = NULL;
  int rc = reshard_plan_create(comm, src, dst, &o, &plan) != 0;
  void *S[1] = {s}, *D[1] = {d};
  if (!rc) {
    if (rank == 0) codes[rank] = reshard_plan_execute(plan, S, 1, NULL, 0, NULL);
    else codes[rank] = reshard_plan_execute_version(plan, 5, NULL, 0, D, 1, NULL);
    for (int i = 0; i < 4; i++) rc |= d[i] != 0; /* nothing landed */
  }
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  return rc;
}

static void plain_vs_explicit(void **state) {
  (void)state;
  reshard_result_t codes[2] = {RESHARD_SUCCESS, RESHARD_SUCCESS};
  assert_int_equal(th_run_ranks(2, plain_vs_explicit_rank, codes), 0);
  assert_int_equal(codes[0], RESHARD_ERROR_MISMATCH);
  assert_int_equal(codes[1], RESHARD_ERROR_MISMATCH);
}

/* Calls of one plan must not overlap (issue 42, item 7): two threads of
 * a rank executing one plan would pair with the partners' calls in
 * whatever order the threads ran, the data of one step landing in the
 * buffers of another. On ranks 0, 2 and 3 two threads call execute on
 * one plan at once, each with its own destination buffers. Neither call
 * can complete before rank 1 executes (every chain passes through it),
 * and rank 1 executes only once the other ranks saw a refusal (or after
 * 10 s), so the two calls overlap on each of those ranks: exactly one is
 * refused at once with INVALID_USAGE ("must not overlap"), writes
 * nothing and leaves the plan usable; the other completes with every
 * element right, and a next call of the plan succeeds. */
typedef struct conc {
  const reshard_layout_t *src, *dst;
  reshard_plan_t *plan[NR];
  int refused[NR], succeeded[NR], problems;
  double refuse_s[NR];
} conc;

typedef struct conc_job {
  conc *c;
  int rank;
} conc_job;

static void conc_problem(conc *c, int rank, const char *what) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, reshard_last_error());
  __atomic_fetch_add(&c->problems, 1, __ATOMIC_RELAXED);
}

static void *conc_thread(void *p) {
  conc_job *j = p;
  conc *c = j->c;
  th_side s, d;
  if (th_side_alloc(&s, c->src, j->rank, 1) || th_side_alloc(&d, c->dst, j->rank, -1)) {
    conc_problem(c, j->rank, "alloc");
    return NULL;
  }
  double t0 = now_s();
  reshard_result_t r = reshard_plan_execute(c->plan[j->rank], (void *const *)s.ptr, (size_t)s.nbuf,
                                            (void *const *)d.ptr, (size_t)d.nbuf, NULL);
  if (r == RESHARD_SUCCESS) {
    if (th_side_check(&d, c->dst, j->rank, 1, "the call that ran")) conc_problem(c, j->rank, "wrong data");
    __atomic_fetch_add(&c->succeeded[j->rank], 1, __ATOMIC_RELAXED);
  } else if (r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "must not overlap")) {
    c->refuse_s[j->rank] = now_s() - t0;
    for (int b = 0; b < d.nbuf; b++)
      for (size_t k = 0; k < d.bytes[b]; k++)
        if (d.ptr[b][k] != TH_SENTINEL) {
          conc_problem(c, j->rank, "the refused call wrote its buffers");
          b = d.nbuf;
          break;
        }
    __atomic_fetch_add(&c->refused[j->rank], 1, __ATOMIC_RELEASE);
  } else {
    conc_problem(c, j->rank, "unexpected result");
  }
  th_side_free(&s);
  th_side_free(&d);
  return NULL;
}

static int conc_rank(int rank, reshard_comm_t *comm, void *arg) {
  conc *c = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  if (reshard_plan_create(comm, c->src, c->dst, &o, &c->plan[rank])) return 1;
  conc_job job = {c, rank};
  if (rank == 1) {
    /* the hub waits for the refusals elsewhere (10 s at most) */
    for (int i = 0; i < 10000; i++) {
      if (__atomic_load_n(&c->refused[0], __ATOMIC_ACQUIRE) && __atomic_load_n(&c->refused[2], __ATOMIC_ACQUIRE) &&
          __atomic_load_n(&c->refused[3], __ATOMIC_ACQUIRE))
        break;
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    conc_thread(&job);
  } else {
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, conc_thread, &job);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  }
  /* the plan is usable: the next call (version 2) runs on every rank */
  th_side s, d;
  if (th_side_alloc(&s, c->src, rank, 2) || th_side_alloc(&d, c->dst, rank, -1)) return 1;
  if (reshard_plan_execute(c->plan[rank], (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                           (size_t)d.nbuf, NULL) ||
      th_side_check(&d, c->dst, rank, 2, "next call"))
    conc_problem(c, rank, "the call after the overlap");
  th_side_free(&s);
  th_side_free(&d);
  reshard_plan_status_t st = {.struct_size = sizeof st};
  reshard_plan_get_status(c->plan[rank], &st);
  int rc = st.executes_completed != 2 || st.failed || st.committed_version != 2;
  reshard_plan_destroy(c->plan[rank]);
  return rc;
}

static void overlapping_executes_refused(void **state) {
  (void)state;
  conc c;
  memset(&c, 0, sizeof c);
  chain((reshard_layout_t **)&c.src, (reshard_layout_t **)&c.dst);
  assert_int_equal(th_run_ranks(NR, conc_rank, &c), 0);
  assert_int_equal(c.problems, 0);
  for (int r = 0; r < NR; r++) {
    assert_int_equal(c.succeeded[r], 1);
    assert_int_equal(c.refused[r], r == 1 ? 0 : 1);
    if (r != 1 && c.refuse_s[r] > 1.0) fail_msg("rank %d: the refusal took %.2f s", r, c.refuse_s[r]);
  }
  reshard_layout_destroy((reshard_layout_t *)c.src);
  reshard_layout_destroy((reshard_layout_t *)c.dst);
}

/* The status call's own checks. */
static void status_arguments(void **state) {
  (void)state;
  reshard_plan_status_t st = {.struct_size = sizeof st};
  assert_int_equal(reshard_plan_get_status(NULL, &st), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "plan is NULL"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(skipped_step),       cmocka_unit_test(different_versions),
      cmocka_unit_test(early_data_staged),  cmocka_unit_test(early_data_direct),
      cmocka_unit_test(early_data_split),   cmocka_unit_test(split_delivers),
      cmocka_unit_test(versions_recorded),  cmocka_unit_test(plain_vs_explicit),
      cmocka_unit_test(overlapping_executes_refused), cmocka_unit_test(status_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
