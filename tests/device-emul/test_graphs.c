/* CUDA graphs (issue 17, item 6): reshard_plan_execute captured into a
 * graph on the NCCL transport, then launched again and again, against the
 * emulated device (mock_device.h). Its captures keep the rules CUDA
 * enforces (a forked stream joined back, no host query of a capturing
 * stream, no wait from a capture on an event recorded outside it without
 * cudaEventWaitExternal, ...) and count every breach in
 * world.capture_violations, which every world here requires to be 0.
 *
 * Every launch moves the values the sources hold at that moment, and
 * every destination element is checked against the self-test's values
 * from global coordinates, the bytes around the fragments untouched. */
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

#include "device-emul/mock_device.h"
#include "device-emul/mock_world.h"
#include "kernels/rs_kernels.h"
#include "plan/relay.h"
#include "reshard.h"
#include "reshard_inproc.h"
#include "reshard_cuda_ipc.h"
#include "reshard_nccl.h"
#include "reshard_selftest.h"
#include "support/random_layout.h"

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ worlds */

typedef mw_rank g_rank;

/* Runs fn on n rank threads; fails the test (label first) on a failed
 * rank, a hang, a breach of a capture's rules, a size mismatch or a wrong
 * byte. */
static void run_world(int n, mw_fn fn, void *ctx, const char *label) {
  g_rank r[MAXR];
  mw_outcome o = mw_run(n, 4000, fn, ctx, r);
  for (int i = 0; i < n; i++)
    if (r[i].failed) fail_msg("%srank %d: %s", label, i, r[i].why);
  if (o.wrong || o.hangs || o.capture_violations || o.bad_size || o.ipc_closed_reads || o.ipc_mapped ||
      o.ipc_freed_mapped)
    fail_msg("%s%lld wrong bytes, %ld hangs, %ld breaches of a capture's rules, %ld size mismatches, %ld pulls "
             "through closed mappings, %ld mappings left open, %ld frees of memory a peer had mapped", label,
             (long long)o.wrong, o.hangs, o.capture_violations, o.bad_size, o.ipc_closed_reads, o.ipc_mapped,
             o.ipc_freed_mapped);
}

/* Runs fn on 3 ranks over NCCL, then over CUDA IPC (r->ctx: an int, 1
 * for CUDA IPC), each world labelled with `what` and its transport. */
static void run_both(mw_fn fn, const char *what) {
  for (int ipc = 0; ipc < 2; ipc++) {
    char label[128];
    snprintf(label, sizeof label, "%s over %s: ", what, ipc ? "CUDA IPC" : "NCCL");
    run_world(3, fn, &ipc, label);
  }
}

/* The caller's stream of a rank (a handle the emulation makes a stream of;
 * not the legacy stream, which cannot capture). */
static cudaStream_t caller_stream(const g_rank *r) { return (cudaStream_t)(uintptr_t)(0x7000 + 16 * r->rank); }

static reshard_result_t exec_on(reshard_plan_t *plan, reshard_selftest_t *s, void *const *dst, size_t ndst,
                                cudaStream_t st) {
  return reshard_plan_execute(plan, (void *const *)s->ptr, (size_t)s->nbuf, dst, ndst, st);
}

/* The capture mode of capture() (a world sets it before it starts). */
static enum cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

/* Captures one execute of plan on st into *gx (0), or says why not. */
static int capture(g_rank *r, reshard_plan_t *plan, reshard_selftest_t *s, void *const *dst, size_t ndst,
                   cudaStream_t st, cudaGraphExec_t *gx) {
  cudaGraph_t g = NULL;
  if (cudaStreamBeginCapture(st, capture_mode)) {
    RFAIL(r, "cudaStreamBeginCapture failed");
    return -1;
  }
  reshard_result_t e = exec_on(plan, s, dst, ndst, st);
  char why[400];
  snprintf(why, sizeof why, "%s", reshard_last_error());
  cudaError_t ce = cudaStreamEndCapture(st, &g);
  if (e || ce) {
    RFAIL(r, "captured execute: %s (%s); cudaStreamEndCapture: %d", reshard_result_string(e), why, (int)ce);
    if (g) cudaGraphDestroy(g);
    return -1;
  }
  ce = cudaGraphInstantiate(gx, g, 0);
  cudaGraphDestroy(g);
  if (ce) RFAIL(r, "cudaGraphInstantiate: %d", (int)ce);
  return ce ? -1 : 0;
}

/* This rank's communicator: NCCL over the mocked caller's, or CUDA IPC
 * over an in-process host one (*host); NULL after RFAIL. */
static reshard_comm_t *comm_open(g_rank *r, int ipc, reshard_comm_t **host) {
  reshard_comm_t *c = NULL;
  *host = NULL;
  reshard_result_t e = ipc ? reshard_comm_create_inproc(r->host_world, r->rank, host) : 0;
  if (!e) e = ipc ? reshard_comm_create_cuda_ipc(*host, &c) : reshard_comm_create_nccl(MOCK_PARENT, &c);
  if (e) RFAIL(r, "comm: %s", reshard_last_error());
  return c;
}

static reshard_plan_status_t status_of(const reshard_plan_t *plan) {
  reshard_plan_status_t st = {.struct_size = sizeof st};
  reshard_plan_get_status(plan, &st);
  return st;
}

/* ------------------------------------------------ launches, byte-exact */

/* One world: a random layout pair, its plan as the cost model or the
 * options make it (relays, verify, small staging and many rounds). */
