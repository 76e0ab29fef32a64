/* A destination replica replaced mid-run over UCX (reshard_comm_ucx_rejoin,
 * reshard_comm_create_ucx_joining), plain processes launched by
 * tests/ucx/run_ucx.sh without mpirun:
 *
 *   run_ucx.sh LIMIT_S 4 -- ./test_ucx_rejoin replace [SEED [ROUNDS]]
 *   run_ucx.sh LIMIT_S 3 -- ./test_ucx_rejoin refuse
 *
 * replace (4 processes): ranks 0 and 1 train (the source), ranks 2 and 3
 *   infer (the destination). The layouts come from SEED: a 2-D fp32
 *   tensor sharded by rows or columns over the trainers, sharded the other
 *   way over the replicas, and a 1-D bf16 one replicated on both replicas;
 *   shapes vary with SEED. Plans are double-buffered (timeout 2000 ms).
 *   The process of slot 3 is a supervisor (a process manager's stand-in):
 *   it forks incarnation 0 of rank 3; when that one tells it (a pipe) that
 *   it is inside the execute that is to fail (at its first receive, where
 *   it then waits: its transport's receives are wrapped), the supervisor
 *   kills it with SIGKILL, reaps it and forks incarnation 1, which calls
 *   reshard_comm_create_ucx_joining as rank 3; and so on for ROUNDS
 *   (default 1) kills. Round k (0 .. ROUNDS), on all four ranks:
 *   - a new plan over the same communicator, versions 10k+1 and 10k+2:
 *     every destination element checked (and every byte around them,
 *     reshard_selftest_check) on ranks 2 and 3; a process's first version
 *     leaves its other copy untouched;
 *   - when k < ROUNDS, version 10k+3 with rank 3 killed inside it: on the
 *     staying ranks execute fails (TIMEOUT, REMOTE, BACKEND or IN_DOUBT)
 *     within two deadlines + 1 s (the data phase's and the commit's), the
 *     plan is failed or in doubt, and on rank 2 the committed version is
 *     still 10k+2 with the active copy holding it whole, element by
 *     element: no partial version. They destroy the plan and call
 *     reshard_comm_ucx_rejoin(3) (rank 2 keeps its buffers).
 *   Every newcomer prints "TIMING ... comm_create_ucx_joining called to
 *   version ... committed and checked" (its join, its plan creation and
 *   its first execute; it includes the wait for the staying ranks to give
 *   up on the old process), the staying ranks the same from their
 *   comm_ucx_rejoin call, and every rank its plan creation time. Each
 *   process prints PASS/FAIL lines and exits 0 only when all passed.
 *
 * keep (4 processes): the staying ranks KEEP their plan across the
 *   rejoin (reshard_plan_rejoin) instead of re-creating it. As replace's
 *   round 0 (versions 1, 2 checked, rank 3 killed inside version 3, the
 *   staying plan failed or in doubt with version 2 whole in its active
 *   copy) and reshard_comm_ucx_rejoin(3); then, when BAD (default 1), the
 *   newcomer first creates the plan with other layouts (SEED + 1): every
 *   rank fails with MISMATCH naming ranks 0 and 3, and on the staying
 *   ranks nothing changed (still failed or in doubt, version 2 whole in
 *   the active copy). Then the newcomer creates the plan with the right
 *   layouts while the staying ranks call reshard_plan_rejoin. Beside it,
 *   before the kill, every rank made three plans of several creation
 *   steps, each over its own buffers, and moved versions 1 and 2 with
 *   them (checked): the flat topology with relay -1 (two candidates; a
 *   4 MiB w of rank 0's replicated on the replicas, so the cost model
 *   keeps the relay one, asserted), source-side spreading (RESHARD_FLAG_SPREAD_ALWAYS, w
 *   held by rank 0 alone: a pre-plan and the main plan) and fp8 blocks
 *   (the replicas' w quantized in flight; the trainers' shards split
 *   blocks, gathered by a pre-plan); the staying ranks keep each too (with
 *   BAD, after a newcomer of other layouts fails on every rank with
 *   MISMATCH naming ranks 0 and 3 and the kept plan still holds version 2,
 *   whole), and versions 4 and 5 move with each on every rank, every
 *   element checked (the fp8 codes and scales against the self-test's
 *   reference quantizer). With the first plan too: versions 4 and 5 on
 *   every rank, every element checked (the newcomer's other
 *   copy untouched by its first). Also a plan with registered buffers
 *   (one-sided reads, not double-buffered): registered, versions 1 and 2
 *   before the kill; kept (reshard_plan_rejoin holds its registration),
 *   version 4 staged on every rank, registered again everywhere (the
 *   staying ranks keep theirs and trade keys with the newcomer alone;
 *   odd SEED: rank 2 passes other buffers, and every rank registers
 *   anew; a refused registration before it changes nothing), version 5, registered once more (anew), version 6; each
 *   checked, and what each registration traded seen at the transport. A second reshard_plan_rejoin is refused
 *   (INVALID_USAGE), and a plan made after the rejoin (one more version,
 *   checked) refuses it too. TIMING lines as in replace, from the join
 *   call to version 4 committed and checked.
 *   run_ucx.sh LIMIT_S 4 -- ./test_ucx_rejoin keep [SEED [BAD]]
 *
 * pair (5 processes): two ranks replaced at once
 *   (reshard_comm_ucx_rejoin_ranks), a plan kept across it: run_pair.
 *   run_ucx.sh LIMIT_S 5 -- ./test_ucx_rejoin pair
 *
 * refuse (3 processes): reshard_comm_ucx_rejoin refuses rank 0, a rank out
 *   of range and the calling rank itself (INVALID_ARGUMENT), and so does
 *   reshard_comm_ucx_rejoin_ranks NULL ranks, none, as many as the
 *   communicator, a rank twice, this rank or rank 0 among others; the
 *   communicator still works (a plan and an execute over it); then rank 2
 *   leaves (destroys its communicator) and ranks 0 and 1 call
 *   reshard_comm_ucx_rejoin(2) with no newcomer: TIMEOUT within the
 *   deadline + 1 s, saying nothing changed; rank 2's process comes back
 *   late as its own newcomer (reshard_comm_create_ucx_joining) and the
 *   rejoin called again meets it: a plan and an execute over all three.
 *   Then rank 0 alone calls the rejoin (ranks 1 and 2 destroy their
 *   communicators): TIMEOUT or BACKEND within the deadline + 1 s, the
 *   communicator failed for good: it refuses another rejoin
 *   (INVALID_USAGE) and a plan at once, and is destroyed in under 2 s. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "reshard.h"
#include "reshard_inproc.h"
#include "reshard_selftest.h"
#include "reshard_ucx.h"
#include "mpi/state_line.h"
#include "transport/stream.h"    /* what a registration trades, seen */
#include "transport/transport.h" /* the old rank 3's receives are wrapped */
#include "plan/plan.h"   /* composite_built reads what the plan holds */
#include "plan/quant.h"
#include "plan/spread.h"

#define SIZE 4
#define VICTIM 3
#define PLAN_TIMEOUT_MS 2000
#define REJOIN_TIMEOUT_MS 20000
#define GRACE_MS 1000

static const char *rendezvous;
static int world_rank = -1, world_size = -1, seed = 1;
/* keep mode's composite plans (below): 0 the plain layouts, 1 the source
 * tensor w held by rank 0 alone (spreading copies slices of it to rank
 * 1), 2 the replicas' w declared fp8 in 12 x 12 blocks (quantized in
 * flight; the trainers' shards split blocks, which a pre-plan gathers:
 * 12 divides no shard edge of the seeds the tests run, 2 and 5) */
