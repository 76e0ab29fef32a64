/* Allocation failures: every allocation that layout building and plan
 * creation make is failed in turn, on one rank at a time.
 *
 * Plan creation: for each rank r and n = 0, 1, ... until the fault no
 * longer fires, rank r's n-th allocation inside reshard_plan_create fails.
 * Rank r must return RESHARD_ERROR_OUT_OF_MEMORY with a message, every
 * other rank RESHARD_ERROR_REMOTE, every rank a NULL plan, and the same
 * communicators must then create and execute a clean plan byte-exact.
 * Leaks are left to ASan/valgrind, which run this binary in CI.
 *
 * Layout building: the n-th allocation of building both layouts fails;
 * the failing call must return RESHARD_ERROR_OUT_OF_MEMORY and leave the
 * layout unchanged, which the retried call and the digest of the finished
 * layout (equal to a fault-free build's) show.
 *
 * CMocka's assertions longjmp and so stay on the main thread: rank threads
 * record their first failure and the main thread asserts after joining. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "layout/layout.h"
#include "reshard.h"
#include "support/fault_layouts.h"
#include "support/harness.h"

/* No sweep needs more: a bound that turns a runaway loop into a failure. */
#define MAX_SWEEP 100000

/* ------------------------------------------------------------------ */
/* Layout building                                                     */
/* ------------------------------------------------------------------ */

typedef struct build_sweep {
  int faults;     /* failed builder calls seen in this build */
  char why[512];  /* first unexpected failure */
} build_sweep;

static int on_build_fail(void *ctx, reshard_result_t r, const char *call) {
  build_sweep *b = ctx;
  int fired = rs_alloc_fault_fired();
  if (!b->why[0] && (r != RESHARD_ERROR_OUT_OF_MEMORY || !fired || !strstr(reshard_last_error(), "out of memory")))
    snprintf(b->why, sizeof b->why, "%s returned %d (%s) with the fault %s", call, (int)r, reshard_last_error(),
             fired ? "fired" : "not fired");
  b->faults++;
  /* the fault is spent: the retry must succeed on an unchanged layout */
  return fired;
}

static void layout_build_sweep(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  unsigned long before = rs_alloc_count();
  assert_int_equal(fl_build_mixed(&src, &dst, NULL), RESHARD_SUCCESS);
  unsigned long allocs = rs_alloc_count() - before;
  const uint64_t want_src = rs_layout_digest(src, 1), want_dst = rs_layout_digest(dst, 2);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);

  long n = 0;
  for (; n < MAX_SWEEP; n++) {
    build_sweep b = {0};
    fl_guard g = {on_build_fail, &b};
    rs_alloc_fail_after(n);
    reshard_result_t r = fl_build_mixed(&src, &dst, &g);
    int fired = rs_alloc_fault_fired();
    rs_alloc_fail_after(-1);
    if (b.why[0]) fail_msg("allocation %ld: %s", n, b.why);
    if (r != RESHARD_SUCCESS) fail_msg("allocation %ld: build failed after the retry: %s", n, reshard_last_error());
    if (!fired) {
      assert_int_equal(b.faults, 0);
      reshard_layout_destroy(src);
      reshard_layout_destroy(dst);
      break;
    }
    if (b.faults != 1) fail_msg("allocation %ld: the fault fired but %d builder calls failed", n, b.faults);
    if (rs_layout_digest(src, 1) != want_src || rs_layout_digest(dst, 2) != want_dst)
      fail_msg("allocation %ld: a failed call changed the layout (digest differs from a clean build)", n);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
  }
  assert_true(n < MAX_SWEEP);
  /* every allocation of the build was failed once */
  assert_int_equal((unsigned long)n, allocs);
  print_message("layout building: swept %ld allocation calls\n", n);
}

/* ------------------------------------------------------------------ */
/* Plan creation                                                       */
/* ------------------------------------------------------------------ */