typedef struct graph_ctx {
  const rl_pair *pair;
  size_t staging;
  int relay;
  const char *topology;
  uint32_t flags;
  int ipc;        /* over CUDA IPC (else NCCL) */
  int registered; /* IPC: reshard_plan_register_buffers first (direct copies) */
} graph_ctx;

/* An execute on the caller's stream (the capture needs the buffer table
 * in place), then one captured, then 12 steps: the sources refilled with
 * the step's values, a launch of the graph (at steps 5 and 9 an
 * uncaptured execute instead: launches and executes interleave, and over
 * CUDA IPC every message of both is numbered by the device's counts),
 * the destination checked. The capture itself moves nothing. */
static void graph_rank(g_rank *r) {
  const graph_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = comm_open(r, x->ipc, &host);
  if (!c) {
    reshard_comm_destroy(host);
    return;
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.flags = x->flags;
  o.staging_bytes = x->staging;
  o.timeout_ms = 20000;
  o.relay = x->relay;
  o.topology = x->topology;
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s = {0}, d = {0};
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (reshard_plan_create(c, x->pair->src, x->pair->dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    goto out;
  }
  if (reshard_selftest_alloc(&s, x->pair->src, r->rank, 0) || reshard_selftest_alloc(&d, x->pair->dst, r->rank, -1)) {
    RFAIL(r, "selftest alloc");
    goto out;
  }
  void *const *dst = (void *const *)d.ptr;
  const size_t nd = (size_t)d.nbuf;
  if (x->registered &&
      reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf, dst, nd)) {
    RFAIL(r, "register_buffers: %s", reshard_last_error());
    goto out;
  }
  if (exec_on(plan, &s, dst, nd, st) || mock_stream_drain(st)) {
    RFAIL(r, "execute 0: %s", reshard_last_error());
    goto out;
  }
  r->wrong += reshard_selftest_check_from(&d, x->pair->dst, x->pair->src, r->rank, 0, "graph: step 0");
  reshard_selftest_fill(&s, x->pair->src, 1);
  if (capture(r, plan, &s, dst, nd, st, &gx)) goto out;
  mock_stream_drain(st);
  r->wrong += reshard_selftest_check_from(&d, x->pair->dst, x->pair->src, r->rank, 0, "graph: after the capture");
  for (int step = 1; step <= 12 && !r->failed && !r->wrong; step++) {
    reshard_selftest_fill(&s, x->pair->src, (uint64_t)step);
    if (step == 5 || step == 9) {
      if (exec_on(plan, &s, dst, nd, st)) RFAIL(r, "step %d: execute: %s", step, reshard_last_error());
    } else if (cudaGraphLaunch(gx, st)) {
      RFAIL(r, "step %d: cudaGraphLaunch failed", step);
    }
    if (mock_stream_drain(st)) RFAIL(r, "step %d: drain hung", step);
    char label[48];
    snprintf(label, sizeof label, "graph: step %d", step);
    r->wrong += reshard_selftest_check_from(&d, x->pair->dst, x->pair->src, r->rank, (uint64_t)step, label);
    reshard_plan_status_t sta = status_of(plan);
    if (sta.failed) RFAIL(r, "step %d: status: %s", step, sta.failure_message);
  }
  /* a graph reads the registration as captured: no other one */
  if (x->registered && !r->failed &&
      reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf, dst, nd) !=
          RESHARD_ERROR_INVALID_USAGE)
    RFAIL(r, "registering again under a graph: %s", reshard_last_error());
out:
  if (gx) cudaGraphExecDestroy(gx);
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

static void launches_random_worlds(void **state) {
  (void)state;
  /* RS_SEED0, RS_IT0, RS_ITERS replay a failure (seed = seed0 + it * 7919) */
  const char *e0 = getenv("RS_SEED0"), *ei = getenv("RS_ITERS"), *ef = getenv("RS_IT0");
  uint64_t seed0 = e0 ? strtoull(e0, NULL, 10) : (uint64_t)time(NULL);
  int iters = ei ? atoi(ei) : 48, it0 = ef ? atoi(ef) : 0;
  long delivered0 = world.delivered;
  int relays = 0;
  for (int it = it0; it < it0 + iters; it++) {
    uint64_t seed = seed0 + (uint64_t)it * 7919;
    rl_pair pair;
    if (rl_pair_make(seed, RL_ANY, &pair)) fail_msg("seed %llu: layout generation failed", (unsigned long long)seed);
    assert_true(pair.nranks <= MAXR);
    int relay = it % 4 == 1 ? 1 : it % 4 == 3 ? -1 : 0;
    /* NCCL, CUDA IPC staged and CUDA IPC registered in turn */
    graph_ctx x = {&pair, it % 3 == 0 ? (size_t)1 << 20 : it % 3 == 1 ? 4096 : 16384, relay,
                   it % 4 == 3 ? "h100-8x400g" : NULL, it % 5 == 2 ? RESHARD_FLAG_VERIFY : 0, it % 3 != 0, it % 3 == 2};
    rs_relay_min_part_bytes = relay ? 0 : RS_RELAY_MIN_PART_DEFAULT;
    relays += relay != 0;
    static const enum cudaStreamCaptureMode modes[3] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                                        cudaStreamCaptureModeRelaxed};
    capture_mode = modes[(it / 3) % 3];
    char label[260];
    snprintf(label, sizeof label, "seed %llu (RS_SEED0=%llu RS_IT0=%d RS_ITERS=1 replays it; %d ranks over %s, "
             "staging %zu, relay %d, flags %u, capture mode %d): ", (unsigned long long)seed,
             (unsigned long long)seed0, it, pair.nranks, x.registered ? "CUDA IPC, registered" : x.ipc ? "CUDA IPC" : "NCCL",
             x.staging, relay, x.flags, (int)capture_mode);
    run_world(pair.nranks, graph_rank, &x, label);
    rl_pair_free(&pair);
  }
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  capture_mode = cudaStreamCaptureModeGlobal;
  print_message("graph worlds: %ld messages delivered, %d with relays on\n", world.delivered - delivered0, relays);
  if (iters >= 40) assert_true(world.delivered - delivered0 > 1000);
}