static int variant;
/* composite k's variant: 3 for composite 0 (w 1024 x 1024 fp32 held by
 * rank 0 alone and replicated on both replicas: under the flat topology
 * a relay halves rank 0's egress, so the cost model keeps the relay
 * candidate) */
#define VARIANT_OF(k) ((k) == 0 ? 3 : (k))

#define SAY_FMT "rank %d"
#define SAY_ID world_rank
#include "ucx/say.h"

/* The trainers' (source, side 0) or the replicas' (destination, side 1)
 * layout of SEED. */
static reshard_layout_t *make_layout(int side) {
  const int big = variant == 3;
  const int rows = big ? 1024 : 16 + 8 * (seed % 5), cols = big ? 1024 : 24 + 4 * (seed % 7), len = 100 + 37 * (seed % 4);
  const int by_rows = seed % 2; /* the trainers shard rows, the replicas columns (or the reverse) */
  reshard_layout_t *L = NULL;
  int two = 2, one = 1, ta, tb, mesh, mesh_w, b;
  int64_t sa[2] = {rows, cols}, sb[1] = {len}, block[2] = {12, 12};
  reshard_placement_t pa = reshard_shard(side == 0 ? !by_rows : by_rows);
  reshard_placement_t pb = side == 0 ? reshard_shard(0) : reshard_replicate();
  const int alone = (variant == 1 || big) && side == 0, blocked = variant == 2 && side == 1;
  if (alone || (big && side == 1)) pa = reshard_replicate();
  int fail = reshard_layout_create(&L) ||
             (blocked ? reshard_layout_add_tensor_blocked(L, "w", RESHARD_FP8_E4M3, 2, sa, block, &ta)
                      : reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, sa, &ta)) ||
             reshard_layout_add_tensor(L, "bias", RESHARD_BF16, 1, sb, &tb) ||
             reshard_layout_add_mesh_strided(L, 1, &two, side == 0 ? 0 : 2, 1, &mesh) ||
             reshard_layout_add_mesh_strided(L, 1, alone ? &one : &two, side == 0 ? 0 : 2, 1, &mesh_w) ||
             reshard_layout_place(L, ta, mesh_w, &pa, &b) || reshard_layout_place(L, tb, mesh, &pb, &b);
  if (!fail && blocked) fail = reshard_layout_place(L, ta + 1, mesh, &pa, &b); /* w_scale_inv, split like w */
  if (fail) {
    say(0, "layout: %s", reshard_last_error());
    reshard_layout_destroy(L);
    return NULL;
  }
  return L;
}

typedef struct side {
  reshard_layout_t *src, *dst;
  reshard_selftest_t s, d[2];
  void *dp[16];
  int nd;
} side_t;

static int side_init(side_t *x) {
  memset(x, 0, sizeof *x);
  x->src = make_layout(0), x->dst = make_layout(1);
  if (!x->src || !x->dst) return -1;
  if (reshard_selftest_alloc(&x->s, x->src, world_rank, -1) || reshard_selftest_alloc(&x->d[0], x->dst, world_rank, -1) ||
      reshard_selftest_alloc(&x->d[1], x->dst, world_rank, -1) || x->d[0].nbuf > 8) {
    say(0, "selftest_alloc: %s", reshard_last_error());
    return -1;
  }
  x->nd = x->d[0].nbuf;
  for (int b = 0; b < x->nd; b++) x->dp[b] = x->d[0].ptr[b], x->dp[x->nd + b] = x->d[1].ptr[b];
  return 0;
}

static void side_free(side_t *x) {
  reshard_selftest_free(&x->s);
  reshard_selftest_free(&x->d[0]);
  reshard_selftest_free(&x->d[1]);
  reshard_layout_destroy(x->src);
  reshard_layout_destroy(x->dst);
}

static reshard_plan_t *make_plan(reshard_comm_t *comm, side_t *x, const char *what) {
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = PLAN_TIMEOUT_MS;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  double t0 = now_ms();
  reshard_result_t r = reshard_plan_create(comm, x->src, x->dst, &o, &plan);
  double ms = now_ms() - t0;
  if (r) say(0, "%s: plan_create: %s: %s", what, reshard_result_string(r), reshard_last_error());
  else printf("TIMING rank %d: %s: plan_create %.1f ms\n", world_rank, what, ms);
  return plan;
}

static reshard_result_t exec_version(const reshard_plan_t *plan, side_t *x, uint64_t v) {
  reshard_selftest_fill(&x->s, x->src, v);
  return reshard_plan_execute_version(plan, v, (void *const *)x->s.ptr, (size_t)x->s.nbuf, x->dp,
                                      (size_t)(2 * x->nd), NULL);
}

/* After a successful version v: the committed copy holds v, element by
 * element, on a replica; `other_untouched` also checks that the other
 * copy was never written. */
static void check_version(const reshard_plan_t *plan, side_t *x, uint64_t v, int other_untouched, const char *what) {
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  reshard_plan_get_status(plan, &st);
  int ok = st.committed_version == v && !st.failed && st.in_doubt_version == 0 && st.active_copy >= 0;
  int64_t wrong = 0;
  if (ok && world_rank >= 2) {
    wrong = reshard_selftest_check_from(&x->d[st.active_copy], x->dst, x->src, world_rank, v, what);
    if (other_untouched && !state_untouched(&x->d[1 - st.active_copy])) wrong++;
  }
  say(ok && wrong == 0, "%s: version %llu committed (active copy %d), %lld wrong elements or bytes", what,
      (unsigned long long)v, st.active_copy, (long long)wrong);
}

/* The old rank 3 stops inside the execute of version KILL_AT, at its first
 * receive (its transport's ops table is a wrapped copy, as in
 * tests/support/dying_send.h), tells its supervisor through a pipe, and
 * waits there to be killed: a kill during an execute, every time. */
static const rs_transport_ops *real_ops;
static int armed_fd = -1;

static void stop_here(void) {
  if (armed_fd < 0) return;
  char one = 1;
  if (write(armed_fd, &one, 1) != 1) _exit(3);
  for (;;) pause();
}

static reshard_result_t stop_irecv(reshard_comm_t *c, int peer, uint64_t tag, void *buf, size_t bytes,
                                   rs_request **req) {
  stop_here();
  return real_ops->irecv(c, peer, tag, buf, bytes, req);
}

static reshard_result_t stop_irecv_boxes(reshard_comm_t *c, int peer, uint64_t tag, const struct rs_copy *copies,
                                         uint32_t n, void *const *bases, size_t bytes, rs_request **req) {
  stop_here();
  return real_ops->irecv_boxes(c, peer, tag, copies, n, bases, bytes, req);
}

static void wrap_receives(reshard_comm_t *comm) {
  static rs_transport_ops ops;
  real_ops = comm->ops;
  ops = *real_ops;
  ops.irecv = stop_irecv;
  if (real_ops->irecv_boxes) ops.irecv_boxes = stop_irecv_boxes;
  comm->ops = &ops;
}

/* The plan is as the kill left it (right after it, and after a refused
 * rejoin): failed or in doubt (version v + 1), version v whole in the
 * active copy. */
