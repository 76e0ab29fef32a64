/* Replicas that leave and join without replacing one another
 * (reshard_comm_ucx_resize, reshard_comm_create_ucx_joining), plain
 * processes launched by tests/ucx/run_ucx.sh without mpirun:
 *
 *   run_ucx.sh LIMIT_S 6 -- ./test_ucx_resize steps
 *   run_ucx.sh LIMIT_S 4 -- ./test_ucx_resize retry
 *   run_ucx.sh LIMIT_S 4 -- ./test_ucx_resize early
 *   run_ucx.sh LIMIT_S 4 -- ./test_ucx_resize ahead
 *
 * The layouts are those of a job of n ranks: ranks 0 and 1 train (the
 * source), ranks 2 .. n-1 are inference replicas of one rank each (the
 * destination; with n = 2, rank 0 trains and rank 1 infers): "w" (int32 12 x 20) sharded by rows over the trainers and
 * replicated on every replica, "b" (fp32, 84 elements) sharded over the
 * trainers and over the replicas. So a replica's share of "b" depends on
 * its rank: a wrong renumbering shows. Every version checks every
 * destination element against the self-test's values from global
 * coordinates, and every byte around them (reshard_selftest_check).
 *
 * steps (6 processes P0 .. P5; P5 is no member at first):
 *   0. P0 .. P4 make a communicator of 5; the refusals of
 *      reshard_comm_ucx_resize (INVALID_ARGUMENT, nothing changed, the
 *      communicator still works); version 1 over 5 ranks.
 *   1. P2 leaves (destroys its communicator); P0, P1, P3, P4 call
 *      resize({2}, 0 joining): they are ranks 0, 1, 2, 3 of 4 now. The
 *      plan of step 0 is refused (execute and reshard_plan_rejoin:
 *      INVALID_USAGE naming the resize), every buffer untouched; a new
 *      plan moves version 2 over 4 ranks.
 *   2. P4 (rank 3) leaves, and P2 and P4 come back as newcomers, ranks 3
 *      and 4 of 5 (reshard_comm_create_ucx_joining): one call leaves and
 *      joins (resize({3}, 2 joining) on P0, P1, P3); version 3 over 5.
 *      P5 asks to join (as rank 5 of 6) from the start: its address
 *      reaches rank 0 during this step's rendezvous, and waits there.
 *   3. P0 .. P4 call resize(none, 1 joining): P5 is rank 5 of 6; version
 *      4 over 6 ranks.
 *   Every process prints PASS/FAIL lines and TIMING lines (each resize
 *   call, and each newcomer's join call, to its first version checked).
 *
 * retry (4 processes): P0, P1, P2 make a communicator of 3 (version 1);
 *   P2 runs four agreements ahead (four lone plan creations that time out),
 *   leaves, and asks to come back as rank 2 of 5: P0 and P1 call
 *   resize({2}, 1 joining, 1500 ms), rank 0 turns the newcomer of another
 *   size away (its creation fails at once, "rank 0 gave up") and the
 *   resize ends in TIMEOUT within the deadline + 1 s, saying nothing
 *   changed, rank and size as before; the plan of before (still current)
 *   then fails at once on the closed connection to rank 2 (BACKEND, no
 *   crash). Called again, the resize meets the late P3 (rank 2 of 3): the
 *   agreements P2 left behind pair with nothing (the epoch is in the
 *   agreements' tags), the plan of before is refused (execute,
 *   reshard_plan_rejoin, register, estimate), version 2 over the
 *   new three. Then P3 leaves and P0 and P1 call resize({2}, 0 joining):
 *   a shrink needs no answer from the leaving rank; version 3 over 2.
 *
 * early (4 processes): rejoins whose newcomers came before the staying
 *   ranks called (run_early).
 *
 * ahead (4 processes): a leaving process's agreements left behind
 *   (run_ahead). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reshard.h"
#include "reshard_selftest.h"
#include "reshard_ucx.h"

#define TIMEOUT_MS 20000
#define GRACE_MS 1000

static const char *rendezvous;
static int proc = -1, nprocs = -1;

#define SAY_FMT "P%d"
#define SAY_ID proc
#include "ucx/say.h"

/* The trainers' (side 0) or the replicas' (side 1) layout of a job of n
 * ranks. */