/* ------------------------------------------------------ fixed layouts */

/* A rank of a world whose n ranks exchange one 48 x 32n fp32 tensor
 * (mw_layouts_all): its communicator (NCCL, or CUDA IPC over the
 * in-process host one), the plan, its sources at step 0 and its
 * destination (sentinel only). */
typedef struct g_fixed {
  reshard_comm_t *host, *c;
  reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  reshard_selftest_t s, d;
} g_fixed;

static int fixed_open(g_rank *r, g_fixed *f, int ipc, uint32_t flags, int64_t timeout_ms) {
  memset(f, 0, sizeof *f);
  f->c = comm_open(r, ipc, &f->host);
  if (!f->c) return -1;
  reshard_result_t e = RESHARD_SUCCESS;
  {
    mw_layouts_all(r->n, 48, 32 * (int64_t)r->n, &f->src, &f->dst);
    reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
    o.staging_bytes = 4096;
    o.timeout_ms = timeout_ms;
    o.flags = flags;
    e = reshard_plan_create(f->c, f->src, f->dst, &o, &f->plan);
  }
  if (!e && (reshard_selftest_alloc(&f->s, f->src, r->rank, 0) || reshard_selftest_alloc(&f->d, f->dst, r->rank, -1)))
    e = RESHARD_ERROR_OUT_OF_MEMORY;
  if (e) RFAIL(r, "setup: %s", reshard_last_error());
  return e ? -1 : 0;
}

static void fixed_close(g_fixed *f) {
  reshard_plan_destroy(f->plan);
  reshard_selftest_free(&f->s);
  reshard_selftest_free(&f->d);
  reshard_layout_destroy(f->src);
  reshard_layout_destroy(f->dst);
  reshard_comm_destroy(f->c);
  reshard_comm_destroy(f->host);
}

/* A plain execute of f's plan into its destination, on st, drained. */
static int fixed_exec(g_rank *r, g_fixed *f, cudaStream_t st) {
  if (!exec_on(f->plan, &f->s, (void *const *)f->d.ptr, (size_t)f->d.nbuf, st) && !mock_stream_drain(st)) return 0;
  RFAIL(r, "execute: %s", reshard_last_error());
  return -1;
}

/* RESHARD_FLAG_DOUBLE_BUFFER: each launch writes the inactive copy and
 * flips the copies on the GPU, as an execute does; what a launch repeats
 * is the captured call, so the committed version stays the capture's
 * (2 here) while the active copy alternates. */
static void dbuf_rank(g_rank *r) {
  g_fixed f;
  reshard_selftest_t d1 = {0};
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  void *bufs[16];
  if (fixed_open(r, &f, *(const int *)r->ctx, RESHARD_FLAG_DOUBLE_BUFFER, 5000)) goto out;
  if (reshard_selftest_alloc(&d1, f.dst, r->rank, -1) || f.d.nbuf > 8) {
    RFAIL(r, "selftest alloc");
    goto out;
  }
  const reshard_selftest_t *d[2] = {&f.d, &d1};
  for (int b = 0; b < f.d.nbuf; b++) bufs[b] = f.d.ptr[b], bufs[f.d.nbuf + b] = d1.ptr[b];
  const size_t nd = 2 * (size_t)f.d.nbuf;
  if (exec_on(f.plan, &f.s, bufs, nd, st) || mock_stream_drain(st)) {
    RFAIL(r, "execute 0: %s", reshard_last_error());
    goto out;
  }
  if (capture(r, f.plan, &f.s, bufs, nd, st, &gx)) goto out;
  for (int step = 1; step <= 6 && !r->failed; step++) {
    reshard_selftest_fill(&f.s, f.src, (uint64_t)step);
    if (cudaGraphLaunch(gx, st) || mock_stream_drain(st)) RFAIL(r, "step %d: launch", step);
    reshard_plan_status_t sta = status_of(f.plan);
    if (sta.failed || sta.committed_version != 2 || sta.active_copy != step % 2)
      RFAIL(r, "step %d: failed %d (%s), committed version %llu, active copy %d", step, sta.failed,
            sta.failure_message, (unsigned long long)sta.committed_version, sta.active_copy);
    else
      r->wrong += reshard_selftest_check(d[step % 2], f.dst, r->rank, (uint64_t)step, "graph dbuf: active") +
                  reshard_selftest_check(d[(step + 1) % 2], f.dst, r->rank, (uint64_t)step - 1, "graph dbuf: inactive");
  }
out:
  if (gx) cudaGraphExecDestroy(gx);
  reshard_selftest_free(&d1);
  fixed_close(&f);
}

static void launches_commit(void **state) {
  (void)state;
  run_both(dbuf_rank, "double buffer");
}

/* What a capture refuses, before it enqueues anything (the capture stays
 * valid and the plan usable), over NCCL and CUDA IPC: the first execute
 * of a plan (no buffer table yet), buffers other than the previous
 * execute's, and RESHARD_FLAG_SYNC (a host wait for a result the capture
 * does not run). */
