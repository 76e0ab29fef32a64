/* UCX integration test: real processes over the UCX transport
 * (reshard_ucx.h), launched without MPI by tests/ucx/run_ucx.sh:
 *
 *   run_ucx.sh LIMIT_S NPROCS -- ./test_ucx_reshard MODE [ARGS]
 *
 * which runs NPROCS processes
 *
 *   test_ucx_reshard --rendezvous 127.0.0.1:PORT --rank R --size N MODE [ARGS]
 *
 * (a later --rank / --size overrides an earlier one). Modes:
 *
 *   random [SEEDS]   byte-exact transfers (exit 0 only if all are):
 *     - SEEDS (default 30) random layout pairs of the property-test
 *       generator (tests/support/random_layout.h) whose world fits the
 *       process count (the processes above a pair's world hold nothing),
 *       every fourth one converting dtypes, every third one with a 4 KiB
 *       staging budget; 2 steps each;
 *     - the grid transfer (below) with a 4 KiB staging budget: many
 *       rounds; 3 steps;
 *     - the grid transfer with RESHARD_FLAG_VERIFY, rows -> columns
 *       (4 KiB staging) and columns -> rows (default staging); 2 steps;
 *     - the grid transfer double-buffered, versions 1, 2, 3: after each,
 *       the status (committed version, active copy, nothing in doubt) and
 *       both copies (the active one holds the version, the other the
 *       version before or, at first, nothing);
 *     - a large grid ([512n, 512n] fp32, default staging): 1 MiB
 *       messages, UCX's rendezvous protocol; 2 steps.
 *     Every destination element and every byte around them is checked
 *     (reshard_selftest_check_from). Each case's counts are gathered to
 *     every process over reshard itself (a plan whose destination
 *     replicates a [size, 2] int64 tensor that the processes shard:
 *     an allgather), so every process counts the same passes and
 *     failures; rank 0 prints "FAILED <case>" (and a random pair's layout
 *     calls) and the summary "N passed, N failed".
 *
 *   registered [SEEDS]   the cases of random with every plan's buffers
 *     registered first (reshard_plan_register_buffers: one-sided reads,
 *     no staging) but the double-buffered one (UNSUPPORTED there); a
 *     pair that converts dtypes may be refused (UNSUPPORTED naming the
 *     cast on the ranks reading one, REMOTE on the others) and then runs
 *     staged; every second pair with relays on (options.relay 1: a
 *     relay forward reads the forwarder's destination). Same checks. Then a registered grid plan given other
 *     destination buffers on rank 0: INVALID_ARGUMENT there, REMOTE on
 *     the others, nothing written (every registered destination still
 *     holds the step before, the other buffers untouched).
 *     Both modes (4 or more processes): two composites, a plan that
 *     quantizes to fp8 blocks whose blocks the trainers' shards split (a
 *     gather pre-plan) and one that spreads (RESHARD_FLAG_SPREAD_ALWAYS,
 *     rank 0 alone holding w: a copy pre-plan); registered, each stage
 *     registers its scratch beside the caller's buffers.
 *     Both modes (3 or more processes): a 4 MiB fan-out from rank 0 to
 *     the others with relays (options.relay 1, 256 KiB staging: several
 *     rounds), each destination asserted to forward.
 *
 *   stop   (3 or more processes) a process is SIGSTOPped: the pids are
 *     gathered (the allgather plan), the grid plan is created (timeout_ms
 *     2000, 4 KiB staging), the last rank raise(SIGSTOP)s itself; the
 *     others execute and must return TIMEOUT or REMOTE within the deadline
 *     + 1 s. Rank 0 then SIGCONTs it (every 100 ms from a thread, until
 *     the next plan exists, in case the first one came before the stop);
 *     the resumed rank executes and must fail the same way within the
 *     deadline + 1 s (its peers left that call). Then, on every rank: the
 *     failed plan refuses another execute (INVALID_USAGE), and a new plan
 *     on the same communicator (its creation, timeout_ms 15000, is the
 *     barrier that waits for the resumed rank) moves every byte right:
 *     the failed call's leftovers must not disturb it. Each rank prints
 *     "PASS rank R: ..." or "FAIL rank R: ..." for the faulty call and for
 *     the next one, and its STATE line (tests/mpi/state_line.h); judged by
 *     tests/mpi/run_fault_test.sh (8 PASS lines, 4 STATE lines at 4
 *     processes).
 *
 *   exit   (3 or more processes) rank 1 _exit(0)s in the middle of the grid
 *     transfer (its sends are counted through a wrapped copy of the
 *     transport's ops table, as in tests/mpi/test_mpi_faults.c): the
 *     survivors' execute must return TIMEOUT, REMOTE or BACKEND within the
 *     deadline + 1 s (a PASS or FAIL line each), and then destroy the plan
 *     and the communicator with a dead peer (each within 2 s) and exit 0:
 *     no hang, no crash, no abort from UCX.
 *
 *   exit-registered   exit with the grid plan's buffers registered first
 *     (one-sided reads; the victim's sends counted from the execute on, it
 *     dies once its data is "ready", at its first "done" token): the same
 *     checks, plan_destroy with reads to a dead peer in under 2 s.
 *
 *   rendezvous-timeout   run with --size S but only S - 1 processes
 *     started (ranks 0 .. S-2): reshard_comm_create_ucx (timeout_ms 1500)
 *     must return TIMEOUT, with a message and no communicator, within the
 *     deadline + 1 s on every started rank. Then the started processes
 *     make a communicator of S - 1 on the same rendezvous (the failed one
 *     left nothing behind: rank 0 listens on the port again) and gather
 *     their pids over it. One PASS or FAIL line per rank for each.
 *
 *   recreate [ROUNDS]   ROUNDS (default 3) communicators one after the
 *     other on the same rendezvous, each made (timeout_ms 5000), used (a
 *     gather of pids over it) and destroyed: the port is free again after
 *     each, as reshard_ucx.h says, even with the connections of the round
 *     before in TIME_WAIT. One PASS or FAIL line per rank and round.
 *
 * Every wait has a deadline; run_ucx.sh kills every process after
 * LIMIT_S, so a hang fails. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reshard.h"
#include "reshard_selftest.h"
#include "reshard_ucx.h"
#include "mpi/state_line.h"
#include "support/dying_send.h" /* exit: the victim's sends are counted */
#include "support/random_layout.h"