static reshard_layout_t *make_layout(int n, int side) {
  reshard_layout_t *L = NULL;
  int ntrain = n >= 3 ? 2 : 1, reps = n - ntrain, tw, tb, mesh, b;
  int64_t sw[2] = {12, 20}, sb[1] = {84};
  reshard_placement_t pw = side == 0 ? reshard_shard(0) : reshard_replicate(), pb = reshard_shard(0);
  if (reshard_layout_create(&L) || reshard_layout_add_tensor(L, "w", RESHARD_INT32, 2, sw, &tw) ||
      reshard_layout_add_tensor(L, "b", RESHARD_FP32, 1, sb, &tb) ||
      reshard_layout_add_mesh_strided(L, 1, side == 0 ? &ntrain : &reps, side == 0 ? 0 : ntrain, 1, &mesh) ||
      reshard_layout_place(L, tw, mesh, &pw, &b) || reshard_layout_place(L, tb, mesh, &pb, &b)) {
    say(0, "layout of %d ranks: %s", n, reshard_last_error());
    reshard_layout_destroy(L);
    return NULL;
  }
  return L;
}

/* A plan over the communicator as it is now, and version v through it. */
typedef struct job {
  reshard_layout_t *L[2];
  reshard_plan_t *plan;
  reshard_selftest_t s, d;
  int rank, size;
  uint64_t v;
} job_t;

static void job_free(job_t *j) {
  reshard_plan_destroy(j->plan);
  reshard_selftest_free(&j->s);
  reshard_selftest_free(&j->d);
  reshard_layout_destroy(j->L[0]);
  reshard_layout_destroy(j->L[1]);
  memset(j, 0, sizeof *j);
}

static void job_version(reshard_comm_t *comm, job_t *j, uint64_t v, const char *what) {
  memset(j, 0, sizeof *j);
  j->rank = reshard_comm_rank(comm), j->size = reshard_comm_size(comm), j->v = v;
  j->L[0] = make_layout(j->size, 0), j->L[1] = make_layout(j->size, 1);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 10000;
  reshard_result_t r = !j->L[0] || !j->L[1] ? RESHARD_ERROR_INVALID_ARGUMENT
                                             : reshard_plan_create(comm, j->L[0], j->L[1], &o, &j->plan);
  if (!r && !(r = reshard_selftest_alloc(&j->s, j->L[0], j->rank, (int64_t)v)) &&
      !(r = reshard_selftest_alloc(&j->d, j->L[1], j->rank, -1)))
    r = reshard_plan_execute(j->plan, (void *const *)j->s.ptr, (size_t)j->s.nbuf, (void *const *)j->d.ptr,
                             (size_t)j->d.nbuf, NULL);
  const int64_t wrong = r ? -1 : reshard_selftest_check(&j->d, j->L[1], j->rank, (int64_t)v, what);
  say(r == RESHARD_SUCCESS && wrong == 0, "%s: version %llu as rank %d of %d: %s, %lld wrong elements or bytes %s",
      what, (unsigned long long)v, j->rank, j->size, reshard_result_string(r), (long long)wrong,
      r ? reshard_last_error() : "");
}