typedef struct refuse_ctx {
  int ipc, sync;
} refuse_ctx;

/* A capture whose execute must fail with `want`, naming `says`: 0 when it
 * did and the capture ended valid. */
static int refused(g_rank *r, g_fixed *f, void *const *dst, cudaStream_t st, reshard_result_t want,
                   const char *says) {
  cudaGraph_t g = NULL;
  cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
  reshard_result_t e = exec_on(f->plan, &f->s, dst, (size_t)f->d.nbuf, st);
  char why[400];
  snprintf(why, sizeof why, "%s", reshard_last_error());
  cudaError_t ce = cudaStreamEndCapture(st, &g);
  if (g) cudaGraphDestroy(g);
  if (e == want && !ce && strstr(why, says)) return 0;
  RFAIL(r, "%s: %s (%s), wanted %s; cudaStreamEndCapture %d", says, reshard_result_string(e), why,
        reshard_result_string(want), (int)ce);
  return -1;
}

static void refuse_rank(g_rank *r) {
  const refuse_ctx *x = r->ctx;
  g_fixed f;
  reshard_selftest_t d2 = {0};
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (fixed_open(r, &f, x->ipc, x->sync ? RESHARD_FLAG_SYNC : 0, 5000)) goto out;
  if (reshard_selftest_alloc(&d2, f.dst, r->rank, -1)) {
    RFAIL(r, "selftest alloc");
    goto out;
  }
  void *const *dst1 = (void *const *)f.d.ptr;
  if (!x->sync && refused(r, &f, dst1, st, RESHARD_ERROR_INVALID_USAGE, "previous execute")) goto out;
  if (fixed_exec(r, &f, st)) goto out;
  r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 0, "refusals: step 0");
  if (x->sync ? refused(r, &f, dst1, st, RESHARD_ERROR_INVALID_USAGE, "RESHARD_FLAG_SYNC")
              : refused(r, &f, (void *const *)d2.ptr, st, RESHARD_ERROR_INVALID_USAGE, "previous execute"))
    goto out;
  /* the plan goes on: an execute (and, without SYNC, a capture and a
   * launch) of step 1 */
  reshard_selftest_fill(&f.s, f.src, 1);
  if (!x->sync) {
    if (capture(r, f.plan, &f.s, dst1, (size_t)f.d.nbuf, st, &gx)) goto out;
    if (cudaGraphLaunch(gx, st) || mock_stream_drain(st)) RFAIL(r, "launch");
  } else if (fixed_exec(r, &f, st)) {
    goto out;
  }
  r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 1, "refusals: step 1");
  if (status_of(f.plan).failed) RFAIL(r, "status: %s", status_of(f.plan).failure_message);
out:
  if (gx) cudaGraphExecDestroy(gx);
  reshard_selftest_free(&d2);
  fixed_close(&f);
}

static void capture_refusals(void **state) {
  (void)state;
  refuse_ctx nccl = {0, 0}, ipc = {1, 0}, sync = {0, 1}, ipc_sync = {1, 1};
  run_world(3, refuse_rank, &nccl, "NCCL: ");
  run_world(3, refuse_rank, &ipc, "CUDA IPC: ");
  run_world(3, refuse_rank, &sync, "RESHARD_FLAG_SYNC: ");
  run_world(3, refuse_rank, &ipc_sync, "RESHARD_FLAG_SYNC over CUDA IPC: ");
}

/* A launch's deadline counts from when it starts, not from the capture:
 * 1 s after the capture (the plan's timeout is 400 ms) every rank
 * launches, rank 2 150 ms after the others, which poll their status
 * meanwhile: nobody fails. Then a launch whose partner never launches
 * (rank 2 does not) fails at its own deadline, TIMEOUT in
 * reshard_plan_get_status, and nothing hangs. */
typedef struct late_ctx {
  int ipc;
  int reported; /* ranks that saw their launch fail */
  int timeouts; /* ... with TIMEOUT (over CUDA IPC the first to give up
                   aborts the other's wait: REMOTE there) */
  pthread_mutex_t mu;
} late_ctx;

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void late_rank(g_rank *r) {
  late_ctx *x = r->ctx;
  g_fixed f;
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (fixed_open(r, &f, x->ipc, 0, 400) || fixed_exec(r, &f, st) ||
      capture(r, f.plan, &f.s, (void *const *)f.d.ptr, (size_t)f.d.nbuf, st, &gx))
    goto out;
  nap_ms(1000);
  reshard_selftest_fill(&f.s, f.src, 1);
  if (r->rank == 2) nap_ms(150);
  if (cudaGraphLaunch(gx, st)) RFAIL(r, "launch 1");
  for (int64_t t0 = ms_now(); ms_now() - t0 < 300; nap_ms(2)) {
    reshard_plan_status_t sta = status_of(f.plan);
    if (sta.failed) {
      RFAIL(r, "a launch within its deadline failed: %s", sta.failure_message);
      break;
    }
  }
  if (mock_stream_drain(st)) RFAIL(r, "launch 1 never ends");
  r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 1, "late launch");
  if (r->failed) goto out;
  if (r->rank != 2) {
    if (cudaGraphLaunch(gx, st)) RFAIL(r, "launch");
    reshard_plan_status_t sta = status_of(f.plan);
    for (int64_t t0 = ms_now(); !sta.failed && ms_now() - t0 < 5000; sta = status_of(f.plan)) nap_ms(2);
    if (sta.failure != RESHARD_ERROR_TIMEOUT && !(x->ipc && sta.failure == RESHARD_ERROR_REMOTE))
      RFAIL(r, "the launch without its partner: %s (%s)", reshard_result_string(sta.failure), sta.failure_message);
    if (mock_stream_drain(st)) RFAIL(r, "the failed launch never ends");
    pthread_mutex_lock(&x->mu);
    x->timeouts += sta.failure == RESHARD_ERROR_TIMEOUT;
    pthread_mutex_unlock(&x->mu);
  }
  pthread_mutex_lock(&x->mu);
  x->reported += r->rank != 2;
  pthread_mutex_unlock(&x->mu);
  /* rank 2 keeps its communicator until the others are done */
  for (int64_t t0 = ms_now(); ms_now() - t0 < 8000; nap_ms(2)) {
    pthread_mutex_lock(&x->mu);
    int done = x->reported == 2;
    pthread_mutex_unlock(&x->mu);
    if (done) break;
  }