#define TILE 64          /* rows (columns) per rank of the grid transfer */
#define LARGE_TILE 512   /* the same, large */
#define CASE_TIMEOUT_MS 10000
#define FAULT_TIMEOUT_MS 2000
#define GRACE_MS 1000    /* allowed beyond a deadline */
#define CREATE_TIMEOUT_MS 20000

static const char *rendezvous;
static int world_rank = -1, world_size = -1;
static int passed, failed; /* cases, the same on every rank */
/* registered mode: every case registers its buffers first */
static int registered;
/* options.relay of the next case (random pairs alternate in registered
 * mode: relay forwards read the forwarder's destination buffers) */
static int relay_opt = -1;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static reshard_plan_status_t status_of(const reshard_plan_t *plan) {
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  reshard_plan_get_status(plan, &st);
  return st;
}

/* The grid transfer (tests/mpi/fault_world.h's, without MPI): one tensor
 * "w" of [tile*n, tile*n] fp32 over all n ranks, sharded along dim (rows on
 * the source, columns on the destination: every rank a partner of every
 * other, tile*tile*4 bytes each way). NULL on failure (printed). */
static reshard_layout_t *grid_layout(int dim, int tile) {
  reshard_layout_t *L = NULL;
  int n = world_size, tid, mid, bid;
  int64_t shape[2] = {(int64_t)tile * n, (int64_t)tile * n};
  reshard_placement_t pl = reshard_shard(dim);
  if (reshard_layout_create(&L) || reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, shape, &tid) ||
      reshard_layout_add_mesh_strided(L, 1, &n, 0, 1, &mid) || reshard_layout_place(L, tid, mid, &pl, &bid)) {
    fprintf(stderr, "rank %d: grid layout: %s\n", world_rank, reshard_last_error());
    reshard_layout_destroy(L);
    return NULL;
  }
  return L;
}

/* A fan-out: "w" [tile, tile] fp32 held whole by rank 0 (the source)
 * and replicated on ranks 1 .. n-1 (dst). With options.relay 1 rank 0
 * sends each destination a part and they forward the rest among
 * themselves. NULL on failure (printed). */
static reshard_layout_t *fanout_layout(int dst, int tile) {
  reshard_layout_t *L = NULL;
  int n = dst ? world_size - 1 : 1, tid, mid, bid;
  int64_t shape[2] = {tile, tile};
  reshard_placement_t pl = reshard_replicate();
  if (reshard_layout_create(&L) || reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, shape, &tid) ||
      reshard_layout_add_mesh_strided(L, 1, &n, dst ? 1 : 0, 1, &mid) || reshard_layout_place(L, tid, mid, &pl, &bid)) {
    fprintf(stderr, "rank %d: fan-out layout: %s\n", world_rank, reshard_last_error());
    reshard_layout_destroy(L);
    return NULL;
  }
  return L;
}

/* Composites: "w" [rows, cols] fp32 on ranks 0 and 1 (side 0; kind 's':
 * rank 0 alone holds it whole, so that spreading copies part of it to
 * rank 1 first) and, on ranks 2 .. n-1 (side 1), sharded by rows (kind
 * 'q': declared fp8 e4m3 in 16 x 16 blocks with its scales placed like it:
 * quantized in flight, the trainers' row shards of 40 rows splitting
 * blocks, which a pre-plan gathers). NULL on failure (printed). */
static reshard_layout_t *composite_layout(char kind, int side) {
  reshard_layout_t *L = NULL;
  int n = side ? world_size - 2 : (kind == 's' ? 1 : 2), tid, mid, bid;
  int64_t shape[2] = {80, 64}, block[2] = {16, 16};
  reshard_placement_t pl = side == 0 && kind == 's' ? reshard_replicate() : reshard_shard(0);
  const int fp8 = kind == 'q' && side == 1;
  if (reshard_layout_create(&L) ||
      (fp8 ? reshard_layout_add_tensor_blocked(L, "w", RESHARD_FP8_E4M3, 2, shape, block, &tid)
           : reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, shape, &tid)) ||
      reshard_layout_add_mesh_strided(L, 1, &n, side ? 2 : 0, 1, &mid) || reshard_layout_place(L, tid, mid, &pl, &bid) ||
      (fp8 && reshard_layout_place(L, tid + 1, mid, &pl, &bid))) {
    fprintf(stderr, "rank %d: composite layout: %s\n", world_rank, reshard_last_error());
    reshard_layout_destroy(L);
    return NULL;
  }
  return L;
}

/* Whether rank r > 0 of the fan-out sends (forwards) anything. */
static int forwards_something(const reshard_plan_t *plan) {
  reshard_peer_stats_t ps[64];
  size_t n = 0, sent = 0;
  if (reshard_plan_get_peer_stats(plan, ps, 64, &n)) return 0;
  for (size_t i = 0; i < n && i < 64; i++) sent += ps[i].send_bytes;
  return sent > 0;
}

/* ----------------------------------------------------------- allgather */

/* Two int64 per rank gathered to every rank through reshard: the source
 * shards a [size, 2] int64 tensor by rows, the destination replicates it
 * on every rank. One plan, executed once per gather. */
typedef struct gather {
  reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
} gather_t;