/* A plan made before a resize: refused, its buffers untouched. */
static void stale_refused(job_t *j, const char *what) {
  reshard_result_t r = reshard_plan_execute(j->plan, (void *const *)j->s.ptr, (size_t)j->s.nbuf,
                                            (void *const *)j->d.ptr, (size_t)j->d.nbuf, NULL);
  say(r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "resized"),
      "%s: the plan of before refuses an execute: %s: %s", what, reshard_result_string(r), reshard_last_error());
  r = reshard_plan_rejoin(j->plan);
  say(r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "resized"),
      "%s: and reshard_plan_rejoin: %s: %s", what, reshard_result_string(r), reshard_last_error());
  r = reshard_plan_register_buffers(j->plan, (void *const *)j->s.ptr, (size_t)j->s.nbuf, (void *const *)j->d.ptr,
                                    (size_t)j->d.nbuf);
  say(r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "resized"),
      "%s: and reshard_plan_register_buffers: %s: %s", what, reshard_result_string(r), reshard_last_error());
  /* (resolve with nothing in doubt reaches no peer: nothing to do) */
  r = reshard_plan_resolve(j->plan, 1000);
  say(r == RESHARD_SUCCESS, "%s: reshard_plan_resolve with nothing in doubt: %s", what, reshard_result_string(r));
  reshard_estimate_t e = RESHARD_ESTIMATE_INITIALIZER;
  r = reshard_plan_estimate(j->plan, &e);
  say(r == RESHARD_ERROR_INVALID_USAGE && strstr(reshard_last_error(), "resized"),
      "%s: and reshard_plan_estimate: %s: %s", what, reshard_result_string(r), reshard_last_error());
  /* the destination still holds the plan's last version, whole: nothing
   * was written */
  const int64_t wrong = reshard_selftest_check(&j->d, j->L[1], j->rank, (int64_t)j->v, what);
  say(wrong == 0, "%s: the refused plan's destination still holds version %llu: %lld wrong", what,
      (unsigned long long)j->v, (long long)wrong);
}

static int expect_rank(reshard_comm_t *comm, int rank, int size, const char *what) {
  const int ok = reshard_comm_rank(comm) == rank && reshard_comm_size(comm) == size;
  say(ok, "%s: rank %d of %d (expected %d of %d)", what, reshard_comm_rank(comm), reshard_comm_size(comm), rank,
      size);
  return ok;
}

static reshard_result_t resize(reshard_comm_t *comm, const int *leaving, int nleave, int njoin, int timeout_ms,
                               const char *what) {
  const double t0 = now_ms();
  reshard_result_t r = reshard_comm_ucx_resize(comm, leaving, nleave, njoin, timeout_ms);
  printf("TIMING P%d: %s: comm_ucx_resize %.1f ms\n", proc, what, now_ms() - t0);
  if (r) say(0, "%s: comm_ucx_resize: %s: %s", what, reshard_result_string(r), reshard_last_error());
  return r;
}

static reshard_comm_t *join(int rank, int size, int timeout_ms, const char *what, double *t0) {
  reshard_comm_t *comm = NULL;
  *t0 = now_ms();
  reshard_result_t r = reshard_comm_create_ucx_joining(rendezvous, rank, size, timeout_ms, &comm);
  say(r == RESHARD_SUCCESS, "%s: joined as rank %d of %d: %s after %.0f ms %s", what, rank, size,
      reshard_result_string(r), now_ms() - *t0, r ? reshard_last_error() : "");
  return comm;
}

/* A communicator of `size` made with the others (NULL, said, on failure). */
static reshard_comm_t *create(int size) {
  reshard_comm_t *comm = NULL;
  reshard_result_t r = reshard_comm_create_ucx(rendezvous, proc, size, TIMEOUT_MS, &comm);
  if (r) say(0, "comm_create_ucx: %s: %s", reshard_result_string(r), reshard_last_error());
  return comm;
}

/* Whether the run has the n processes a mode needs (said if not). */
static int have(int n, const char *mode) {
  if (nprocs != n) say(0, "%s needs %d processes", mode, n);
  return nprocs == n;
}

/* This rank runs `count` agreements ahead of the others: lone plan
 * creations (the job of `size` ranks) that time out, their messages
 * left waiting at the other ranks. */
static void run_ahead_alone(reshard_comm_t *comm, int size, int count) {
  reshard_layout_t *L[2] = {make_layout(size, 0), make_layout(size, 1)};
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 200;
  for (int k = 0; k < count; k++) {
    reshard_plan_t *lone = NULL;
    reshard_result_t r = reshard_plan_create(comm, L[0], L[1], &o, &lone);
    say(r == RESHARD_ERROR_TIMEOUT, "a lone plan creation %d times out: %s", k, reshard_result_string(r));
  }
  reshard_layout_destroy(L[0]);
  reshard_layout_destroy(L[1]);
}

