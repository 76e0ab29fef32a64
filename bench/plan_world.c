/* The passes of plan_world.h. */
#include "plan_world.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reshard_internal.h"
#include "plan_measure.h"
#include "stage_store.h"

static int pw_nthreads;

enum { PW_MAX_THREADS = 64 };

void pw_set_threads(int n) { pw_nthreads = n > 0 ? (n < PW_MAX_THREADS ? n : PW_MAX_THREADS) : 0; }

int pw_threads(void) {
  if (pw_nthreads > 0) return pw_nthreads;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > PW_MAX_THREADS ? PW_MAX_THREADS : (int)n;
}

struct pw_run {
  const reshard_layout_t *src, *dst;
  int nranks;
  reshard_options_t opts;
  ss_store *store;
  pw_agreed agreed;
};

/* ---- running one pass over the ranks on the threads ---- */

enum { PASS_STAGE = PW_PASS_STAGE, PASS_CHUNK = PW_PASS_CHUNK, PASS_PLAN = PW_PASS_PLANS };

static pthread_mutex_t prof_lock = PTHREAD_MUTEX_INITIALIZER;
static pw_profile prof;
static int (*prof_class)(int, void *);
static void *prof_arg;

void pw_set_rank_class(int (*class_of)(int rank, void *arg), void *arg) {
  prof_class = class_of;
  prof_arg = arg;
}

void pw_get_profile(pw_profile *out) {
  pthread_mutex_lock(&prof_lock);
  *out = prof;
  pthread_mutex_unlock(&prof_lock);
}