typedef struct plan_sweep {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  int victim;
  pthread_barrier_t bar;
  pthread_mutex_t lock;
  /* written by the victim before the first barrier of a case */
  int fired;
  /* written under lock */
  int failed;
  char why[1024];
  long swept;             /* faults that fired */
  unsigned long clean_allocs; /* the victim's allocations in a clean create */
  /* per rank, from a clean plan: what the sweep covers */
  int rounds[FL_NRANKS];
  size_t local_bytes[FL_NRANKS], messages[FL_NRANKS];
} plan_sweep;

static void sweep_fail(plan_sweep *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sweep_fail(plan_sweep *s, const char *fmt, ...) {
  pthread_mutex_lock(&s->lock);
  if (!s->failed++) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->why, sizeof s->why, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&s->lock);
}

/* A clean create and execute on comm, checked byte for byte. Returns 0 on
 * success; the plan_create result otherwise (or -1 for wrong bytes). */
static int clean_round(plan_sweep *s, int rank, reshard_comm_t *comm, long step, const char *label) {
  reshard_plan_t *plan = NULL;
  unsigned long before = rs_alloc_count();
  reshard_result_t r = reshard_plan_create(comm, s->src, s->dst, &s->opts, &plan);
  if (rank == s->victim) s->clean_allocs = rs_alloc_count() - before;
  if (r != RESHARD_SUCCESS) {
    sweep_fail(s, "%s: rank %d: clean plan_create failed: %s", label, rank, reshard_last_error());
    return (int)r;
  }
  reshard_plan_stats_t st;
  if (reshard_plan_get_stats(plan, &st) == RESHARD_SUCCESS) {
    s->rounds[rank] = st.num_chunks;
    s->local_bytes[rank] = st.local_copy_bytes;
    s->messages[rank] = st.send_messages + st.recv_messages;
  }
  th_side in, out;
  int bad = 0;
  if (th_side_alloc(&in, s->src, rank, step) || th_side_alloc(&out, s->dst, rank, -1)) {
    sweep_fail(s, "%s: rank %d: cannot allocate test buffers", label, rank);
    bad = -1;
  } else {
    r = reshard_plan_execute(plan, (void *const *)in.ptr, (size_t)in.nbuf, (void *const *)out.ptr, (size_t)out.nbuf,
                             NULL);
    if (r != RESHARD_SUCCESS) {
      sweep_fail(s, "%s: rank %d: execute failed: %s", label, rank, reshard_last_error());
      bad = (int)r;
    } else if (th_side_check(&out, s->dst, rank, (uint64_t)step, label)) {
      sweep_fail(s, "%s: rank %d: destination differs from the expected bytes", label, rank);
      bad = -1;
    }
  }
  th_side_free(&in);
  th_side_free(&out);
  reshard_plan_destroy(plan);
  return bad;
}

static int plan_sweep_rank(int rank, reshard_comm_t *comm, void *arg) {
  plan_sweep *s = arg;
  const int victim = rank == s->victim;
  if (clean_round(s, rank, comm, 0, "warm-up")) return 1;
  for (long n = 0; n < MAX_SWEEP; n++) {
    char label[64];
    snprintf(label, sizeof label, "rank %d allocation %ld", s->victim, n);
    /* a pointer create must overwrite */
    reshard_plan_t *plan = (reshard_plan_t *)&s->fired;
    if (victim) rs_alloc_fail_after(n);
    reshard_result_t r = reshard_plan_create(comm, s->src, s->dst, &s->opts, &plan);
    if (victim) {
      s->fired = rs_alloc_fault_fired();
      rs_alloc_fail_after(-1);
    }
    pthread_barrier_wait(&s->bar);
    const int fired = s->fired;
    const char *err = reshard_last_error();
    if (fired) {
      reshard_result_t want = victim ? RESHARD_ERROR_OUT_OF_MEMORY : RESHARD_ERROR_REMOTE;
      if (r != want)
        sweep_fail(s, "%s: rank %d returned %d (%s), expected %d", label, rank, (int)r, err, (int)want);
      else if (victim ? !strstr(err, "out of memory") : !err[0])
        sweep_fail(s, "%s: rank %d: missing or wrong message '%s'", label, rank, err);
      if (plan != NULL) {
        sweep_fail(s, "%s: rank %d: *plan is not NULL after a failure", label, rank);
        if (r == RESHARD_SUCCESS) reshard_plan_destroy(plan);
      }
    } else {
      if (r != RESHARD_SUCCESS) sweep_fail(s, "%s: rank %d: no fault fired but plan_create failed: %s", label, rank, err);
      reshard_plan_destroy(plan == (reshard_plan_t *)&s->fired ? NULL : plan);
    }
    /* the communicators still work */
    clean_round(s, rank, comm, n + 1, label);
    if (victim && fired) s->swept++;
    /* Every check of this case is done past this barrier, and the next
     * case writes s->fired and s->failed only after all ranks have entered
     * its plan_create (a collective), so all ranks read the same here. */
    pthread_barrier_wait(&s->bar);
    if (!fired || s->failed) break;
  }
  return 0;
}