static void gather_destroy(gather_t *g) {
  reshard_plan_destroy(g->plan);
  reshard_layout_destroy(g->src);
  reshard_layout_destroy(g->dst);
  memset(g, 0, sizeof *g);
}

static int gather_create(reshard_comm_t *comm, int timeout_ms, gather_t *g) {
  memset(g, 0, sizeof *g);
  int n = world_size;
  int64_t shape[2] = {n, 2};
  reshard_layout_t **side[2] = {&g->src, &g->dst};
  for (int k = 0; k < 2; k++) {
    int t, m, b;
    reshard_placement_t p = k == 0 ? reshard_shard(0) : reshard_replicate();
    if (reshard_layout_create(side[k]) || reshard_layout_add_tensor(*side[k], "gather", RESHARD_INT64, 2, shape, &t) ||
        reshard_layout_add_mesh_strided(*side[k], 1, &n, 0, 1, &m) || reshard_layout_place(*side[k], t, m, &p, &b)) {
      fprintf(stderr, "rank %d: gather layout: %s\n", world_rank, reshard_last_error());
      gather_destroy(g);
      return -1;
    }
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = timeout_ms;
  reshard_result_t r = reshard_plan_create(comm, g->src, g->dst, &o, &g->plan);
  if (r) {
    printf("FAIL rank %d: the gather plan: plan_create: %s: %s\n", world_rank, reshard_result_string(r),
           reshard_last_error());
    fflush(stdout);
    gather_destroy(g);
    return -1;
  }
  return 0;
}

/* all[2 * r + k] = rank r's mine[k]. */
static int gather(gather_t *g, const int64_t mine[2], int64_t *all) {
  int64_t in[2] = {mine[0], mine[1]};
  void *s[1] = {in}, *d[1] = {all};
  reshard_result_t r = reshard_plan_execute(g->plan, s, 1, d, 1, NULL);
  if (r) {
    printf("FAIL rank %d: gather: execute: %s: %s\n", world_rank, reshard_result_string(r), reshard_last_error());
    fflush(stdout);
    return -1;
  }
  return 0;
}

/* Sums each rank's (bad, err) of a case; counts the case on every rank
 * (rank 0 prints). Returns 1 when the case failed anywhere, -1 when the
 * gather itself failed (the run cannot go on). */
static int judge(gather_t *g, const char *name, int64_t bad, int64_t err) {
  int64_t mine[2] = {bad, err}, all[2 * 64], sum[2] = {0, 0};
  if (gather(g, mine, all)) return -1;
  for (int r = 0; r < world_size; r++) sum[0] += all[2 * r], sum[1] += all[2 * r + 1];
  if (sum[0] || sum[1]) {
    failed++;
    if (world_rank == 0) {
      printf("FAILED %s: %lld ranks with a failed call, %lld wrong elements or bytes over all ranks\n", name,
             (long long)sum[1], (long long)sum[0]);
      fflush(stdout);
    }
    return 1;
  }
  passed++;
  return 0;
}

/* -------------------------------------------------------------- random */

/* Plans src -> dst, executes `steps` steps, checks every destination byte
 * of this rank; returns judge's verdict. */
static int run_case_casts(reshard_comm_t *comm, gather_t *g, const reshard_layout_t *src,
                          const reshard_layout_t *dst, size_t staging, uint32_t flags, int steps, int min_rounds,
                          const char *name, int casts) {
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  if (staging) opts.staging_bytes = staging;
  opts.timeout_ms = CASE_TIMEOUT_MS;
  opts.flags = flags;
  opts.relay = relay_opt;
  reshard_plan_t *plan = NULL;
  int64_t bad = 0, err = 0;
  reshard_selftest_t s, d;
  memset(&s, 0, sizeof s);
  memset(&d, 0, sizeof d);
  reshard_result_t r = reshard_plan_create(comm, src, dst, &opts, &plan);
  if (r) {
    fprintf(stderr, "[%s] rank %d: plan_create: %s: %s\n", name, world_rank, reshard_result_string(r),
            reshard_last_error());
    err = 1;
  }
  if (plan && min_rounds > 0) {
    reshard_plan_stats_t st;
    if (reshard_plan_get_stats(plan, &st) || st.num_chunks < min_rounds) {
      fprintf(stderr, "[%s] rank %d: %d rounds, the case needs %d or more\n", name, world_rank, st.num_chunks,
              min_rounds);
      err = 1;
    }
  }
  if (reshard_selftest_alloc(&s, src, world_rank, -1) || reshard_selftest_alloc(&d, dst, world_rank, -1)) {
    fprintf(stderr, "[%s] rank %d: selftest_alloc: %s\n", name, world_rank, reshard_last_error());
    err = 1;
  }
  if (plan && strstr(name, "fan-out") && world_rank > 0 && !forwards_something(plan)) {
    fprintf(stderr, "[%s] rank %d: relay 1, yet this destination forwards nothing\n", name, world_rank);
    err = 1;
  }
  if (registered && plan && !err) {
    /* One-sided reads (reshard_plan_register_buffers on UCX): every case
     * but a cast's must register; a cast's is refused UNSUPPORTED on the
     * ranks that read one, and then runs staged (its partners' result is
     * REMOTE: the registration is all or nothing). */
    r = reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                      (size_t)d.nbuf);
    int cast = r == RESHARD_ERROR_UNSUPPORTED && strstr(reshard_last_error(), "converts dtypes");
    if (r && !(casts && (cast || r == RESHARD_ERROR_REMOTE))) {
      fprintf(stderr, "[%s] rank %d: register_buffers: %s: %s\n", name, world_rank, reshard_result_string(r),
              reshard_last_error());
      err = 1;
    }
  }
  for (int step = 0; step < steps && plan && !err; step++) {
    reshard_selftest_fill(&s, src, (uint64_t)step);
    double t0 = now_ms();
    r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
    if (r) {
      fprintf(stderr, "[%s] rank %d step %d: execute: %s after %.0f ms: %s\n", name, world_rank, step,
              reshard_result_string(r), now_ms() - t0, reshard_last_error());
      err = 1;
      break;
    }
    bad += reshard_selftest_check_from(&d, dst, src, world_rank, (uint64_t)step, name);
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  return judge(g, name, bad, err);
}

static int run_case(reshard_comm_t *comm, gather_t *g, const reshard_layout_t *src, const reshard_layout_t *dst,
                    size_t staging, uint32_t flags, int steps, int min_rounds, const char *name) {
  return run_case_casts(comm, g, src, dst, staging, flags, steps, min_rounds, name, 0);
}

static int random_cases(reshard_comm_t *comm, gather_t *g, int count) {
  int done = 0;
  for (uint64_t seed = 0; done < count && seed < (uint64_t)count * 20; seed++) {
    rl_pair p;
    uint64_t s = seed * 7919 + 17;
    rl_mode mode = seed % 4 == 3 ? RL_CASTS : RL_ANY; /* casts through the staging */
    if (rl_pair_make(s, mode, &p)) {
      if (world_rank == 0) printf("FAILED generator for seed %llu\n", (unsigned long long)s);
      failed++;
      continue;
    }
    if (p.nranks > world_size) {
      rl_pair_free(&p);
      continue;
    }
    char name[96];
    snprintf(name, sizeof name, "random seed %llu (%s, %d ranks of %d)", (unsigned long long)s,
             mode == RL_CASTS ? "casts" : "any", p.nranks, world_size);
    relay_opt = registered && seed % 2 ? 1 : -1;
    if (relay_opt == 1) strncat(name, ", relay 1", sizeof name - strlen(name) - 1);
    int v = run_case_casts(comm, g, p.src, p.dst, seed % 3 == 0 ? 4096 : 0, 0, 2, 0, name, mode == RL_CASTS);
    relay_opt = -1;
    if (v > 0 && world_rank == 0) rl_pair_print(&p, stdout);
    rl_pair_free(&p);
    if (v < 0) return -1;
    done++;
  }
  if (world_rank == 0) printf("random: %d pairs fit %d processes\n", done, world_size);
  return 0;
}

/* The grid double-buffered: versions 1, 2, 3 into alternating copies. */
static int double_buffer_case(reshard_comm_t *comm, gather_t *g, const reshard_layout_t *src,
                              const reshard_layout_t *dst) {
  const char *name = "grid double-buffered, versions 1..3";
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = 4096;
  opts.timeout_ms = CASE_TIMEOUT_MS;
  opts.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  int64_t bad = 0, err = 0;
  reshard_selftest_t s, d[2];
  memset(&s, 0, sizeof s);
  memset(d, 0, sizeof d);
  reshard_result_t r = reshard_plan_create(comm, src, dst, &opts, &plan);
  if (r) {
    fprintf(stderr, "[%s] rank %d: plan_create: %s: %s\n", name, world_rank, reshard_result_string(r),
            reshard_last_error());
    err = 1;
  }
  if (reshard_selftest_alloc(&s, src, world_rank, -1) || reshard_selftest_alloc(&d[0], dst, world_rank, -1) ||
      reshard_selftest_alloc(&d[1], dst, world_rank, -1)) {
    fprintf(stderr, "[%s] rank %d: selftest_alloc: %s\n", name, world_rank, reshard_last_error());
    err = 1;
  }
  int nb = d[0].nbuf;
  void *dp[64];
  if (!err && 2 * nb > 64) err = 1;
  for (int b = 0; !err && b < nb; b++) dp[b] = d[0].ptr[b], dp[nb + b] = d[1].ptr[b];
  for (uint64_t v = 1; v <= 3 && plan && !err; v++) {
    reshard_selftest_fill(&s, src, v);
    r = reshard_plan_execute_version(plan, v, (void *const *)s.ptr, (size_t)s.nbuf, dp, (size_t)(2 * nb), NULL);
    if (r) {
      fprintf(stderr, "[%s] rank %d version %llu: execute: %s: %s\n", name, world_rank, (unsigned long long)v,
              reshard_result_string(r), reshard_last_error());
      err = 1;
      break;
    }
    reshard_plan_status_t st = status_of(plan);
    int want_copy = (int)((v - 1) % 2);
    if (st.committed_version != v || st.active_copy != want_copy || st.in_doubt_version != 0 || st.failed ||
        st.executes_completed != v) {
      fprintf(stderr,
              "[%s] rank %d after version %llu: committed %llu active %d doubt %llu failed %d completed %llu "
              "(expected committed %llu active %d)\n",
              name, world_rank, (unsigned long long)v, (unsigned long long)st.committed_version, st.active_copy,
              (unsigned long long)st.in_doubt_version, st.failed, (unsigned long long)st.executes_completed,
              (unsigned long long)v, want_copy);
      err = 1;
    }
    bad += reshard_selftest_check(&d[want_copy], dst, world_rank, v, name);
    if (v == 1) {
      if (!state_untouched(&d[1])) {
        fprintf(stderr, "[%s] rank %d: copy 1 written by version 1\n", name, world_rank);
        bad++;
      }
    } else {
      bad += reshard_selftest_check(&d[1 - want_copy], dst, world_rank, v - 1, name); /* the previous version */
    }
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d[0]);
  reshard_selftest_free(&d[1]);
  reshard_plan_destroy(plan);
  return judge(g, name, bad, err);
}

/* registered mode: a registered plan refuses other buffers. Rank 0
 * passes a fresh destination buffer in place of its registered one: it
 * gets INVALID_ARGUMENT and its partners REMOTE (the refusal takes its
 * place in the agreement), and nothing lands anywhere: every rank's
 * registered destination still holds the step before. */
static int refusal_case(reshard_comm_t *comm, gather_t *g, const reshard_layout_t *src, const reshard_layout_t *dst) {
  const char *name = "grid registered, other buffers refused";
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.timeout_ms = CASE_TIMEOUT_MS;
  reshard_plan_t *plan = NULL;
  int64_t bad = 0, err = 0;
  reshard_selftest_t s, d, other;
  memset(&s, 0, sizeof s);
  memset(&d, 0, sizeof d);
  memset(&other, 0, sizeof other);
  reshard_result_t r = reshard_plan_create(comm, src, dst, &opts, &plan);
  if (r || reshard_selftest_alloc(&s, src, world_rank, -1) || reshard_selftest_alloc(&d, dst, world_rank, -1) ||
      reshard_selftest_alloc(&other, dst, world_rank, -1) ||
      reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                    (size_t)d.nbuf)) {
    fprintf(stderr, "[%s] rank %d: set-up: %s\n", name, world_rank, reshard_last_error());
    err = 1;
  }
  if (!err) {
    reshard_selftest_fill(&s, src, 1);
    r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
    if (r) fprintf(stderr, "[%s] rank %d: execute: %s\n", name, world_rank, reshard_last_error()), err = 1;
    bad += reshard_selftest_check_from(&d, dst, src, world_rank, 1, name);
  }
  if (!err) {
    reshard_selftest_fill(&s, src, 2);
    r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf,
                             (void *const *)(world_rank == 0 ? other.ptr : d.ptr), (size_t)d.nbuf, NULL);
    reshard_result_t want = world_rank == 0 ? RESHARD_ERROR_INVALID_ARGUMENT : RESHARD_ERROR_REMOTE;
    if (r != want || (world_rank == 0 && !strstr(reshard_last_error(), "not the registered"))) {
      fprintf(stderr, "[%s] rank %d: execute with other buffers: %s (expected %s): %s\n", name, world_rank,
              reshard_result_string(r), reshard_result_string(want), reshard_last_error());
      err = 1;
    }
    bad += reshard_selftest_check_from(&d, dst, src, world_rank, 1, name); /* still step 1 */
    if (!state_untouched(&other)) {
      fprintf(stderr, "[%s] rank %d: the refused buffers were written\n", name, world_rank);
      bad++;
    }
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_selftest_free(&other);
  reshard_plan_destroy(plan);
  return judge(g, name, bad, err);
}