static void still_as_killed(const reshard_plan_t *plan, side_t *x, uint64_t v, const char *what) {
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  reshard_plan_get_status(plan, &st);
  int64_t wrong = -1;
  if (st.active_copy >= 0)
    wrong = world_rank >= 2 ? reshard_selftest_check_from(&x->d[st.active_copy], x->dst, x->src, world_rank, v, what) : 0;
  say((st.failed || st.in_doubt_version == v + 1) && st.committed_version == v && wrong == 0,
      "%s: after the kill: failed %d doubt %llu committed %llu active copy %d, %lld wrong", what, st.failed,
      (unsigned long long)st.in_doubt_version, (unsigned long long)st.committed_version, st.active_copy,
      (long long)wrong);
}

/* On a staying rank, what version v, with rank 3 killed inside it, left:
 * execute failed in time, the plan is failed or in doubt, and the active
 * copy still holds v - 1 whole. */
static void killed_version(const reshard_plan_t *plan, side_t *x, uint64_t v, const char *what) {
  double t0 = now_ms();
  reshard_result_t r = exec_version(plan, x, v);
  double ms = now_ms() - t0;
  int code_ok = r == RESHARD_ERROR_TIMEOUT || r == RESHARD_ERROR_REMOTE || r == RESHARD_ERROR_BACKEND ||
                r == RESHARD_ERROR_IN_DOUBT;
  say(code_ok && ms <= 2 * PLAN_TIMEOUT_MS + GRACE_MS,
      "%s: version %llu with rank %d killed: execute returned %s after %.0f ms (limit %d ms): %s", what,
      (unsigned long long)v, VICTIM, reshard_result_string(r), ms, 2 * PLAN_TIMEOUT_MS + GRACE_MS,
      reshard_last_error());
  still_as_killed(plan, x, v - 1, what);
}

/* keep mode (below) */
static int keep_mode, keep_bad = 1;
#define NCOMP 3
typedef struct composites {
  side_t x[NCOMP];
  reshard_plan_t *plan[NCOMP];
  /* a plan with registered buffers (one-sided reads; not double
   * buffered: its executes write x.d[0]) */
  side_t rx;
  reshard_plan_t *rplan;
  reshard_comm_t *comm;
} composites;
static void composites_before(reshard_comm_t *comm, composites *c);
static void composites_free(composites *c);
static void registered_before(reshard_comm_t *comm, composites *c);

/* One round: a plan over comm (all four ranks) and versions 10k+1,
 * 10k+2, every element checked on the replicas; when `kill` (every round
 * but the last), version 10k+3 with rank 3 killed inside it: on rank 3
 * (armed, fd its pipe to the supervisor) it never returns; on the staying
 * ranks it must fail in time with version 10k+2 still whole in the active
 * copy. t_join (> 0): when this rank called comm_create_ucx_joining or
 * comm_ucx_rejoin, timed to its first version; fresh: this rank's buffers
 * were never written (the other copy stays untouched at first). */
static void run_round(reshard_comm_t *comm, side_t *x, int k, int kill, int fd, double t_join, int fresh) {
  const uint64_t base = 10 * (uint64_t)k;
  char what[64];
  snprintf(what, sizeof what, "round %d", k);
  reshard_plan_t *plan = make_plan(comm, x, what);
  /* keep mode: incarnation 0 makes the staying ranks' composite plans too
   * and moves versions 1 and 2 with them (it dies before destroying them) */
  composites comp;
  if (plan && keep_mode && kill) composites_before(comm, &comp);
  for (uint64_t v = base + 1; plan && v <= base + 2; v++) {
    reshard_result_t r = exec_version(plan, x, v);
    if (r) {
      say(0, "%s: version %llu: %s: %s", what, (unsigned long long)v, reshard_result_string(r), reshard_last_error());
      reshard_plan_destroy(plan);
      return;
    }
    check_version(plan, x, v, v == base + 1 && fresh, what);
    if (v == base + 1 && t_join > 0)
      printf("TIMING rank %d: %s: %s to version %llu committed and checked: %.1f ms\n", world_rank, what,
             world_rank == VICTIM ? "comm_create_ucx_joining called" : "comm_ucx_rejoin called", (unsigned long long)v,
             now_ms() - t_join);
  }
  if (plan && kill && world_rank == VICTIM) {
    armed_fd = fd;
    exec_version(plan, x, base + 3); /* killed in here */
    _exit(6);
  }
  if (plan && kill) killed_version(plan, x, base + 3, what);
  reshard_plan_destroy(plan);
}

/* ---- keep: the staying ranks keep their plan (reshard_plan_rejoin) ---- */

/* reshard_plan_rejoin refused with `want`, its message saying so. */
static void rejoin_refused(reshard_plan_t *plan, reshard_result_t want, const char *what) {
  reshard_result_t r = reshard_plan_rejoin(plan);
  say(r == want && reshard_last_error()[0], "%s: plan_rejoin refused: %s (want %s): %s", what,
      reshard_result_string(r), reshard_result_string(want), reshard_last_error());
}

/* On every rank once the kept plans and the newcomer's plan meet:
 * versions 4 and 5, every element checked (fresh: the newcomer, whose
 * other copy its first version leaves untouched); t_join: when this rank
 * called comm_ucx_rejoin or comm_create_ucx_joining. Then a second
 * rejoin of the plan is refused, and so is the rejoin of a plan made
 * after the rejoin (which moves one version, checked). */
static void keep_after(reshard_comm_t *comm, reshard_plan_t *plan, side_t *x, double t_join, int fresh) {
  for (uint64_t v = 4; v <= 5; v++) {
    reshard_result_t r = exec_version(plan, x, v);
    if (r) {
      say(0, "kept plan: version %llu: %s: %s", (unsigned long long)v, reshard_result_string(r), reshard_last_error());
      return;
    }
    check_version(plan, x, v, v == 4 && fresh, "kept plan");
    if (v == 4)
      printf("TIMING rank %d: keep: %s to version 4 committed and checked: %.1f ms\n", world_rank,
             world_rank == VICTIM ? "comm_create_ucx_joining called" : "comm_ucx_rejoin called", now_ms() - t_join);
  }
  rejoin_refused(plan, RESHARD_ERROR_INVALID_USAGE, world_rank == VICTIM ? "the newcomer's own plan" : "a second rejoin");
  reshard_plan_t *later = make_plan(comm, x, "a plan made after the rejoin");
  if (!later) return;
  reshard_result_t r = exec_version(later, x, 11);
  if (r) say(0, "a plan made after the rejoin: version 11: %s: %s", reshard_result_string(r), reshard_last_error());
  else check_version(later, x, 11, 0, "a plan made after the rejoin");
  rejoin_refused(later, RESHARD_ERROR_INVALID_USAGE, "a plan made after the rejoin");
  reshard_plan_destroy(later);
}

/* ---- keep mode's composite plans: made in several creation steps ----
 * 0: a topology with relay -1 (a direct and a relay plan, the cost model
 * keeps one), 1: source-side spreading (RESHARD_FLAG_SPREAD_ALWAYS; a
 * pre-plan copying rank 0's w to rank 1, and the main plan), 2: fp8
 * blocks (the main plan over the rewritten layouts, its two relay
 * candidates, and the pre-plan gathering split blocks). Each over its
 * own buffers, every rank's creation and rejoin in this order. */
static const char *const comp_name[NCOMP] = {"composite (flat topology, relay -1)", "composite (spreading)",
                                             "composite (fp8 blocks)"};

/* Composite plan k of SEED + `off`'s layouts (VARIANT_OF(k)), or NULL with
 * *r its failure. */