static void plan_create_sweep(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  assert_int_equal(fl_build_mixed(&src, &dst, NULL), RESHARD_SUCCESS);
  long total = 0;
  for (int victim = 0; victim < FL_NRANKS; victim++) {
    plan_sweep s;
    memset(&s, 0, sizeof s);
    s.src = src;
    s.dst = dst;
    s.opts = fl_options();
    s.victim = victim;
    assert_int_equal(pthread_barrier_init(&s.bar, NULL, FL_NRANKS), 0);
    assert_int_equal(pthread_mutex_init(&s.lock, NULL), 0);
    int failed_ranks = th_run_ranks(FL_NRANKS, plan_sweep_rank, &s);
    pthread_barrier_destroy(&s.bar);
    pthread_mutex_destroy(&s.lock);
    if (s.failed) fail_msg("%s", s.why);
    assert_int_equal(failed_ranks, 0);
    /* each allocation of a clean create was failed once */
    if ((unsigned long)s.swept != s.clean_allocs)
      fail_msg("rank %d: swept %ld allocations, a clean create makes %lu", victim, s.swept, s.clean_allocs);
    print_message("plan creation: rank %d: swept %ld allocation calls (its plan: %d rounds, %zu messages, %zu bytes "
                  "of local copies)\n",
                  victim, s.swept, s.rounds[victim], s.messages[victim], s.local_bytes[victim]);
    /* the plan is the non-trivial one this test claims to sweep */
    assert_true(s.rounds[victim] >= 2);
    assert_true(s.messages[victim] > 0);
    if (victim == 0) assert_true(s.local_bytes[victim] > 0);
    total += s.swept;
  }
  print_message("plan creation: swept %ld allocation calls over %d ranks\n", total, FL_NRANKS);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* The hook itself: one fault per arming, on this thread only. */
static void hook_semantics(void **state) {
  (void)state;
  rs_alloc_fail_after(1);
  void *a = rs_malloc(8);
  assert_non_null(a);
  assert_false(rs_alloc_fault_fired());
  assert_null(rs_calloc(2, 8));
  assert_true(rs_alloc_fault_fired());
  void *b = rs_realloc(a, 16);
  assert_non_null(b);
  char *c = rs_strdup("abc");
  assert_string_equal(c, "abc");
  rs_alloc_fail_after(0);
  assert_null(rs_strdup("abc"));
  rs_alloc_fail_after(0);
  assert_null(rs_realloc(b, 32)); /* b stays valid */
  rs_alloc_fail_after(-1);
  assert_false(rs_alloc_fault_fired());
  unsigned long n0 = rs_alloc_count();
  free(rs_malloc(1));
  assert_int_equal(rs_alloc_count(), n0 + 1);
  free(b);
  free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hook_semantics),
      cmocka_unit_test(layout_build_sweep),
      cmocka_unit_test(plan_create_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