static int run_random(reshard_comm_t *comm, int seeds) {
  gather_t g;
  if (gather_create(comm, 30000, &g)) return 1;
  double t0 = now_ms();
  int rc = random_cases(comm, &g, seeds);
  double t_random = now_ms() - t0;
  reshard_layout_t *rows = grid_layout(0, TILE), *cols = grid_layout(1, TILE);
  if (rc == 0 && (!rows || !cols)) rc = -1;
  if (rc == 0) rc = run_case(comm, &g, rows, cols, 4096, 0, 3, 3, "grid rows -> columns, 4 KiB staging") < 0 ? -1 : 0;
  if (rc == 0)
    rc = run_case(comm, &g, rows, cols, 4096, RESHARD_FLAG_VERIFY, 2, 3, "grid rows -> columns, verify") < 0 ? -1 : 0;
  if (rc == 0) rc = run_case(comm, &g, cols, rows, 0, RESHARD_FLAG_VERIFY, 2, 0, "grid columns -> rows, verify") < 0 ? -1 : 0;
  if (rc == 0 && !registered) rc = double_buffer_case(comm, &g, rows, cols) < 0 ? -1 : 0;
  if (rc == 0 && registered) rc = refusal_case(comm, &g, rows, cols) < 0 ? -1 : 0;
  /* 4 MiB: each destination's part (over up to 7) above the smallest
   * relay part (256 KiB) */
  reshard_layout_t *fs = fanout_layout(0, 2 * LARGE_TILE), *fd = fanout_layout(1, 2 * LARGE_TILE);
  if (rc == 0 && (!fs || !fd)) rc = -1;
  if (rc == 0 && world_size >= 3) {
    /* relay forwards: with registered buffers they are read from the
     * forwarder's destination, once it landed (the round before) */
    relay_opt = 1;
    rc = run_case(comm, &g, fs, fd, 256 << 10, 0, 2, 0, "fan-out 4 MiB, relay 1, 256 KiB staging") < 0 ? -1 : 0;
    relay_opt = -1;
  }
  reshard_layout_destroy(fs);
  reshard_layout_destroy(fd);
  /* composites (4 or more processes): a plan that quantizes (its gather
   * pre-plan) and one that spreads (RESHARD_FLAG_SPREAD_ALWAYS; its copy
   * pre-plan), each with its scratch buffers registered beside the
   * caller's in registered mode */
  for (int k = 0; k < 2 && rc == 0 && world_size >= 4; k++) {
    const char kind = k ? 's' : 'q';
    reshard_layout_t *cs = composite_layout(kind, 0), *cd = composite_layout(kind, 1);
    if (!cs || !cd) rc = -1;
    else
      rc = run_case(comm, &g, cs, cd, 0, k ? RESHARD_FLAG_SPREAD_ALWAYS : 0, 2, 0,
                    k ? "composite: spreading (rank 0 alone holds w)" : "composite: fp8 blocks, split blocks gathered") < 0
               ? -1 : 0;
    reshard_layout_destroy(cs);
    reshard_layout_destroy(cd);
  }
  reshard_layout_destroy(rows);
  reshard_layout_destroy(cols);
  /* 1 MiB messages (the default staging budget does not cut them): UCX's
   * rendezvous protocol rather than its eager one. */
  rows = grid_layout(0, LARGE_TILE), cols = grid_layout(1, LARGE_TILE);
  if (rc == 0 && (!rows || !cols)) rc = -1;
  if (rc == 0) rc = run_case(comm, &g, rows, cols, 0, 0, 2, 0, "large grid rows -> columns, 1 MiB messages") < 0 ? -1 : 0;
  reshard_layout_destroy(rows);
  reshard_layout_destroy(cols);
  gather_destroy(&g);
  if (world_rank == 0 || rc) {
    printf("test_ucx_reshard %s (%d processes, rank %d): %d passed, %d failed%s (random pairs %.0f ms, all %.0f ms)\n",
           registered ? "registered" : "random", world_size, world_rank, passed, failed, rc ? ", the result gather failed" : "", t_random, now_ms() - t0);
    fflush(stdout);
  }
  return rc != 0 || failed != 0;
}