static reshard_plan_t *make_composite(reshard_comm_t *comm, int k, int off, reshard_result_t *r,
                                      reshard_layout_t **ls, reshard_layout_t **ld) {
  seed += off;
  variant = VARIANT_OF(k);
  reshard_layout_t *src = make_layout(0), *dst = make_layout(1);
  variant = 0;
  seed -= off;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = PLAN_TIMEOUT_MS;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER | (k == 1 ? RESHARD_FLAG_SPREAD_ALWAYS : 0);
  o.topology = k == 0 ? "flat" : "h100-8x400g";
  reshard_plan_t *plan = NULL;
  *r = src && dst ? reshard_plan_create(comm, src, dst, &o, &plan) : RESHARD_ERROR_INVALID_ARGUMENT;
  if (ls && ld) {
    *ls = src, *ld = dst;
  } else {
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
  }
  return plan;
}

/* Composite k is what its name says (the library's own plan, read
 * through its internal header): spreading kept a pre-plan (variant 1's
 * rank 0 is far over its domain's mean), fp8 blocks gather split blocks
 * first (variant 2's 12 x 12 blocks span source ranks). Otherwise the
 * rejoin would be tested on plain plans only; composite 0 (variant 3)
 * keeps the relay candidate of its two (the cost model's choice under the
 * flat topology: asserted, so that the rejoin replays the candidate that
 * won, not only the direct one). */
static void composite_built(const reshard_plan_t *plan, int k, const char *who) {
  if (k == 0)
    say(plan->relay_chosen, "%s: %s: the cost model kept the relay candidate: %s", comp_name[k], who,
        plan->relay_chosen ? "yes" : "no");
  if (k == 1)
    say(plan->spread != NULL && plan->spread->pre != NULL, "%s: %s: the plan spreads (a pre-plan): %s",
        comp_name[k], who, plan->spread ? "yes" : "no");
  if (k == 2)
    say(plan->quant != NULL && plan->quant->pre != NULL, "%s: %s: the plan gathers split blocks first: %s",
        comp_name[k], who, plan->quant && plan->quant->pre ? "yes" : "no");
}

/* Every rank before the kill: the composite plans made, versions 1 and 2
 * moved with each, every element checked. */
static void composites_before(reshard_comm_t *comm, composites *c) {
  memset(c, 0, sizeof *c);
  for (int k = 0; k < NCOMP; k++) {
    variant = VARIANT_OF(k);
    int ok = side_init(&c->x[k]) == 0;
    variant = 0;
    reshard_result_t r = RESHARD_ERROR_INVALID_ARGUMENT;
    if (ok) c->plan[k] = make_composite(comm, k, 0, &r, NULL, NULL);
    if (!c->plan[k]) {
      say(0, "%s: plan_create: %s: %s", comp_name[k], reshard_result_string(r), reshard_last_error());
      continue;
    }
    composite_built(c->plan[k], k, "before the kill");
    for (uint64_t v = 1; v <= 2; v++) {
      r = exec_version(c->plan[k], &c->x[k], v);
      if (r) say(0, "%s: version %llu: %s: %s", comp_name[k], (unsigned long long)v, reshard_result_string(r),
                 reshard_last_error());
      else check_version(c->plan[k], &c->x[k], v, v == 1, comp_name[k]);
    }
  }
  registered_before(comm, c);
}

/* ---- keep mode's registered plan (reshard_plan_register_buffers: one-
 * sided reads over UCX): registered and moving versions 1 and 2 before
 * the kill; a successful reshard_plan_rejoin holds the registration (the
 * replaced rank's keys are gone), so version 4 moves staged; every rank,
 * the newcomer included, registers again and version 5 moves registered;
 * then every rank registers once more (no rejoin) and version 6 moves.
 * Each version's destination checked element by element. What each
 * registration traded is seen at the transport (its rma_share wrapped for
 * the call): after the rejoin, with every staying rank passing its
 * buffers again (even SEED), each staying rank keeps the held set and
 * trades keys with rank 3 alone (the sources with it, each once), the
 * newcomer with all its partners; with rank 2 passing its other
 * destination copy (odd SEED), every rank registers anew and trades with
 * all its partners, as every rank does in the registration without a
 * rejoin. */
static const char *const reg_name = "registered plan (one-sided reads)";

static struct {
  int kept;                      /* rma_share got a set to keep */
  int traded, skipped, traded_other; /* partners; traded_other: not rank 3 */
} seen;
static reshard_result_t (*real_share)(reshard_comm_t *, uint64_t, void *const *, const uint64_t *, size_t,
                                      struct rs_share *, size_t, int64_t, void *, void **);

static reshard_result_t seen_share(reshard_comm_t *c, uint64_t tag, void *const *bufs, const uint64_t *bytes,
                                   size_t nbufs, struct rs_share *sh, size_t n, int64_t deadline, void *keep,
                                   void **set) {
  seen.kept = keep != NULL;
  seen.traded = seen.skipped = seen.traded_other = 0;
  for (size_t i = 0; i < n; i++) {
    if (sh[i].skip) seen.skipped++;
    else seen.traded++, seen.traded_other += sh[i].peer != VICTIM;
  }
  return real_share(c, tag, bufs, bytes, nbufs, sh, n, deadline, keep, set);
}

static reshard_plan_t *make_registered(reshard_comm_t *comm, side_t *x, reshard_result_t *r) {
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = PLAN_TIMEOUT_MS;
  reshard_plan_t *plan = NULL;
  *r = reshard_plan_create(comm, x->src, x->dst, &o, &plan);
  return plan;
}

/* Version v into destination copy `copy` (the registered one). */
static void registered_version(composites *c, uint64_t v, int fresh, int copy) {
  side_t *x = &c->rx;
  reshard_selftest_fill(&x->s, x->src, v);
  reshard_result_t r = reshard_plan_execute_version(c->rplan, v, (void *const *)x->s.ptr, (size_t)x->s.nbuf,
                                                    (void *const *)x->d[copy].ptr, (size_t)x->nd, NULL);
  int64_t wrong =
      r || world_rank < 2 ? 0 : reshard_selftest_check_from(&x->d[copy], x->dst, x->src, world_rank, v, reg_name);
  if (!r && fresh && !state_untouched(&x->d[1])) wrong++; /* (never passed to an execute) */
  say(r == RESHARD_SUCCESS && wrong == 0, "%s: version %llu: %s, %lld wrong elements or bytes %s", reg_name,
      (unsigned long long)v, reshard_result_string(r), (long long)wrong, r ? reshard_last_error() : "");
}

/* Registers destination copy `copy`, what it trades seen (the comm's
 * ops wrapped for the call only: comm_ucx_rejoin wants UCX's own). */
static void registered_register(composites *c, const char *when, int copy) {
  side_t *x = &c->rx;
  static rs_transport_ops ops;
  const rs_transport_ops *real = c->comm->ops;
  ops = *real;
  real_share = real->rma_share;
  ops.rma_share = seen_share;
  memset(&seen, 0, sizeof seen);
  c->comm->ops = &ops;
  const double t0 = now_ms();
  reshard_result_t r = reshard_plan_register_buffers(c->rplan, (void *const *)x->s.ptr, (size_t)x->s.nbuf,
                                                     (void *const *)x->d[copy].ptr, (size_t)x->nd);
  printf("TIMING rank %d: register_buffers %s: %.2f ms (kept %d)\n", world_rank, when, now_ms() - t0, seen.kept);
  c->comm->ops = real;
  say(r == RESHARD_SUCCESS, "%s: register_buffers %s: %s %s", reg_name, when, reshard_result_string(r),
      r ? reshard_last_error() : "");
}