out:
  if (gx) cudaGraphExecDestroy(gx);
  fixed_close(&f);
}

static void launch_without_partner_times_out(void **state) {
  (void)state;
  for (int ipc = 0; ipc < 2; ipc++) {
    late_ctx x = {ipc, 0, 0, PTHREAD_MUTEX_INITIALIZER};
    run_world(3, late_rank, &x, ipc ? "a partner that never launches, CUDA IPC: " : "a partner that never launches: ");
    assert_int_equal(x.reported, 2);
    assert_true(x.timeouts >= 1);
  }
}

/* A graph reads the buffer table and the staging pool as they were
 * captured, whatever comes after: executes with other buffers (each
 * uploads a table; a plan has 4 table slots, and the one the graph reads
 * must not be reused) and a plan whose staging grows the communicator's
 * pool (the pool the graph uses is kept, not freed). Then three more
 * graphs, one per set of buffers, hold all four slots: executes with
 * any of those sets still run (the slot holding them serves), every
 * graph writes its own buffers, and a fifth set is refused. */
static void kept_rank(g_rank *r) {
  g_fixed f;
  reshard_plan_t *big = NULL;
  reshard_selftest_t other[5];
  memset(other, 0, sizeof other);
  cudaGraphExec_t gx[4] = {NULL, NULL, NULL, NULL};
  const cudaStream_t st = caller_stream(r);
  if (fixed_open(r, &f, *(const int *)r->ctx, 0, 5000) || fixed_exec(r, &f, st)) goto out;
  reshard_selftest_t *const src = &f.s;
  const size_t nd = (size_t)f.d.nbuf;
  if (capture(r, f.plan, src, (void *const *)f.d.ptr, nd, st, &gx[0])) goto out;
  for (int k = 0; k < 5 && !r->failed; k++) {
    reshard_selftest_fill(src, f.src, 10 + (uint64_t)k);
    if (reshard_selftest_alloc(&other[k], f.dst, r->rank, -1) ||
        exec_on(f.plan, src, (void *const *)other[k].ptr, nd, st) || mock_stream_drain(st))
      RFAIL(r, "execute with other buffers %d: %s", k, reshard_last_error());
    else
      r->wrong += reshard_selftest_check(&other[k], f.dst, r->rank, 10 + (uint64_t)k, "other buffers");
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = (size_t)1 << 20;
  o.timeout_ms = 5000;
  if (reshard_plan_create(f.c, f.src, f.dst, &o, &big)) RFAIL(r, "a plan with more staging: %s", reshard_last_error());
  for (int step = 1; step <= 2 && !r->failed; step++) {
    reshard_selftest_fill(src, f.src, (uint64_t)step);
    if (cudaGraphLaunch(gx[0], st) || mock_stream_drain(st)) RFAIL(r, "launch %d", step);
    r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, (uint64_t)step, "the captured buffers");
  }
  /* and the new plan runs on the new pool */
  reshard_selftest_fill(src, f.src, 3);
  if (!r->failed && (exec_on(big, src, (void *const *)f.d.ptr, nd, st) || mock_stream_drain(st)))
    RFAIL(r, "the plan with more staging: %s", reshard_last_error());
  r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 3, "the new plan");
  /* graphs 1-3 on other[0-2]: every slot held */
  for (int k = 1; k < 4 && !r->failed; k++) {
    void *const *o_k = (void *const *)other[k - 1].ptr;
    if (exec_on(f.plan, src, o_k, nd, st) || mock_stream_drain(st) || capture(r, f.plan, src, o_k, nd, st, &gx[k]))
      RFAIL(r, "graph %d: %s", k, reshard_last_error());
  }
  for (int k = 0; k < 4 && !r->failed; k++) {
    reshard_selftest_t *want = k ? &other[k - 1] : &f.d;
    reshard_selftest_fill(src, f.src, 20 + (uint64_t)k);
    if (exec_on(f.plan, src, (void *const *)want->ptr, nd, st) || mock_stream_drain(st))
      RFAIL(r, "graph %d's buffers: an execute: %s", k, reshard_last_error());
    r->wrong += reshard_selftest_check(want, f.dst, r->rank, 20 + (uint64_t)k, "buffers of a graph, executed");
    reshard_selftest_fill(src, f.src, 30 + (uint64_t)k);
    if (cudaGraphLaunch(gx[k], st) || mock_stream_drain(st)) RFAIL(r, "graph %d: launch", k);
    r->wrong += reshard_selftest_check(want, f.dst, r->rank, 30 + (uint64_t)k, "buffers of a graph, launched");
  }
  if (!r->failed && exec_on(f.plan, src, (void *const *)other[3].ptr, nd, st) != RESHARD_ERROR_INVALID_USAGE)
    RFAIL(r, "a fifth set of buffers was taken: %s", reshard_last_error());
  mock_stream_drain(st);
  /* The refusal came after the call reached the device executor (its
   * partners may hold their half), so it fails the plan, and the plan's
   * one failure record says so: its status names the refused call (every
   * call before it completed), and the next execute is refused naming it. */
  if (!r->failed) {
    reshard_plan_status_t s = status_of(f.plan);
    char call_n[64];
    snprintf(call_n, sizeof call_n, "failed earlier, at execute call %llu", (unsigned long long)s.executes_completed);
    if (!s.failed || s.failure != RESHARD_ERROR_INVALID_USAGE || s.failed_call != s.executes_completed ||
        !strstr(s.failure_message, "buffer"))
      RFAIL(r, "status after the refused fifth set: failed %d, %s, call %llu of %llu completed: %s", s.failed,
            reshard_result_string(s.failure), (unsigned long long)s.failed_call,
            (unsigned long long)s.executes_completed, s.failure_message);
    else if (exec_on(f.plan, src, (void *const *)f.d.ptr, nd, st) != RESHARD_ERROR_INVALID_USAGE ||
             !strstr(reshard_last_error(), call_n))
      RFAIL(r, "an execute after the refusal: %s (wanted \"%s\")", reshard_last_error(), call_n);
    mock_stream_drain(st);
  }