/* ---------------------------------------------------------------- stop */

static reshard_plan_t *make_grid_plan(reshard_comm_t *comm, const reshard_layout_t *src, const reshard_layout_t *dst,
                                      int timeout_ms) {
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = 4096;
  opts.timeout_ms = timeout_ms;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, src, dst, &opts, &plan);
  if (r) {
    printf("FAIL rank %d: plan_create: %s: %s\n", world_rank, reshard_result_string(r), reshard_last_error());
    fflush(stdout);
  }
  return plan;
}

static reshard_result_t timed_execute(const reshard_plan_t *plan, reshard_selftest_t *s, reshard_selftest_t *d,
                                      double *ms) {
  double t0 = now_ms();
  reshard_result_t r =
      reshard_plan_execute(plan, (void *const *)s->ptr, (size_t)s->nbuf, (void *const *)d->ptr, (size_t)d->nbuf, NULL);
  *ms = now_ms() - t0;
  return r;
}

/* A failed execute must fail as a fault (TIMEOUT or REMOTE), say why, and
 * return within the deadline + grace. Prints this rank's line. */
static int report_failed_execute(const char *what, reshard_result_t r, double ms) {
  int code_ok = r == RESHARD_ERROR_TIMEOUT || r == RESHARD_ERROR_REMOTE;
  int ok = code_ok && ms <= FAULT_TIMEOUT_MS + GRACE_MS && reshard_last_error()[0] != '\0';
  printf("%s rank %d: %s: execute returned %s after %.0f ms (deadline %d ms + %d ms): %s\n", ok ? "PASS" : "FAIL",
         world_rank, what, reshard_result_string(r), ms, FAULT_TIMEOUT_MS, GRACE_MS, reshard_last_error());
  fflush(stdout);
  return !ok;
}