static void refusals(reshard_comm_t *comm) {
  const int me = reshard_comm_rank(comm), size = reshard_comm_size(comm);
  const int other = me == 1 ? 2 : 1, twice[2] = {other, other}, zero[1] = {0}, self[1] = {me}, out[1] = {size};
  const struct {
    const int *leaving;
    int nleave, njoin;
    const char *why, *says;
  } cases[] = {{NULL, 0, 0, "nothing to change", "nothing to change"},
               {NULL, 1, 0, "NULL leaving ranks", "(NULL)"},
               {twice, -1, 1, "a negative leaving count", "ranks leaving"},
               {twice, 1, -1, "a negative joining count", "a negative count"},
               {zero, 1, 0, "rank 0 leaving", "rank 0 holds"},
               {self, 1, 1, "this rank leaving", me == 0 ? "rank 0 holds" : "this rank is one leaving"},
               {out, 1, 0, "a rank out of range", "of size"},
               {twice, 2, 0, "a rank named twice", "named twice"},
               {twice, size, 0, "as many leaving as the communicator", "ranks leaving"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    reshard_result_t r = reshard_comm_ucx_resize(comm, cases[i].leaving, cases[i].nleave, cases[i].njoin, 1000);
    say(r == RESHARD_ERROR_INVALID_ARGUMENT && strstr(reshard_last_error(), cases[i].says) &&
            reshard_comm_rank(comm) == me && reshard_comm_size(comm) == size,
        "resize with %s refused, nothing changed: %s: %s", cases[i].why, reshard_result_string(r),
        reshard_last_error());
  }
}

static int run_steps(void) {
  if (!have(6, "steps")) return 1;
  reshard_comm_t *comm = NULL;
  job_t j;
  double t0 = 0;
  if (proc == 5) { /* asks to join the communicator of 6 from the start: admitted at step 3 */
    comm = join(5, 6, 3 * TIMEOUT_MS, "step 3 (P5, early)", &t0);
    if (!comm) return 1;
    expect_rank(comm, 5, 6, "step 3 (P5)");
    job_version(comm, &j, 4, "step 3");
    printf("TIMING P%d: step 3: join call to version 4 checked %.1f ms\n", proc, now_ms() - t0);
    job_free(&j);
    reshard_comm_destroy(comm);
    return bad != 0;
  }
  if (!(comm = create(5))) return 1;
  reshard_result_t r;
  refusals(comm);
  job_version(comm, &j, 1, "step 0");
  /* step 1: P2 leaves */
  if (proc == 2) {
    job_free(&j);
    reshard_comm_destroy(comm);
    comm = join(3, 5, 2 * TIMEOUT_MS, "step 2 (P2, back)", &t0);
  } else {
    const int two[1] = {2};
    r = resize(comm, two, 1, 0, TIMEOUT_MS, "step 1");
    expect_rank(comm, proc < 2 ? proc : proc - 1, 4, "step 1");
    if (!r) stale_refused(&j, "step 1");
    job_free(&j);
    if (!r) job_version(comm, &j, 2, "step 1");
    /* step 2: P4 (rank 3 now) leaves and comes back; P2 comes back */
    if (proc == 4) {
      job_free(&j);
      reshard_comm_destroy(comm);
      comm = join(4, 5, TIMEOUT_MS, "step 2 (P4, back)", &t0);
    } else {
      const int three[1] = {3};
      t0 = now_ms();
      r = resize(comm, three, 1, 2, TIMEOUT_MS, "step 2");
      expect_rank(comm, proc < 2 ? proc : 2, 5, "step 2");
      if (!r) stale_refused(&j, "step 2");
      job_free(&j);
    }
  }
  if (!comm) return 1;
  job_version(comm, &j, 3, "step 2");
  printf("TIMING P%d: step 2: join or resize call to version 3 checked %.1f ms\n", proc, now_ms() - t0);
  /* step 3: P5 joins */
  t0 = now_ms();
  r = resize(comm, NULL, 0, 1, TIMEOUT_MS, "step 3");
  static const int after_step2[5] = {0, 1, 3, 2, 4}; /* P0 .. P4's ranks since step 2 */
  expect_rank(comm, after_step2[proc], 6, "step 3");
  if (!r) stale_refused(&j, "step 3");
  job_free(&j);
  job_version(comm, &j, 4, "step 3");
  printf("TIMING P%d: step 3: resize call to version 4 checked %.1f ms\n", proc, now_ms() - t0);
  job_free(&j);
  reshard_comm_destroy(comm);
  return bad != 0;
}

static int run_retry(void) {
  if (!have(4, "retry")) return 1;
  const int timeout_ms = 1500;
  reshard_comm_t *comm = NULL;
  job_t j, old;
  double t0 = 0;
  reshard_result_t r;
  if (proc == 3) { /* the late newcomer: after the first resize timed out */
    usleep((useconds_t)(2000 + timeout_ms + 2 * GRACE_MS) * 1000);
    comm = join(2, 3, TIMEOUT_MS, "the late newcomer", &t0);
    if (!comm) return 1;
    job_version(comm, &j, 2, "replaced");
    job_free(&j);
    reshard_comm_destroy(comm); /* and leaves: the others shrink without it */
    return bad != 0;
  }
  if (!(comm = create(3))) return 1;
  job_version(comm, &old, 1, "the first job");
  if (proc == 2) {
    /* runs four agreements ahead of the others (four lone plan creations
     * that time out: their messages wait at ranks 0 and 1), leaves, and
     * asks to come back with another size, which rank 0 turns away */
    run_ahead_alone(comm, 3, 4);
    job_free(&old);
    reshard_comm_destroy(comm);
    t0 = now_ms();
    r = reshard_comm_create_ucx_joining(rendezvous, 2, 5, TIMEOUT_MS, &comm);
    say(r == RESHARD_ERROR_TIMEOUT && strstr(reshard_last_error(), "rank 0 gave up") && now_ms() - t0 < 5000,
        "a newcomer of another size is turned away: %s after %.0f ms: %s", reshard_result_string(r), now_ms() - t0,
        reshard_last_error());
    return bad != 0;
  }
  usleep(2000 * 1000); /* (rank 2's lone agreements have landed) */
  const int two[1] = {2};
  t0 = now_ms();
  r = reshard_comm_ucx_resize(comm, two, 1, 1, timeout_ms);
  const double ms = now_ms() - t0;
  say(r == RESHARD_ERROR_TIMEOUT && ms <= timeout_ms + GRACE_MS && strstr(reshard_last_error(), "nothing changed") &&
          (proc != 0 || strstr(reshard_last_error(), "turned away")),
      "resize with no newcomer yet (and one of another size): %s after %.0f ms (deadline %d ms + %d ms): %s",
      reshard_result_string(r), ms, timeout_ms, GRACE_MS, reshard_last_error());
  expect_rank(comm, proc, 3, "after the timed-out resize");
  /* the numbering of before is back, rank 2's connection closed: the plan
   * of before (still current: no resize held) fails at once, no crash */
  t0 = now_ms();
  r = reshard_plan_execute(old.plan, (void *const *)old.s.ptr, (size_t)old.s.nbuf, (void *const *)old.d.ptr,
                           (size_t)old.d.nbuf, NULL);
  say(r != RESHARD_SUCCESS && now_ms() - t0 < 2000 && strstr(reshard_last_error(), "no connection to rank 2"),
      "the plan of before, rank 2 gone: %s after %.0f ms: %s", reshard_result_string(r), now_ms() - t0,
      reshard_last_error());
  r = resize(comm, two, 1, 1, TIMEOUT_MS, "the resize called again");
  expect_rank(comm, proc, 3, "replaced");
  if (!r) stale_refused(&old, "replaced");
  job_free(&old);
  job_version(comm, &j, 2, "replaced");
  job_free(&j);
  r = resize(comm, two, 1, 0, TIMEOUT_MS, "shrunk");
  expect_rank(comm, proc, 2, "shrunk");
  job_version(comm, &j, 3, "shrunk");
  job_free(&j);
  reshard_comm_destroy(comm);
  return bad != 0;
}

/* ahead (4 processes): P2 runs two agreements ahead of the others right
 * after the communicator's creation (two lone plan creations that time
 * out: their messages wait at P0 and P1) and leaves; P0 and P1 call
 * resize({2}, 1 joining) and P3 takes rank 2: the agreements P2 left
 * behind must not pair with the resize's first agreement (the epoch is in
 * the agreements' tags; without it both failed with MISMATCH, "paired
 * with another kind"); a version moves over the new three. */
static int run_ahead(void) {
  if (!have(4, "ahead")) return 1;
  reshard_comm_t *comm = NULL;
  job_t j;
  double t0 = 0;
  if (proc == 3) {
    usleep(1500 * 1000);
    comm = join(2, 3, TIMEOUT_MS, "the newcomer", &t0);
    if (!comm) return 1;
  } else {
    if (!(comm = create(3))) return 1;
    if (proc == 2) {
      run_ahead_alone(comm, 3, 2);
      reshard_comm_destroy(comm);
      return bad != 0;
    }
    usleep(1000 * 1000);
    const int two[1] = {2};
    if (resize(comm, two, 1, 1, TIMEOUT_MS, "ahead")) {
      reshard_comm_destroy(comm);
      return 1;
    }
  }
  job_version(comm, &j, 1, "after the resize");
  job_free(&j);
  reshard_comm_destroy(comm);
  return bad != 0;
}

/* early (4 processes): a rejoin whose newcomer came first. P0, P1, P2
 * make a communicator of 3 while P3, a standby for rank 2, asks to join
 * as rank 2 at once: rank 0 accepts its connection during the creation
 * (it listens all along) and its address waits there. After version 1,
 * P2 leaves; P0 and P1 call reshard_comm_ucx_rejoin(2), which must find
 * the standby's address (it drains the old process's messages, not the
 * rendezvous' own: draining everything under rank 2 lost it, and the
 * rejoin timed out); version 2 over P0, P1, P3. */
static int run_early(void) {
  if (!have(4, "early")) return 1;
  reshard_comm_t *comm = NULL;
  job_t j;
  double t0 = 0;
  reshard_result_t r;
  if (proc == 3) {
    comm = join(2, 3, TIMEOUT_MS, "the standby newcomer", &t0);
    if (!comm) return 1;
  } else {
    if (proc > 0) usleep(500 * 1000); /* (rank 0 waits for them: the standby connects first) */
    if (!(comm = create(3))) return 1;
    job_version(comm, &j, 1, "before");
    job_free(&j);
    if (proc == 2) {
      reshard_comm_destroy(comm);
      return bad != 0;
    }
    usleep(300 * 1000);
    t0 = now_ms();
    r = reshard_comm_ucx_rejoin(comm, 2, 5000);
    say(r == RESHARD_SUCCESS, "the rejoin meets the newcomer that came first: %s after %.0f ms %s",
        reshard_result_string(r), now_ms() - t0, r ? reshard_last_error() : "");
  }
  job_version(comm, &j, 2, "after");
  job_free(&j);
  reshard_comm_destroy(comm);
  return bad != 0;
}

int main(int argc, char **argv) {
  int i = 1;
  for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
    if (!strcmp(argv[i], "--rendezvous")) rendezvous = argv[i + 1];
    else if (!strcmp(argv[i], "--rank")) proc = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--size")) nprocs = atoi(argv[i + 1]);
  }
  if (!rendezvous || proc < 0 || proc >= nprocs || i >= argc) {
    fprintf(stderr, "usage: test_ucx_resize --rendezvous H:P --rank R --size N steps | retry | early | ahead\n");
    return 2;
  }
  if (!strcmp(argv[i], "steps")) return run_steps();
  if (!strcmp(argv[i], "retry")) return run_retry();
  if (!strcmp(argv[i], "early")) return run_early();
  if (!strcmp(argv[i], "ahead")) return run_ahead();
  fprintf(stderr, "unknown mode %s\n", argv[i]);
  return 2;
}