out:
  for (int k = 0; k < 4; k++)
    if (gx[k]) cudaGraphExecDestroy(gx[k]);
  reshard_plan_destroy(big);
  for (int k = 0; k < 5; k++) reshard_selftest_free(&other[k]);
  fixed_close(&f);
}

static void launches_keep_their_buffers(void **state) {
  (void)state;
  run_both(kept_rank, "kept buffers");
}

/* A launch queued behind other work on the caller's stream has not
 * started: no deadline applies to it yet, though its plan's last execute's
 * is long past. The caller's own kernel of 900 ms holds the stream (the
 * plan's timeout is 400 ms, its last execute 600 ms back); the status
 * polled right after the launch is fine, a plan created meanwhile (which
 * waits for the communicator's executes: a review found it aborting the
 * communicator) too, and so is the data once the stream drained. */
static void pending_rank(g_rank *r) {
  g_fixed f;
  reshard_plan_t *third = NULL;
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (fixed_open(r, &f, *(const int *)r->ctx, 0, 400) || fixed_exec(r, &f, st) ||
      capture(r, f.plan, &f.s, (void *const *)f.d.ptr, (size_t)f.d.nbuf, st, &gx))
    goto out;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = 4096;
  o.timeout_ms = 400;
  nap_ms(600);
  /* the caller's work: a kernel (the emulated copy kernel, no tiles) */
  M.kernel_ns = 900 * 1000000LL;
  rs_cuda_launch_copies_gated(NULL, 0, NULL, NULL, NULL, NULL, NULL, st);
  M.kernel_ns = 0;
  reshard_selftest_fill(&f.s, f.src, 1);
  if (cudaGraphLaunch(gx, st)) RFAIL(r, "launch");
  reshard_plan_status_t sta = status_of(f.plan);
  if (sta.failed) RFAIL(r, "a launch not started yet failed: %s", sta.failure_message);
  if (!r->failed && reshard_plan_create(f.c, f.src, f.dst, &o, &third))
    RFAIL(r, "a plan created behind the queued launch: %s", reshard_last_error());
  if (mock_stream_drain(st)) RFAIL(r, "drain hung");
  r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 1, "queued launch");
  if (status_of(f.plan).failed) RFAIL(r, "status after the launch: %s", status_of(f.plan).failure_message);
out:
  if (gx) cudaGraphExecDestroy(gx);
  reshard_plan_destroy(third);
  fixed_close(&f);
}

static void queued_launch_not_late(void **state) {
  (void)state;
  run_both(pending_rank, "queued launch");
}

/* reshard_plan_get_status polled from another thread of the rank (as a
 * framework's watchdog would) while the rank's main thread captures, in
 * global mode: reshard's queries do not invalidate the capture. (Only
 * while a capture is open: a poll that races the GPU's copy of a verdict
 * keeps nothing of it, agreement_verdict, but ThreadSanitizer sees the
 * emulated copy and the read race all the same.) */
typedef struct poller {
  g_fixed *f;
  int rank, n, stop, open, busy;
  long polls;
} poller;

static void *poll_main(void *arg) {
  poller *q = arg;
  mock_reset(q->rank, q->n); /* this thread is of the rank's process */
  M.log_off = 1;
  while (!__atomic_load_n(&q->stop, __ATOMIC_ACQUIRE)) {
    __atomic_store_n(&q->busy, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&q->open, __ATOMIC_SEQ_CST)) {
      status_of(q->f->plan);
      __atomic_fetch_add(&q->polls, 1, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&q->busy, 0, __ATOMIC_SEQ_CST);
    nap_ms(1);
  }
  return NULL;
}