/* Rank 0 wakes the stopped rank: SIGCONT every 100 ms until told to stop
 * (a SIGCONT that came before the SIGSTOP would be lost). */
static volatile int waking;
static pid_t wake_pid;

static void *waker(void *arg) {
  (void)arg;
  while (__atomic_load_n(&waking, __ATOMIC_ACQUIRE)) {
    kill(wake_pid, SIGCONT);
    sleep_ms(100);
  }
  return NULL;
}

static int run_stop(reshard_comm_t *comm) {
  if (world_size < 3 || world_size > 64) {
    printf("FAIL rank %d: stop needs 3 to 64 processes, not %d\n", world_rank, world_size);
    return 1;
  }
  const int victim = world_size - 1;
  gather_t g;
  int64_t mine[2] = {(int64_t)getpid(), 0}, pids[2 * 64];
  if (gather_create(comm, CASE_TIMEOUT_MS, &g)) return 1;
  int rc = gather(&g, mine, pids);
  gather_destroy(&g);
  if (rc) return 1;

  reshard_layout_t *src = grid_layout(0, TILE), *dst = grid_layout(1, TILE);
  if (!src || !dst) return 1;
  reshard_plan_t *plan = make_grid_plan(comm, src, dst, FAULT_TIMEOUT_MS);
  if (!plan) return 1;
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&s, src, world_rank, 0) || reshard_selftest_alloc(&d, dst, world_rank, -1)) {
    printf("FAIL rank %d: selftest_alloc: %s\n", world_rank, reshard_last_error());
    return 1;
  }
  int bad = 0;
  double ms = 0;
  pthread_t waker_thread;
  int waker_started = 0;
  if (world_rank == victim) {
    raise(SIGSTOP); /* until rank 0 sends SIGCONT */
    reshard_result_t r = timed_execute(plan, &s, &d, &ms);
    /* Its peers left this call: whatever of their messages got through,
     * the rest never comes. */
    bad += report_failed_execute("resumed after SIGSTOP", r, ms);
  } else {
    reshard_result_t r = timed_execute(plan, &s, &d, &ms);
    bad += report_failed_execute("peer stopped", r, ms);
    if (world_rank == 0) {
      wake_pid = (pid_t)pids[2 * victim];
      __atomic_store_n(&waking, 1, __ATOMIC_RELEASE);
      if (kill(wake_pid, SIGCONT) != 0) {
        printf("FAIL rank 0: kill(%d, SIGCONT): %s\n", (int)wake_pid, strerror(errno));
        bad++;
      }
      if (pthread_create(&waker_thread, NULL, waker, NULL) == 0) waker_started = 1;
    }
  }
  /* The failed plan refuses a later call. */
  reshard_selftest_fill(&s, src, 1);
  reshard_result_t r = timed_execute(plan, &s, &d, &ms);
  if (r != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "failed")) {
    printf("FAIL rank %d: the failed plan executed again: %s: %s\n", world_rank, reshard_result_string(r),
           reshard_last_error());
    bad++;
  }
  reshard_plan_destroy(plan);
  /* A new plan on the same communicator: its creation waits for the
   * resumed rank (it comes about one deadline after the others). */
  double t0 = now_ms();
  plan = make_grid_plan(comm, src, dst, 15000);
  double create_ms = now_ms() - t0;
  if (waker_started) {
    __atomic_store_n(&waking, 0, __ATOMIC_RELEASE);
    pthread_join(waker_thread, NULL);
  }
  int64_t wrong = -1;
  r = RESHARD_ERROR_INTERNAL;
  if (plan) {
    r = timed_execute(plan, &s, &d, &ms);
    if (r) printf("rank %d: next execute: %s\n", world_rank, reshard_last_error());
    wrong = r == RESHARD_SUCCESS ? reshard_selftest_check(&d, dst, world_rank, 1, "after stop") : -1;
  }
  int ok = plan && r == RESHARD_SUCCESS && wrong == 0;
  printf("%s rank %d: next plan (created in %.0f ms) and execute after the fault: %s in %.0f ms, %lld wrong bytes\n",
         ok ? "PASS" : "FAIL", world_rank, create_ms, reshard_result_string(r), ms, (long long)wrong);
  fflush(stdout);
  bad += !ok;
  if (plan) state_print("stop", world_rank, plan, &d, dst);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  return bad != 0;
}