static double now_s(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* What the first agreement reduces from the ranks' first stages. */
typedef struct stage_max {
  int32_t spread;
  uint64_t est[RS_PHASE_CANDIDATES];
  rs_pace pace[RS_WIDE_CANDIDATES];
} stage_max;

static void stage_max_add(stage_max *m, const rs_plan_stage *st) {
  if (st->spread > m->spread) m->spread = st->spread;
  for (int k = 0; k < RS_PHASE_CANDIDATES; k++)
    if (st->phase_est[k] > m->est[k]) m->est[k] = st->phase_est[k];
  rs_pace_merge(m->pace, st->pace_cand);
}

typedef struct pass {
  pw_run *run;
  int kind;
  pw_plan_fn in_order;
  void *arg;
  pthread_mutex_t lock;
  pthread_cond_t turn_moved;
  int next; /* the next rank to plan */
  int turn; /* the rank whose in_order call is next */
  /* the first failure: its rank, result and message */
  int failed_rank;
  reshard_result_t failed;
  char msg[1024];
  /* reductions (under lock): the stages' maxima, the run's and its
   * twin's (a stage pass that also keeps the first-replica twin,
   * pw_share_first_replica), and the smallest chunk */
  stage_max most, twin_most;
  size_t chunk;
  uint64_t digest, twin_digest; /* the creation digests, once a rank has computed them */
  pw_run *twin;
} pass;

static void pass_fail(pass *ps, int rank, reshard_result_t r) {
  pthread_mutex_lock(&ps->lock);
  if (!ps->failed || rank < ps->failed_rank) {
    ps->failed = r;
    ps->failed_rank = rank;
    snprintf(ps->msg, sizeof ps->msg, "%s", reshard_last_error());
  }
  pthread_cond_broadcast(&ps->turn_moved);
  pthread_mutex_unlock(&ps->lock);
}

/* One rank of a pass: its creation against a fake communicator, as the
 * pass's kind wants it. */
static reshard_result_t pass_rank(pass *ps, int rank, rs_plan_stage *scratch) {
  pw_run *run = ps->run;
  const pw_agreed *a = &run->agreed;
  rs_plan_stage stage = {0}, twin = {0};
  reshard_result_t r = RESHARD_SUCCESS;
  if (ps->kind == PASS_STAGE) {
    /* the layouts' coverage was checked once (pw_run_create); their
     * digest is the same for every rank: from the first rank done */
    pthread_mutex_lock(&ps->lock);
    const uint64_t digest = ps->digest, twin_digest = ps->twin_digest;
    pthread_mutex_unlock(&ps->lock);
    rs_plan_force = (rs_plan_agreed){.stop = RS_PLAN_STOP_STAGE, .keep = &stage, .covered = 1, .digest = digest,
                                     .twin = ps->twin ? &twin : NULL, .twin_digest = twin_digest, .back = scratch};
  } else {
    /* decoded into the thread's scratch, whose segment memory the
     * creation hands back for the next rank */
    r = ss_store_get(run->store, rank, scratch);
    if (r) return r;
    stage = *scratch;
    *scratch = (rs_plan_stage){0};
    rs_plan_force = (rs_plan_agreed){.set_spread = 1, .spread = a->spread, .set_phases = 1, .phases = a->phases,
                                     .wide = a->wide, .pace = a->pace, .use = &stage, .back = scratch};
    if (ps->kind == PASS_CHUNK) rs_plan_force.stop = RS_PLAN_STOP_CHUNK;
    else rs_plan_force.set_chunk = 1, rs_plan_force.chunk = a->chunk;
  }
  reshard_comm_t *comm = NULL;
  reshard_plan_t *plan = NULL;
  r = pm_plan_rank(run->src, run->dst, rank, run->nranks, &run->opts, &comm, &plan);
  rs_plan_force = (rs_plan_agreed){0};
  if (!r && ps->kind == PASS_STAGE) {
    pthread_mutex_lock(&ps->lock);
    ps->digest = stage.digest;
    stage_max_add(&ps->most, &stage);
    if (ps->twin) {
      ps->twin_digest = twin.digest;
      stage_max_add(&ps->twin_most, &twin);
    }
    pthread_mutex_unlock(&ps->lock);
    r = ss_store_put(run->store, rank, &stage);
    if (!r && ps->twin) r = ss_store_put(ps->twin->store, rank, &twin);
  }
  if (ps->kind == PASS_STAGE) { /* the segment memory, for the next rank's stage */
    rs_seg_vec_free(&scratch->segs);
    rs_seg_vec_changed(&stage.segs);
    scratch->segs = stage.segs;
    scratch->segs.n = 0;
    stage.segs = (rs_seg_vec){0};
  }
  rs_plan_stage_free(&stage);
  rs_plan_stage_free(&twin);
  if (r) {
    rs_error_prefix("rank %d: ", rank);
    if (plan) pm_plan_free(comm, plan);
    return r;
  }
  if (ps->kind == PASS_STAGE || ps->kind == PASS_CHUNK) {
    pthread_mutex_lock(&ps->lock);
    if (ps->kind == PASS_CHUNK && (!ps->chunk || plan->chunk_bytes < ps->chunk)) ps->chunk = plan->chunk_bytes;
    pthread_mutex_unlock(&ps->lock);
    pm_plan_free(comm, plan);
    return RESHARD_SUCCESS;
  }
  if (ps->in_order) {
    pthread_mutex_lock(&ps->lock);
    while (ps->turn != rank && !ps->failed) pthread_cond_wait(&ps->turn_moved, &ps->lock);
    int go = !ps->failed;
    pthread_mutex_unlock(&ps->lock);
    if (go) r = ps->in_order(rank, plan, ps->arg);
    else r = RESHARD_SUCCESS; /* another rank failed: it reports */
    pthread_mutex_lock(&ps->lock);
    ps->turn = rank + 1;
    pthread_cond_broadcast(&ps->turn_moved);
    pthread_mutex_unlock(&ps->lock);
  }
  pm_plan_free(comm, plan);
  return r;
}

static void *pass_worker(void *arg) {
  pass *ps = arg;
  rs_plan_stage scratch = {0};
  for (;;) {
    pthread_mutex_lock(&ps->lock);
    int rank = ps->failed ? ps->run->nranks : ps->next++;
    pthread_mutex_unlock(&ps->lock);
    if (rank >= ps->run->nranks) break;
    double t0 = now_s(CLOCK_THREAD_CPUTIME_ID);
    reshard_result_t r = pass_rank(ps, rank, &scratch);
    double t = now_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    int cls = prof_class ? prof_class(rank, prof_arg) : 0;
    if (cls < 0 || cls >= PW_CLASSES) cls = 0;
    pthread_mutex_lock(&prof_lock);
    prof.cpu_s[ps->kind][cls] += t;
    prof.ranks[ps->kind][cls]++;
    if (t > prof.max_rank_s[ps->kind][cls]) prof.max_rank_s[ps->kind][cls] = t;
    pthread_mutex_unlock(&prof_lock);
    if (r) pass_fail(ps, rank, r);
  }
  rs_plan_stage_free(&scratch);
  return NULL;
}

static reshard_result_t run_pass(pass *ps) {
  double w0 = now_s(CLOCK_MONOTONIC);
  pthread_mutex_init(&ps->lock, NULL);
  pthread_cond_init(&ps->turn_moved, NULL);
  int nt = pw_threads();
  if (nt > ps->run->nranks) nt = ps->run->nranks;
  pthread_t th[PW_MAX_THREADS];
  int started = 0;
  for (int t = 1; t < nt; t++) { /* this thread is the first worker */
    if (pthread_create(&th[started], NULL, pass_worker, ps)) break;
    started++;
  }
  pass_worker(ps);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  pthread_cond_destroy(&ps->turn_moved);
  pthread_mutex_destroy(&ps->lock);
  pthread_mutex_lock(&prof_lock);
  prof.wall_s[ps->kind] += now_s(CLOCK_MONOTONIC) - w0;
  prof.passes[ps->kind]++;
  if (getenv("PW_TRACE")) fprintf(stderr, "PW pass kind %d relay %d flags %u wall %.2f\n", ps->kind, ps->run->opts.relay, (unsigned)ps->run->opts.flags, now_s(CLOCK_MONOTONIC) - w0);
  pthread_mutex_unlock(&prof_lock);
  if (ps->failed) return rs_error(ps->failed, "%s", ps->msg);
  return RESHARD_SUCCESS;
}

/* ---- the run ---- */

/* The first-replica twin of the last direct run (pw_share_first_replica),
 * until a run for it claims it. */
static int share_first;
static pw_run *stash;

void pw_share_first_replica(int on) {
  share_first = on;
  if (!on) {
    pw_run_free(stash);
    stash = NULL;
  }
}

static int same_topology(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* Whether run was made for these layouts and options. */
static int made_for(const pw_run *run, const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                    const reshard_options_t *o) {
  const reshard_options_t *r = &run->opts;
  return run->src == src && run->dst == dst && run->nranks == nranks && r->struct_size == o->struct_size &&
         r->version == o->version && r->staging_bytes == o->staging_bytes && r->chunk_bytes == o->chunk_bytes &&
         r->timeout_ms == o->timeout_ms && same_topology(r->topology, o->topology) && r->relay == o->relay &&
         r->flags == o->flags;
}

static reshard_result_t run_new(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                const reshard_options_t *opts, pw_run **out) {
  *out = NULL;
  pw_run *run = calloc(1, sizeof *run);
  if (!run) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan world: out of memory");
  run->src = src;
  run->dst = dst;
  run->nranks = nranks;
  run->opts = *opts;
  reshard_result_t r = ss_store_create(nranks, &run->store);
  if (r) {
    free(run);
    return r;
  }
  *out = run;
  return RESHARD_SUCCESS;
}

/* What the first agreement computes from the stage pass's maxima. */
static void agree_stage(pw_agreed *a, const stage_max *m) {
  a->spread = m->spread;
  memcpy(a->est, m->est, sizeof a->est);
  a->phases = rs_phases_choose(a->est, &a->wide);
  a->pace = rs_pace_choose(m->pace, a->wide);
}

/* Pass 2: the chunk agreement (the smallest of the ranks' chunks). */
static reshard_result_t chunk_pass(pw_run *run) {
  pass ps;
  memset(&ps, 0, sizeof ps);
  ps.run = run;
  ps.kind = PASS_CHUNK;
  RS_CHECK(run_pass(&ps));
  run->agreed.chunk = ps.chunk;
  return RESHARD_SUCCESS;
}

reshard_result_t pw_run_create(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                               const reshard_options_t *opts, pw_run **out) {
  *out = NULL;
  if (stash && made_for(stash, src, dst, nranks, opts)) { /* made with the direct run */
    *out = stash;
    stash = NULL;
    return RESHARD_SUCCESS;
  }
  /* the same for every rank: checked once here, not by each creation */
  reshard_result_t r = rs_layout_check_coverage(src, "source");
  if (!r) r = rs_layout_check_coverage(dst, "destination");
  pw_run *run = NULL, *twin = NULL;
  if (!r) r = run_new(src, dst, nranks, opts, &run);
  if (!r && share_first && opts->relay == 0 && !(opts->flags & RESHARD_FLAG_FIRST_REPLICA)) {
    reshard_options_t o = *opts;
    o.flags |= RESHARD_FLAG_FIRST_REPLICA;
    r = run_new(src, dst, nranks, &o, &twin);
  }
  pass ps;
  if (!r) {
    memset(&ps, 0, sizeof ps);
    ps.run = run;
    ps.kind = PASS_STAGE;
    ps.twin = twin;
    r = run_pass(&ps);
  }
  if (!r) {
    agree_stage(&run->agreed, &ps.most);
    if (twin) agree_stage(&twin->agreed, &ps.twin_most);
    r = chunk_pass(run);
  }
  if (!r && twin) r = chunk_pass(twin);
  if (r) {
    pw_run_free(run);
    pw_run_free(twin);
    return r;
  }
  if (twin) {
    pw_run_free(stash);
    stash = twin;
  }
  *out = run;
  return RESHARD_SUCCESS;
}

const pw_agreed *pw_run_agreed(const pw_run *run) { return &run->agreed; }

size_t pw_run_segments(const pw_run *run, int rank) { return ss_store_segments(run->store, rank); }

reshard_result_t pw_run_plans(pw_run *run, pw_plan_fn in_order, void *arg) {
  pass ps;
  memset(&ps, 0, sizeof ps);
  ps.run = run;
  ps.kind = PASS_PLAN;
  ps.in_order = in_order;
  ps.arg = arg;
  return run_pass(&ps);
}

void pw_run_free(pw_run *run) {
  if (!run) return;
  ss_store_free(run->store);
  free(run);
}