/* A refused registration (rank 1 passes one source buffer too many:
 * INVALID_ARGUMENT there, REMOTE elsewhere) changes nothing: a held
 * registration stays held for the next call to keep. */
static void registered_refused(composites *c, int copy) {
  side_t *x = &c->rx;
  const size_t extra = world_rank == 1;
  reshard_result_t r = reshard_plan_register_buffers(c->rplan, (void *const *)x->s.ptr, (size_t)x->s.nbuf + extra,
                                                     (void *const *)x->d[copy].ptr, (size_t)x->nd);
  const reshard_result_t want = extra ? RESHARD_ERROR_INVALID_ARGUMENT : RESHARD_ERROR_REMOTE;
  say(r == want, "%s: register_buffers with rank 1 passing a buffer too many: %s (want %s) %s", reg_name,
      reshard_result_string(r), reshard_result_string(want), reshard_last_error());
}

/* A registration traded with every partner, keeping nothing. */
static void traded_all(const char *when) {
  say(!seen.kept && !seen.skipped && seen.traded > 0, "%s: register_buffers %s: kept %d, traded with %d partners, "
      "skipped %d (want all traded)", reg_name, when, seen.kept, seen.traded, seen.skipped);
}

/* Every rank before the kill. */
static void registered_before(reshard_comm_t *comm, composites *c) {
  reshard_result_t r = RESHARD_ERROR_INVALID_ARGUMENT;
  if (side_init(&c->rx) == 0) c->rplan = make_registered(comm, &c->rx, &r);
  if (!c->rplan) {
    say(0, "%s: plan_create: %s: %s", reg_name, reshard_result_string(r), reshard_last_error());
    return;
  }
  c->comm = comm;
  registered_register(c, "before the kill", 0);
  traded_all("before the kill");
  for (uint64_t v = 1; v <= 2; v++) registered_version(c, v, 0, 0);
}

/* The newcomer's side after the rejoin, and a staying rank's. */
static void registered_newcomer(reshard_comm_t *comm, composites *c) {
  reshard_result_t r = RESHARD_ERROR_INVALID_ARGUMENT;
  if (side_init(&c->rx) == 0) c->rplan = make_registered(comm, &c->rx, &r);
  c->comm = comm;
  say(c->rplan != NULL, "%s: the newcomer's plan_create: %s %s", reg_name, reshard_result_string(r),
      c->rplan ? "" : reshard_last_error());
}

static void registered_rejoin(composites *c) {
  if (!c->rplan) return;
  reshard_result_t r = reshard_plan_rejoin(c->rplan);
  say(r == RESHARD_SUCCESS, "%s: plan_rejoin: %s %s", reg_name, reshard_result_string(r), r ? reshard_last_error() : "");
  if (r) reshard_plan_destroy(c->rplan), c->rplan = NULL;
}

/* Every rank once the plans met: version 4 staged (the rejoin held the
 * staying ranks' registration; the newcomer has none), registered again
 * on every rank (kept, or anew with odd SEED: rank 2 then passes its
 * other copy), version 5; registered once more, version 6. */
static void registered_after(composites *c, int fresh) {
  if (!c->rplan) return;
  const int other = (seed & 1) && world_rank == 2, copy = other ? 1 : 0;
  registered_version(c, 4, fresh, 0);
  registered_refused(c, copy);
  registered_register(c, other ? "again after the rejoin, another copy" : "again after the rejoin", copy);
  if ((seed & 1) || fresh) {
    traded_all("again after the rejoin");
  } else {
    const int want = world_rank < 2; /* a source trades with rank 3 */
    say(seen.kept && !seen.traded_other && seen.traded == want && seen.skipped > 0,
        "%s: register_buffers again after the rejoin: kept %d, traded with %d partners (%d not rank 3), skipped %d "
        "(want kept, traded with rank 3 alone%s)", reg_name, seen.kept, seen.traded, seen.traded_other, seen.skipped,
        want ? "" : ": none");
  }
  registered_version(c, 5, 0, copy);
  registered_register(c, "once more (no rejoin)", copy);
  traded_all("once more (no rejoin)");
  registered_version(c, 6, 0, copy);
}

/* The newcomer's side of composite k after the rejoin: with BAD, first
 * other layouts (SEED + 1), MISMATCH naming ranks 0 and 3 on every rank;
 * then the right ones. */
static void composite_newcomer(reshard_comm_t *comm, composites *c, int k) {
  reshard_result_t r;
  if (keep_bad) {
    reshard_plan_t *wrong = make_composite(comm, k, 1, &r, NULL, NULL);
    say(r == RESHARD_ERROR_MISMATCH && !wrong && strstr(reshard_last_error(), "ranks 0 and 3"),
        "%s: the newcomer's plan_create with other layouts: %s: %s", comp_name[k], reshard_result_string(r),
        reshard_last_error());
    reshard_plan_destroy(wrong);
  }
  variant = VARIANT_OF(k);
  int ok = side_init(&c->x[k]) == 0;
  variant = 0;
  double t0 = now_ms();
  c->plan[k] = ok ? make_composite(comm, k, 0, &r, NULL, NULL) : NULL;
  say(c->plan[k] != NULL, "%s: the newcomer's plan_create: %s after %.1f ms %s", comp_name[k],
      c->plan[k] ? "success" : reshard_result_string(r), now_ms() - t0, c->plan[k] ? "" : reshard_last_error());
  if (c->plan[k]) composite_built(c->plan[k], k, "the newcomer's");
}

/* A staying rank's side of composite k after the rejoin: with BAD, the
 * rejoin against a newcomer of other layouts fails with MISMATCH naming
 * ranks 0 and 3, and the plan still holds version 2, whole; then the
 * rejoin succeeds. */
static void composite_rejoin(composites *c, int k) {
  if (!c->plan[k]) return;
  reshard_result_t r;
  if (keep_bad) {
    r = reshard_plan_rejoin(c->plan[k]);
    say(r == RESHARD_ERROR_MISMATCH && strstr(reshard_last_error(), "ranks 0 and 3"),
        "%s: plan_rejoin with a newcomer of other layouts: %s: %s", comp_name[k], reshard_result_string(r),
        reshard_last_error());
    check_version(c->plan[k], &c->x[k], 2, 0, "after the refused rejoin");
  }
  double t0 = now_ms();
  r = reshard_plan_rejoin(c->plan[k]);
  say(r == RESHARD_SUCCESS, "%s: plan_rejoin: %s after %.1f ms %s", comp_name[k], reshard_result_string(r),
      now_ms() - t0, r ? reshard_last_error() : "");
  if (r) {
    reshard_plan_destroy(c->plan[k]);
    c->plan[k] = NULL;
  }
}

/* Every rank once the composites met: versions 4 and 5 with each, every
 * element checked (fresh: the newcomer's other copy untouched by its
 * first), and a second rejoin refused. */
static void composites_after(composites *c, int fresh) {
  for (int k = 0; k < NCOMP; k++) {
    for (uint64_t v = 4; c->plan[k] && v <= 5; v++) {
      reshard_result_t r = exec_version(c->plan[k], &c->x[k], v);
      if (r) say(0, "%s: version %llu: %s: %s", comp_name[k], (unsigned long long)v, reshard_result_string(r),
                 reshard_last_error());
      else check_version(c->plan[k], &c->x[k], v, v == 4 && fresh, comp_name[k]);
    }
    if (c->plan[k]) rejoin_refused(c->plan[k], RESHARD_ERROR_INVALID_USAGE, comp_name[k]);
  }
}