static void watched_rank(g_rank *r) {
  g_fixed f;
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (fixed_open(r, &f, *(const int *)r->ctx, 0, 5000) || fixed_exec(r, &f, st)) {
    fixed_close(&f);
    return;
  }
  poller q = {&f, r->rank, r->n, 0, 0, 0, 0};
  pthread_t th;
  pthread_create(&th, NULL, poll_main, &q);
  for (int k = 0; k < 5 && !r->failed; k++) {
    if (gx) cudaGraphExecDestroy(gx);
    gx = NULL;
    /* the capture stays open a while, the poller at work */
    cudaGraph_t g = NULL;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
    __atomic_store_n(&q.open, 1, __ATOMIC_SEQ_CST);
    reshard_result_t e = exec_on(f.plan, &f.s, (void *const *)f.d.ptr, (size_t)f.d.nbuf, st);
    nap_ms(20);
    /* the poller is done before the capture ends */
    __atomic_store_n(&q.open, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&q.busy, __ATOMIC_SEQ_CST)) nap_ms(1);
    cudaError_t ce = cudaStreamEndCapture(st, &g);
    if (e || ce || cudaGraphInstantiate(&gx, g, 0)) RFAIL(r, "capture %d: %s; %d", k, reshard_last_error(), (int)ce);
    if (g) cudaGraphDestroy(g);
    reshard_selftest_fill(&f.s, f.src, 1 + (uint64_t)k);
    if (!r->failed && (cudaGraphLaunch(gx, st) || mock_stream_drain(st))) RFAIL(r, "launch %d", k);
    r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 1 + (uint64_t)k, "watched");
  }
  __atomic_store_n(&q.stop, 1, __ATOMIC_RELEASE);
  pthread_join(th, NULL);
  if (!__atomic_load_n(&q.polls, __ATOMIC_RELAXED)) RFAIL(r, "the poller never polled");
  if (gx) cudaGraphExecDestroy(gx);
  fixed_close(&f);
}

static void status_polled_during_capture(void **state) {
  (void)state;
  run_both(watched_rank, "polled during capture");
}

/* Block quantization in a graph (issue 19 on the device): a plan that
 * quantizes bf16/f16/f32 weights into fp8 blocks on the way, with the
 * internal plan that first gathers blocks split across source ranks,
 * both captured with the call: each launch quantizes the sources'
 * current values (every code and scale checked against the self-test's
 * reference quantizer), over NCCL and CUDA IPC. */
typedef struct quant_ctx {
  reshard_layout_t *src, *dst;
  int ipc;
  /* spreading (launches_spread): the topology, the flags, and the ranks
   * whose plan spreads */
  const char *topology;
  uint32_t flags;
  int spread;
} quant_ctx;

static void quant_rank(g_rank *r) {
  const quant_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = comm_open(r, x->ipc, &host);
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s = {0}, d = {0};
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (!c) goto out;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = x->topology ? (size_t)1 << 20 : 4096;
  o.timeout_ms = 20000;
  o.topology = x->topology;
  o.flags = x->flags;
  if (reshard_plan_create(c, x->src, x->dst, &o, &plan) || reshard_selftest_alloc(&s, x->src, r->rank, 0) ||
      reshard_selftest_alloc(&d, x->dst, r->rank, -1)) {
    RFAIL(r, "setup: %s", reshard_last_error());
    goto out;
  }
  if (plan->spread) __atomic_fetch_add(&((quant_ctx *)r->ctx)->spread, 1, __ATOMIC_RELAXED);
  void *const *dst = (void *const *)d.ptr;
  const size_t nd = (size_t)d.nbuf;
  if (exec_on(plan, &s, dst, nd, st) || mock_stream_drain(st)) {
    RFAIL(r, "execute 0: %s", reshard_last_error());
    goto out;
  }
  r->wrong += reshard_selftest_check_from(&d, x->dst, x->src, r->rank, 0, "quantized graph: step 0");
  if (capture(r, plan, &s, dst, nd, st, &gx)) goto out;
  for (int step = 1; step <= 4 && !r->failed && !r->wrong; step++) {
    reshard_selftest_fill(&s, x->src, (uint64_t)step);
    if (cudaGraphLaunch(gx, st) || mock_stream_drain(st)) RFAIL(r, "step %d: launch", step);
    r->wrong += reshard_selftest_check_from(&d, x->dst, x->src, r->rank, (uint64_t)step, "quantized graph");
    reshard_plan_status_t sta = status_of(plan);
    if (sta.failed) RFAIL(r, "step %d: status: %s", step, sta.failure_message);
  }
out:
  if (gx) cudaGraphExecDestroy(gx);
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

static void launches_quantize(void **state) {
  (void)state;
  /* RS_QUANT_SEED0 replays (seed = seed0 + it) */
  const char *e0 = getenv("RS_QUANT_SEED0");
  uint64_t seed0 = e0 ? strtoull(e0, NULL, 10) : (uint64_t)time(NULL);
  for (int it = 0; it < 16; it++) {
    uint64_t seed = seed0 + (uint64_t)it;
    quant_ctx x = {NULL, NULL, it % 2, NULL, 0, 0};
    const int n = 2 + (int)(seed % 4);
    mw_quant_pair(seed, n, &x.src, &x.dst);
    char label[160];
    snprintf(label, sizeof label, "seed %llu (RS_QUANT_SEED0 replays it), %d ranks over %s: ", (unsigned long long)seed,
             n, x.ipc ? "CUDA IPC" : "NCCL");
    run_world(n, quant_rank, &x, label);
    reshard_layout_destroy(x.src);
    reshard_layout_destroy(x.dst);
  }
}

/* Source-side spreading in a graph (issue 44): a plan whose pre-plan
 * copies slices of an over-loaded rank's sole-held experts into device
 * scratch of its domain's idle ranks, captured with the main plan that
 * sends them on; each launch moves the sources' current values (every
 * destination byte checked), over NCCL and CUDA IPC, plain bf16 and
 * quantized to fp8 blocks on the way. */
static void launches_spread(void **state) {
  (void)state;
  for (int it = 0; it < 4; it++) {
    quant_ctx x = {NULL, NULL, it % 2, "h100-8x400g", RESHARD_FLAG_SPREAD_ALWAYS, 0};
    const int fp8 = it / 2;
    mw_moe_pair(fp8 ? 512 : 256, fp8, &x.src, &x.dst);
    char label[160];
    snprintf(label, sizeof label, "spreading%s over %s: ", fp8 ? ", fp8" : "", x.ipc ? "CUDA IPC" : "NCCL");
    run_world(16, quant_rank, &x, label);
    assert_int_equal(x.spread, 16);
    reshard_layout_destroy(x.src);
    reshard_layout_destroy(x.dst);
  }
}

/* The pools a graph kept, over CUDA IPC: after a capture a larger plan
 * replaces the staging pool (kept for the graph, and the peers keep their
 * mappings of it), the graph launches, every graph and plan goes, and a
 * new plan and the communicator's destroy follow: no memory is freed
 * while a peer still has it mapped (the emulation counts it; a review
 * found the kept pools freed at the next plan's exchange, under the
 * peers' mappings), and the new plan moves its data right. */
static void lifecycle_rank(g_rank *r) {
  g_fixed f;
  reshard_plan_t *big = NULL, *next = NULL;
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (fixed_open(r, &f, 1, 0, 5000) || fixed_exec(r, &f, st) ||
      capture(r, f.plan, &f.s, (void *const *)f.d.ptr, (size_t)f.d.nbuf, st, &gx))
    goto out;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = (size_t)1 << 20;
  o.timeout_ms = 5000;
  if (reshard_plan_create(f.c, f.src, f.dst, &o, &big)) {
    RFAIL(r, "a plan with more staging: %s", reshard_last_error());
    goto out;
  }
  reshard_selftest_fill(&f.s, f.src, 1);
  if (cudaGraphLaunch(gx, st) || mock_stream_drain(st)) RFAIL(r, "launch");
  r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 1, "lifecycle: launch");
  cudaGraphExecDestroy(gx);
  gx = NULL;
  reshard_plan_destroy(big);
  big = NULL;
  reshard_plan_destroy(f.plan);
  f.plan = NULL;
  o.staging_bytes = (size_t)4 << 20; /* (grows the pool again) */
  reshard_selftest_fill(&f.s, f.src, 2);
  if (reshard_plan_create(f.c, f.src, f.dst, &o, &next) ||
      exec_on(next, &f.s, (void *const *)f.d.ptr, (size_t)f.d.nbuf, st) || mock_stream_drain(st))
    RFAIL(r, "the next plan: %s", reshard_last_error());
  else
    r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 2, "lifecycle: the next plan");