/* ---------------------------------------------------------------- exit */

/* Rank 1 dies (_exit(0)) on its (size+1)-th send of the grid transfer:
 * after its first round to every peer and the first message of its
 * second. The survivors' execute must fail (TIMEOUT, REMOTE or BACKEND)
 * within the deadline + 1 s, and they must then destroy the plan and
 * the communicator (main: within 2 s) and exit 0. */
static int run_exit(reshard_comm_t *comm) {
  if (world_size < 3 || world_size > 64) {
    printf("FAIL rank %d: exit needs 3 to 64 processes, not %d\n", world_rank, world_size);
    return 1;
  }
  const int victim = 1;
  if (!registered) dying_send_install(comm, world_rank == victim ? world_size + 1 : -1);

  reshard_layout_t *src = grid_layout(0, TILE), *dst = grid_layout(1, TILE);
  if (!src || !dst) return 1;
  reshard_plan_t *plan = make_grid_plan(comm, src, dst, FAULT_TIMEOUT_MS);
  if (!plan) return 1;
  reshard_plan_stats_t st;
  reshard_plan_get_stats(plan, &st);
  if (st.num_chunks < 3) {
    printf("FAIL rank %d: %d rounds, the test needs several\n", world_rank, st.num_chunks);
    return 1;
  }
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&s, src, world_rank, 0) || reshard_selftest_alloc(&d, dst, world_rank, -1)) {
    printf("FAIL rank %d: selftest_alloc: %s\n", world_rank, reshard_last_error());
    return 1;
  }
  if (registered) {
    /* exit-registered: the buffers registered (one-sided reads), then the
     * victim's sends counted from the execute on: its agreement headers
     * and its "ready" tokens leave (n - 1 each), and it dies at its first
     * "done" token, while its partners may still be reading from it */
    reshard_result_t rr = reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf,
                                                        (void *const *)d.ptr, (size_t)d.nbuf);
    if (rr) {
      printf("FAIL rank %d: register_buffers: %s\n", world_rank, reshard_last_error());
      return 1;
    }
    dying_send_install(comm, world_rank == victim ? 2 * world_size - 1 : -1);
  }
  double ms = 0;
  int bad = 0;
  reshard_result_t r = timed_execute(plan, &s, &d, &ms); /* the victim never returns */
  int code_ok = r == RESHARD_ERROR_TIMEOUT || r == RESHARD_ERROR_REMOTE || r == RESHARD_ERROR_BACKEND;
  int ok = code_ok && ms <= FAULT_TIMEOUT_MS + GRACE_MS && reshard_last_error()[0] != '\0';
  printf("%s rank %d: peer exited mid-transfer: execute returned %s after %.0f ms (deadline %d ms + %d ms): %s\n",
         ok ? "PASS" : "FAIL", world_rank, reshard_result_string(r), ms, FAULT_TIMEOUT_MS, GRACE_MS,
         reshard_last_error());
  fflush(stdout);
  bad += !ok;
  double t0 = now_ms();
  reshard_plan_destroy(plan);
  ms = now_ms() - t0;
  if (ms > 2000) {
    printf("FAIL rank %d: plan_destroy took %.0f ms\n", world_rank, ms);
    bad++;
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  return bad != 0;
}

/* -------------------------------------------------- rendezvous-timeout */

static int run_rendezvous_timeout(void) {
  const int timeout_ms = 1500;
  int bad = 0;
  reshard_comm_t *comm = NULL;
  double t0 = now_ms();
  reshard_result_t r = reshard_comm_create_ucx(rendezvous, world_rank, world_size, timeout_ms, &comm);
  double ms = now_ms() - t0;
  int ok = r == RESHARD_ERROR_TIMEOUT && comm == NULL && ms <= timeout_ms + GRACE_MS && reshard_last_error()[0];
  printf("%s rank %d: rendezvous of %d with %d started: comm_create_ucx returned %s after %.0f ms (deadline %d ms + "
         "%d ms): %s\n",
         ok ? "PASS" : "FAIL", world_rank, world_size, world_size - 1, reshard_result_string(r), ms, timeout_ms,
         GRACE_MS, reshard_last_error());
  fflush(stdout);
  bad += !ok;
  if (comm) reshard_comm_destroy(comm);
  comm = NULL;

  /* Nothing left behind: the started processes make a communicator of
   * their own on the same rendezvous and gather their pids over it. */
  world_size -= 1;
  t0 = now_ms();
  r = reshard_comm_create_ucx(rendezvous, world_rank, world_size, CASE_TIMEOUT_MS, &comm);
  ms = now_ms() - t0;
  int64_t mine[2] = {(int64_t)getpid(), world_rank}, all[2 * 64];
  gather_t g;
  int got = 0;
  if (r == RESHARD_SUCCESS && gather_create(comm, CASE_TIMEOUT_MS, &g) == 0) {
    got = gather(&g, mine, all) == 0;
    gather_destroy(&g);
  }
  for (int i = 0; got && i < world_size; i++) got = all[2 * i + 1] == i && all[2 * i] > 0;
  ok = r == RESHARD_SUCCESS && got;
  printf("%s rank %d: then a communicator of %d on the same rendezvous: %s after %.0f ms%s%s\n", ok ? "PASS" : "FAIL",
         world_rank, world_size, reshard_result_string(r), ms, r ? ": " : (got ? ", pids gathered" : ", gather failed"),
         r ? reshard_last_error() : "");
  fflush(stdout);
  bad += !ok;
  reshard_comm_destroy(comm);
  return bad != 0;
}