static void composites_free(composites *c) {
  for (int k = 0; k < NCOMP; k++) {
    reshard_plan_destroy(c->plan[k]);
    side_free(&c->x[k]);
  }
  reshard_plan_destroy(c->rplan);
  side_free(&c->rx);
}

/* The newcomer with other layouts (SEED + 1): its creation fails with
 * MISMATCH naming ranks 0 and 3. */
static void keep_newcomer_wrong(reshard_comm_t *comm) {
  seed++;
  reshard_layout_t *src = make_layout(0), *dst = make_layout(1);
  seed--;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = PLAN_TIMEOUT_MS;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = src && dst ? reshard_plan_create(comm, src, dst, &o, &plan) : RESHARD_ERROR_INVALID_ARGUMENT;
  say(r == RESHARD_ERROR_MISMATCH && !plan && strstr(reshard_last_error(), "ranks 0 and 3"),
      "the newcomer's plan_create with other layouts: %s: %s", reshard_result_string(r), reshard_last_error());
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* The newcomer (incarnation 1 of rank 3) in keep mode. */
static void keep_newcomer(reshard_comm_t *comm, side_t *x, double t_join) {
  if (keep_bad) keep_newcomer_wrong(comm);
  reshard_plan_t *plan = make_plan(comm, x, "keep: the newcomer's plan");
  composites comp;
  memset(&comp, 0, sizeof comp);
  for (int k = 0; plan && k < NCOMP; k++) composite_newcomer(comm, &comp, k);
  if (plan) registered_newcomer(comm, &comp);
  if (plan) keep_after(comm, plan, x, t_join, 1);
  if (plan) composites_after(&comp, 1);
  if (plan) registered_after(&comp, 1);
  composites_free(&comp);
  reshard_plan_destroy(plan);
}

/* A staying rank in keep mode: round 0's plan, kept across the rejoin. */
static int run_keep(void) {
  reshard_comm_t *comm = NULL;
  reshard_result_t r = reshard_comm_create_ucx(rendezvous, world_rank, SIZE, REJOIN_TIMEOUT_MS, &comm);
  if (r) {
    say(0, "comm_create_ucx: %s: %s", reshard_result_string(r), reshard_last_error());
    return 1;
  }
  side_t x;
  reshard_plan_t *plan = side_init(&x) == 0 ? make_plan(comm, &x, "keep") : NULL;
  composites comp;
  memset(&comp, 0, sizeof comp);
  if (plan) composites_before(comm, &comp);
  for (uint64_t v = 1; plan && !bad && v <= 2; v++) {
    r = exec_version(plan, &x, v);
    if (r) say(0, "keep: version %llu: %s: %s", (unsigned long long)v, reshard_result_string(r), reshard_last_error());
    else check_version(plan, &x, v, v == 1, "keep");
  }
  if (plan && !bad) killed_version(plan, &x, 3, "keep");
  double t_join = now_ms();
  if (plan && !bad) {
    r = reshard_comm_ucx_rejoin(comm, VICTIM, REJOIN_TIMEOUT_MS);
    say(r == RESHARD_SUCCESS, "keep: comm_ucx_rejoin(%d): %s after %.0f ms %s", VICTIM, reshard_result_string(r),
        now_ms() - t_join, r ? reshard_last_error() : "");
  }
  if (plan && !bad && keep_bad) {
    r = reshard_plan_rejoin(plan);
    say(r == RESHARD_ERROR_MISMATCH && strstr(reshard_last_error(), "ranks 0 and 3"),
        "keep: plan_rejoin with a newcomer of other layouts: %s: %s", reshard_result_string(r), reshard_last_error());
    still_as_killed(plan, &x, 2, "keep: after the refused rejoin");
  }
  if (plan && !bad) {
    double t0 = now_ms();
    r = reshard_plan_rejoin(plan);
    double ms = now_ms() - t0;
    say(r == RESHARD_SUCCESS, "keep: plan_rejoin: %s after %.1f ms %s", reshard_result_string(r), ms,
        r ? reshard_last_error() : "");
    printf("TIMING rank %d: keep: plan_rejoin %.1f ms\n", world_rank, ms);
    for (int k = 0; !r && k < NCOMP; k++) composite_rejoin(&comp, k);
    if (!r) registered_rejoin(&comp);
    if (!r) keep_after(comm, plan, &x, t_join, 0);
    if (!r) composites_after(&comp, 0);
    if (!r) registered_after(&comp, 0);
  }
  composites_free(&comp);
  reshard_plan_destroy(plan);
  side_free(&x);
  reshard_comm_destroy(comm);
  return bad != 0;
}

/* Incarnation k of slot 3 (0: the original; then newcomers): joins, and
 * plays rounds k (killed in it when k < rounds) and on. */
static int incarnation(int k, int rounds, int fd) {
  side_t x;
  double t0 = now_ms();
  reshard_comm_t *comm = NULL;
  reshard_result_t r = k == 0 ? reshard_comm_create_ucx(rendezvous, VICTIM, SIZE, REJOIN_TIMEOUT_MS, &comm)
                              : reshard_comm_create_ucx_joining(rendezvous, VICTIM, SIZE, REJOIN_TIMEOUT_MS, &comm);
  say(r == RESHARD_SUCCESS, "incarnation %d of rank %d: %s: %s after %.0f ms %s", k, VICTIM,
      k ? "comm_create_ucx_joining" : "comm_create_ucx", reshard_result_string(r), now_ms() - t0,
      r ? reshard_last_error() : "");
  if (r) return 1;
  if (k > 0) printf("TIMING rank %d: round %d: comm_create_ucx_joining %.1f ms\n", world_rank, k, now_ms() - t0);
  if (k < rounds) wrap_receives(comm);
  if (side_init(&x) == 0 && keep_mode && k > 0) keep_newcomer(comm, &x, t0);
  else if (!bad) run_round(comm, &x, k, k < rounds, k < rounds ? fd : -2, k > 0 ? t0 : 0, 1);
  side_free(&x);
  reshard_comm_destroy(comm);
  return bad != 0;
}

/* Slot 3: a supervisor (a process manager's stand-in) forks incarnation 0,
 * kills it with SIGKILL when it says it is inside the execute that is to
 * fail, reaps it, forks incarnation 1 (a newcomer), ... The last
 * incarnation is not killed; its exit status is the supervisor's. */
static int supervise(int rounds) {
  for (int k = 0;; k++) {
    int fds[2];
    if (pipe(fds)) return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      close(fds[0]);
      _exit(incarnation(k, rounds, fds[1]));
    }
    close(fds[1]);
    int status = 0;
    if (k == rounds) {
      close(fds[0]);
      waitpid(pid, &status, 0);
      return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    char one;
    ssize_t n = read(fds[0], &one, 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    say(n == 1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
        "supervisor: incarnation %d of rank %d (pid %d) killed with SIGKILL inside an execute", k, VICTIM, (int)pid);
    if (bad) return 1;
  }
}

static int run_replace(int rounds) {
  if (world_size != SIZE) {
    say(0, "replace needs %d processes", SIZE);
    return 1;
  }
  if (world_rank == VICTIM) return supervise(rounds);
  reshard_comm_t *comm = NULL;
  reshard_result_t r = reshard_comm_create_ucx(rendezvous, world_rank, SIZE, REJOIN_TIMEOUT_MS, &comm);
  if (r) {
    say(0, "comm_create_ucx: %s: %s", reshard_result_string(r), reshard_last_error());
    return 1;
  }
  side_t x; /* (the staying replica keeps its buffers through the rounds) */
  double t_join = 0;
  int ok = side_init(&x) == 0;
  for (int k = 0; ok && k <= rounds && !bad; k++) {
    run_round(comm, &x, k, k < rounds, -1, t_join, k == 0);
    if (k == rounds || bad) break;
    t_join = now_ms();
    r = reshard_comm_ucx_rejoin(comm, VICTIM, REJOIN_TIMEOUT_MS);
    say(r == RESHARD_SUCCESS, "round %d: comm_ucx_rejoin(%d): %s after %.0f ms %s", k, VICTIM,
        reshard_result_string(r), now_ms() - t_join, r ? reshard_last_error() : "");
  }
  side_free(&x);
  reshard_comm_destroy(comm);
  return bad != 0;
}

/* A plan and one version over comm: it still works. */
/* L[0]: a 1-D int32 tensor of `elems` sharded over every rank; L[1]: the
 * same replicated on every rank. */
static void shard_to_all(reshard_layout_t *L[2], int64_t elems) {
  int n = world_size, t, m, b;
  for (int k = 0; k < 2; k++) {
    reshard_placement_t p = k == 0 ? reshard_shard(0) : reshard_replicate();
    L[k] = NULL;
    if (reshard_layout_create(&L[k]) || reshard_layout_add_tensor(L[k], "g", RESHARD_INT32, 1, &elems, &t) ||
        reshard_layout_add_mesh_strided(L[k], 1, &n, 0, 1, &m) || reshard_layout_place(L[k], t, m, &p, &b))
      say(0, "layout: %s", reshard_last_error());
  }
}

static void still_works(reshard_comm_t *comm, const char *what) {
  reshard_layout_t *L[2];
  shard_to_all(L, 64);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 10000;
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s, d;
  memset(&s, 0, sizeof s);
  memset(&d, 0, sizeof d);
  reshard_result_t r = reshard_plan_create(comm, L[0], L[1], &o, &plan);
  if (!r && !(r = reshard_selftest_alloc(&s, L[0], world_rank, 7)) && !(r = reshard_selftest_alloc(&d, L[1], world_rank, -1)))
    r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
  int64_t wrong = r ? -1 : reshard_selftest_check(&d, L[1], world_rank, 7, what);
  say(r == RESHARD_SUCCESS && wrong == 0, "%s: a plan and an execute: %s, %lld wrong %s", what,
      reshard_result_string(r), (long long)wrong, r ? reshard_last_error() : "");
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_layout_destroy(L[0]);
  reshard_layout_destroy(L[1]);
}

/* reshard_plan_rejoin on a plan of an in-process communicator (one rank):
 * INVALID_ARGUMENT, the plan still works. */
static void rejoin_not_ucx(void) {
  reshard_inproc_world_t *w = NULL;
  reshard_comm_t *c = NULL;
  reshard_layout_t *L = NULL;
  reshard_plan_t *plan = NULL;
  int one = 1, t, m, b;
  int64_t shape[1] = {16};
  reshard_placement_t p = reshard_replicate();
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  reshard_result_t r = reshard_inproc_world_create(1, &w);
  if (!r) r = reshard_comm_create_inproc(w, 0, &c);
  if (!r) r = reshard_layout_create(&L);
  if (!r) r = reshard_layout_add_tensor(L, "g", RESHARD_INT32, 1, shape, &t);
  if (!r) r = reshard_layout_add_mesh_strided(L, 1, &one, 0, 1, &m);
  if (!r) r = reshard_layout_place(L, t, m, &p, &b);
  if (!r) r = reshard_plan_create(c, L, L, &o, &plan);
  if (r) say(0, "an in-process plan: %s: %s", reshard_result_string(r), reshard_last_error());
  else rejoin_refused(plan, RESHARD_ERROR_INVALID_ARGUMENT, "a plan of an in-process communicator");
  reshard_plan_destroy(plan);
  reshard_layout_destroy(L);
  reshard_comm_destroy(c);
  reshard_inproc_world_destroy(w);
}

static int run_refuse(void) {
  rejoin_not_ucx();
  reshard_comm_t *comm = NULL;
  reshard_result_t r = reshard_comm_create_ucx(rendezvous, world_rank, world_size, REJOIN_TIMEOUT_MS, &comm);
  if (r) {
    say(0, "comm_create_ucx: %s: %s", reshard_result_string(r), reshard_last_error());
    return 1;
  }
  const int asks[4] = {0, world_size, -1, world_rank};
  const char *why[4] = {"rank 0", "a rank out of range", "a negative rank", "this rank itself"};
  for (int i = 0; i < 4; i++) {
    r = reshard_comm_ucx_rejoin(comm, asks[i], 1000);
    say(r == RESHARD_ERROR_INVALID_ARGUMENT && reshard_last_error()[0], "rejoin of %s (%d) refused: %s: %s", why[i],
        asks[i], reshard_result_string(r), reshard_last_error());
  }
  /* several ranks at once (reshard_comm_ucx_rejoin_ranks): each refusal
   * names what is wrong, nothing changes */
  const int other = world_rank == 1 ? 2 : 1; /* neither this rank nor 0 */
  const int twice[2] = {other, other}, with_self[2] = {other, world_rank}, with_zero[2] = {other, 0};
  const struct {
    const int *ranks;
    int n;
    const char *why, *says;
  } sets[] = {{NULL, 1, "NULL ranks", "(NULL)"},
              {twice, 0, "no ranks", "0 ranks"},
              {twice, world_size, "as many ranks as the communicator", "ranks to replace"},
              {twice, 2, "a rank named twice", "named twice"},
              {with_self, 2, "this rank among them", world_rank == 0 ? "rank 0 holds" : "this rank is one"},
              {with_zero, 2, "rank 0 among them", "rank 0 holds"}};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
    r = reshard_comm_ucx_rejoin_ranks(comm, sets[i].ranks, sets[i].n, 1000);
    say(r == RESHARD_ERROR_INVALID_ARGUMENT && strstr(reshard_last_error(), sets[i].says),
        "rejoin_ranks with %s refused: %s: %s", sets[i].why, reshard_result_string(r), reshard_last_error());
  }
  r = reshard_comm_create_ucx_joining(rendezvous, 0, world_size, 1000, &(reshard_comm_t *){NULL});
  say(r == RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx_joining as rank 0 refused: %s: %s",
      reshard_result_string(r), reshard_last_error());
  still_works(comm, "after the refusals");
  const int last = world_size - 1, timeout_ms = 1500;
  if (world_rank == last) {
    /* leaves, and comes back as its own newcomer after the staying ranks'
     * first rejoin timed out */
    reshard_comm_destroy(comm);
    comm = NULL;
    usleep((useconds_t)(timeout_ms + 2 * GRACE_MS) * 1000);
    double t0 = now_ms();
    r = reshard_comm_create_ucx_joining(rendezvous, last, world_size, REJOIN_TIMEOUT_MS, &comm);
    say(r == RESHARD_SUCCESS, "the late newcomer joined: %s after %.0f ms %s", reshard_result_string(r),
        now_ms() - t0, r ? reshard_last_error() : "");
    if (r) return 1;
  } else {
    double t0 = now_ms();
    r = reshard_comm_ucx_rejoin(comm, last, timeout_ms);
    double ms = now_ms() - t0;
    say(r == RESHARD_ERROR_TIMEOUT && ms <= timeout_ms + GRACE_MS && strstr(reshard_last_error(), "nothing changed"),
        "rejoin with no newcomer yet: %s after %.0f ms (deadline %d ms + %d ms), nothing changed: %s",
        reshard_result_string(r), ms, timeout_ms, GRACE_MS, reshard_last_error());
    t0 = now_ms();
    r = reshard_comm_ucx_rejoin(comm, last, REJOIN_TIMEOUT_MS);
    say(r == RESHARD_SUCCESS, "the rejoin called again meets the late newcomer: %s after %.0f ms %s",
        reshard_result_string(r), now_ms() - t0, r ? reshard_last_error() : "");
  }
  still_works(comm, "after a retried rejoin");
  if (world_rank != 0) { /* rank 0 alone calls the next rejoin: it must fail for good */
    reshard_comm_destroy(comm);
    return bad != 0;
  }
  double t0 = now_ms();
  r = reshard_comm_ucx_rejoin(comm, last, timeout_ms);
  double ms = now_ms() - t0;
  say((r == RESHARD_ERROR_TIMEOUT || r == RESHARD_ERROR_BACKEND) && ms <= timeout_ms + GRACE_MS &&
      strstr(reshard_last_error(), "the communicator is failed now"),
      "rejoin with a staying rank that never calls: %s after %.0f ms (deadline %d ms + %d ms): %s",
      reshard_result_string(r), ms, timeout_ms, GRACE_MS, reshard_last_error());
  r = reshard_comm_ucx_rejoin(comm, last, timeout_ms);
  say(r == RESHARD_ERROR_INVALID_USAGE, "the failed communicator refuses another rejoin: %s: %s",
      reshard_result_string(r), reshard_last_error());
  reshard_layout_t *L = NULL;
  reshard_plan_t *plan = NULL;
  int n = world_size, t, m, b;
  int64_t shape[1] = {8};
  reshard_placement_t p = reshard_replicate();
  reshard_layout_create(&L);
  reshard_layout_add_tensor(L, "g", RESHARD_INT32, 1, shape, &t);
  reshard_layout_add_mesh_strided(L, 1, &n, 0, 1, &m);
  reshard_layout_place(L, t, m, &p, &b);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 1000;
  t0 = now_ms();
  r = reshard_plan_create(comm, L, L, &o, &plan);
  ms = now_ms() - t0;
  say(r != RESHARD_SUCCESS && plan == NULL && ms < 500, "the failed communicator refuses a plan at once: %s after %.0f ms: %s",
      reshard_result_string(r), ms, reshard_last_error());
  reshard_layout_destroy(L);
  t0 = now_ms();
  reshard_comm_destroy(comm);
  ms = now_ms() - t0;
  say(ms < 2000, "comm_destroy after the failed rejoin: %.0f ms", ms);
  return bad != 0;
}

/* pair (5 processes): ranks 3 and 4 leave together (a replica of two
 * ranks) and come back as newcomers; the staying ranks keep a plan made
 * before (a 1-D tensor sharded over all five -> replicated on all five)
 * with reshard_plan_rejoin while the newcomers create it, and call
 * reshard_comm_ucx_rejoin_ranks({4, 3}) (unsorted); the kept plan's next
 * execute and a new plan's are checked on every rank. */
static int run_pair(void) {
  reshard_comm_t *comm = NULL;
  reshard_result_t r = reshard_comm_create_ucx(rendezvous, world_rank, world_size, REJOIN_TIMEOUT_MS, &comm);
  if (r) {
    say(0, "comm_create_ucx: %s: %s", reshard_result_string(r), reshard_last_error());
    return 1;
  }
  reshard_layout_t *L[2];
  shard_to_all(L, 40);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 10000;
  reshard_plan_t *plan = NULL;
  r = reshard_plan_create(comm, L[0], L[1], &o, &plan);
  say(r == RESHARD_SUCCESS, "pair: plan_create: %s %s", reshard_result_string(r), r ? reshard_last_error() : "");
  const int leaving = world_rank >= 3;
  if (leaving) { /* the old processes of ranks 3 and 4 go; new ones take their slots */
    reshard_plan_destroy(plan);
    reshard_comm_destroy(comm);
    plan = NULL;
    comm = NULL;
    double t0 = now_ms();
    r = reshard_comm_create_ucx_joining(rendezvous, world_rank, world_size, REJOIN_TIMEOUT_MS, &comm);
    say(r == RESHARD_SUCCESS, "pair: rank %d's newcomer joined: %s after %.0f ms %s", world_rank,
        reshard_result_string(r), now_ms() - t0, r ? reshard_last_error() : "");
    if (r) return 1;
    r = reshard_plan_create(comm, L[0], L[1], &o, &plan);
    say(r == RESHARD_SUCCESS, "pair: the newcomer's plan_create: %s %s", reshard_result_string(r),
        r ? reshard_last_error() : "");
  } else {
    const int both[2] = {4, 3};
    double t0 = now_ms();
    r = reshard_comm_ucx_rejoin_ranks(comm, both, 2, REJOIN_TIMEOUT_MS);
    say(r == RESHARD_SUCCESS, "pair: comm_ucx_rejoin_ranks({4, 3}): %s after %.0f ms %s", reshard_result_string(r),
        now_ms() - t0, r ? reshard_last_error() : "");
    if (!r) r = reshard_plan_rejoin(plan);
    say(r == RESHARD_SUCCESS, "pair: plan_rejoin: %s %s", reshard_result_string(r), r ? reshard_last_error() : "");
  }
  reshard_selftest_t s, d;
  memset(&s, 0, sizeof s);
  memset(&d, 0, sizeof d);
  if (!r && !(r = reshard_selftest_alloc(&s, L[0], world_rank, 9)) && !(r = reshard_selftest_alloc(&d, L[1], world_rank, -1)))
    r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
  int64_t wrong = r ? -1 : reshard_selftest_check(&d, L[1], world_rank, 9, "pair: the kept plan");
  say(r == RESHARD_SUCCESS && wrong == 0, "pair: the kept plan's execute after the rejoin: %s, %lld wrong %s",
      reshard_result_string(r), (long long)wrong, r ? reshard_last_error() : "");
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(L[0]);
  reshard_layout_destroy(L[1]);
  if (comm) still_works(comm, "pair: a new plan after the rejoin");
  reshard_comm_destroy(comm);
  return bad != 0;
}

int main(int argc, char **argv) {
  int i = 1;
  for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
    if (!strcmp(argv[i], "--rendezvous")) rendezvous = argv[i + 1];
    else if (!strcmp(argv[i], "--rank")) world_rank = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--size")) world_size = atoi(argv[i + 1]);
  }
  if (!rendezvous || world_rank < 0 || world_rank >= world_size || i >= argc) {
    fprintf(stderr, "usage: test_ucx_rejoin --rendezvous H:P --rank R --size N replace [SEED [ROUNDS]] | keep [SEED [BAD]] | refuse\n");
    return 2;
  }
  if (i + 1 < argc) seed = atoi(argv[i + 1]);
  if (!strcmp(argv[i], "replace")) return run_replace(i + 2 < argc ? atoi(argv[i + 2]) : 1);
  if (!strcmp(argv[i], "refuse")) return run_refuse();
  if (!strcmp(argv[i], "pair")) return run_pair();
  if (!strcmp(argv[i], "keep")) {
    keep_mode = 1;
    if (i + 2 < argc) keep_bad = atoi(argv[i + 2]);
    if (world_size != SIZE) {
      say(0, "keep needs %d processes", SIZE);
      return 1;
    }
    return world_rank == VICTIM ? supervise(1) : run_keep();
  }
  fprintf(stderr, "unknown mode %s\n", argv[i]);
  return 2;
}