out:
  if (gx) cudaGraphExecDestroy(gx);
  reshard_plan_destroy(next);
  reshard_plan_destroy(big);
  fixed_close(&f);
}

static void kept_pools_outlive_mappings(void **state) {
  (void)state;
  run_world(3, lifecycle_rank, NULL, "kept pools, CUDA IPC: ");
}

/* Groups larger than one launch of the IPC kernels (RS_IPC_MAX_OPS
 * operations): 14 ranks exchange with every other, with
 * RESHARD_FLAG_VERIFY (each message followed by its sums), so that a
 * round's 26 sends span two launches and a peer's message and sums fall
 * in different ones; its counts advance once, after the last. Captured
 * and launched, and executed, every element checked. */
static void wide_rank(g_rank *r) {
  g_fixed f;
  cudaGraphExec_t gx = NULL;
  const cudaStream_t st = caller_stream(r);
  if (fixed_open(r, &f, 1, RESHARD_FLAG_VERIFY, 10000) || fixed_exec(r, &f, st) ||
      capture(r, f.plan, &f.s, (void *const *)f.d.ptr, (size_t)f.d.nbuf, st, &gx))
    goto out;
  r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, 0, "wide: execute");
  for (int step = 1; step <= 3 && !r->failed; step++) {
    reshard_selftest_fill(&f.s, f.src, (uint64_t)step);
    if ((step == 2 ? exec_on(f.plan, &f.s, (void *const *)f.d.ptr, (size_t)f.d.nbuf, st) != 0
                   : cudaGraphLaunch(gx, st) != cudaSuccess) ||
        mock_stream_drain(st))
      RFAIL(r, "step %d: %s", step, reshard_last_error());
    r->wrong += reshard_selftest_check(&f.d, f.dst, r->rank, (uint64_t)step, "wide");
    if (status_of(f.plan).failed) RFAIL(r, "step %d: status: %s", step, status_of(f.plan).failure_message);
  }
out:
  if (gx) cudaGraphExecDestroy(gx);
  fixed_close(&f);
}

static void groups_span_launches(void **state) {
  (void)state;
  run_world(14, wide_rank, NULL, "14 ranks, verify, CUDA IPC: ");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(capture_refusals),
      cmocka_unit_test(launches_commit),
      cmocka_unit_test(launches_keep_their_buffers),
      cmocka_unit_test(launch_without_partner_times_out),
      cmocka_unit_test(queued_launch_not_late),
      cmocka_unit_test(status_polled_during_capture),
      cmocka_unit_test(launches_random_worlds),
      cmocka_unit_test(launches_quantize),
      cmocka_unit_test(launches_spread),
      cmocka_unit_test(kept_pools_outlive_mappings),
      cmocka_unit_test(groups_span_launches),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