/* ------------------------------------------------------------ recreate */

/* Communicators one after the other on the same rendezvous, each made,
 * used (a gather of pids and ranks) and destroyed: rank 0 must listen on
 * the port again while the connections of the round before may still be
 * in TIME_WAIT. Stops at the first failure. */
static int run_recreate(int rounds) {
  for (int k = 0; k < rounds; k++) {
    reshard_comm_t *comm = NULL;
    double t0 = now_ms();
    reshard_result_t r = reshard_comm_create_ucx(rendezvous, world_rank, world_size, 5000, &comm);
    double ms = now_ms() - t0;
    int64_t mine[2] = {(int64_t)getpid(), world_rank}, all[2 * 64];
    gather_t g;
    int got = 0;
    if (r == RESHARD_SUCCESS && gather_create(comm, CASE_TIMEOUT_MS, &g) == 0) {
      got = gather(&g, mine, all) == 0;
      gather_destroy(&g);
    }
    for (int i = 0; got && i < world_size; i++) got = all[2 * i + 1] == i && all[2 * i] > 0;
    double t1 = now_ms();
    reshard_comm_destroy(comm);
    double destroy_ms = now_ms() - t1;
    int ok = r == RESHARD_SUCCESS && got;
    printf("%s rank %d: communicator %d of %d on %s: %s after %.0f ms%s%s (destroyed in %.0f ms)\n",
           ok ? "PASS" : "FAIL", world_rank, k + 1, rounds, rendezvous, reshard_result_string(r), ms,
           r ? ": " : (got ? ", pids gathered" : ", gather failed"), r ? reshard_last_error() : "", destroy_ms);
    fflush(stdout);
    if (!ok) return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- main */

static void usage(void) {
  fprintf(stderr,
          "usage: test_ucx_reshard --rendezvous HOST:PORT --rank R --size N random [SEEDS] | registered [SEEDS] | "
          "stop | exit | exit-registered | "
          "rendezvous-timeout | recreate [ROUNDS]\n"
          "(started by tests/ucx/run_ucx.sh LIMIT_S NPROCS -- test_ucx_reshard MODE...)\n");
}

int main(int argc, char **argv) {
  int i = 1;
  for (; i < argc && !strncmp(argv[i], "--", 2); i += 2) {
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    if (!strcmp(argv[i], "--rendezvous")) {
      rendezvous = argv[i + 1];
    } else if (!strcmp(argv[i], "--rank")) {
      world_rank = atoi(argv[i + 1]);
    } else if (!strcmp(argv[i], "--size")) {
      world_size = atoi(argv[i + 1]);
    } else {
      usage();
      return 2;
    }
  }
  if (!rendezvous || world_size < 1 || world_size > 64 || world_rank < 0 || world_rank >= world_size || i >= argc) {
    usage();
    return 2;
  }
  const char *mode = argv[i];
  if (!strcmp(mode, "rendezvous-timeout")) {
    if (world_size < 2) {
      usage();
      return 2;
    }
    return run_rendezvous_timeout();
  }
  if (!strcmp(mode, "recreate")) return run_recreate(i + 1 < argc ? atoi(argv[i + 1]) : 3);
  registered = !strcmp(mode, "registered") || !strcmp(mode, "exit-registered");
  if (!strcmp(mode, "exit-registered")) mode = "exit";
  if (strcmp(mode, "random") && !registered && strcmp(mode, "stop") && strcmp(mode, "exit")) {
    usage();
    return 2;
  }

  reshard_comm_t *comm = NULL;
  double t0 = now_ms();
  reshard_result_t r = reshard_comm_create_ucx(rendezvous, world_rank, world_size, CREATE_TIMEOUT_MS, &comm);
  if (r) {
    printf("FAIL rank %d: comm_create_ucx(%s, %d of %d): %s after %.0f ms: %s\n", world_rank, rendezvous, world_rank,
           world_size, reshard_result_string(r), now_ms() - t0, reshard_last_error());
    return 1;
  }
  if (reshard_comm_rank(comm) != world_rank || reshard_comm_size(comm) != world_size) {
    printf("FAIL rank %d: the communicator says rank %d of %d\n", world_rank, reshard_comm_rank(comm),
           reshard_comm_size(comm));
    reshard_comm_destroy(comm);
    return 1;
  }
  if (world_rank == 0) {
    printf("rank 0: a communicator of %d over UCX in %.0f ms\n", world_size, now_ms() - t0);
    fflush(stdout);
  }
  int rc = !strcmp(mode, "random") || (registered && strcmp(mode, "exit")) ? run_random(comm, i + 1 < argc ? atoi(argv[i + 1]) : 30)
           : !strcmp(mode, "stop")  ? run_stop(comm)
                                    : run_exit(comm);
  t0 = now_ms();
  reshard_comm_destroy(comm);
  double ms = now_ms() - t0;
  if (ms > 2000) {
    printf("FAIL rank %d: comm_destroy took %.0f ms\n", world_rank, ms);
    rc = 1;
  }
  return rc;
}
