/* The CUDA IPC transport (issue 16) against the emulated device
 * (mock_device.h): ranks as threads that the transport takes for
 * processes (cudaIpcOpenMemHandle maps every peer), bootstrapped over the
 * in-process host communicator. The protocol's kernels (kernels/rs_ipc.h)
 * run as the very code the GPU runs, their spins as steps with the same
 * timeouts and abort word.
 *
 * Every test that moves data checks every destination byte with the
 * public self-test (values from global coordinates, the bytes around
 * fragments untouched), and no test may hang (the emulation cuts a host
 * wait that could never end and counts it). */
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
#include "plan/quant.h"
#include "plan/relay.h"
#include "transport/transport.h"
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

typedef mw_rank ipc_rank;

/* Said first when a world fails (a seed). */
static char world_label[160];

/* Runs fn on n rank threads; fails the test on a failed rank, a hang, or
 * a mapping left open. */
static void run_world(int n, mw_fn fn, void *ctx) {
  ipc_rank r[MAXR];
  mw_outcome o = mw_run(n, 4000, fn, ctx, r);
  for (int i = 0; i < n; i++)
    if (r[i].failed) fail_msg("%srank %d: %s", world_label, i, r[i].why);
  if (o.hangs || o.ipc_mapped || o.ipc_closed_reads || o.ipc_freed_mapped)
    fail_msg("%ld hangs, %ld IPC mappings left open, %ld pulls through closed mappings, %ld frees of memory a peer "
             "had mapped", o.hangs, o.ipc_mapped, o.ipc_closed_reads, o.ipc_freed_mapped);
}

/* This rank's host and IPC communicators (NULL after RFAIL). */
static reshard_comm_t *open_ipc(ipc_rank *r, reshard_comm_t **host) {
  *host = NULL;
  if (reshard_comm_create_inproc(r->host_world, r->rank, host)) {
    RFAIL(r, "inproc: %s", reshard_last_error());
    return NULL;
  }
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_cuda_ipc(*host, &c)) {
    RFAIL(r, "comm_create_cuda_ipc: %s", reshard_last_error());
    reshard_comm_destroy(*host);
    *host = NULL;
    return NULL;
  }
  return c;
}

/* The NCCL communicator over the mocked caller's, or open_ipc's. */
static reshard_comm_t *open_comm(ipc_rank *r, int nccl, reshard_comm_t **host) {
  *host = NULL;
  if (!nccl) return open_ipc(r, host);
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_nccl(MOCK_PARENT, &c)) RFAIL(r, "comm: %s", reshard_last_error());
  return c;
}

static void close_ipc(reshard_comm_t *c, reshard_comm_t *host) {
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

/* A plan's layouts and this rank's buffers. */
typedef struct ipc_plan {
  reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  reshard_selftest_t s, d;
  unsigned char **before; /* copies of d's buffers (untouched checks) */
} ipc_plan;

static reshard_result_t make_plan(reshard_comm_t *c, ipc_plan *p, int n, int64_t rows, size_t staging,
                                  int64_t timeout_ms, int rank) {
  memset(p, 0, sizeof *p);
  mw_layouts_all(n, rows, 32 * (int64_t)n, &p->src, &p->dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = staging;
  o.timeout_ms = timeout_ms;
  reshard_result_t e = reshard_plan_create(c, p->src, p->dst, &o, &p->plan);
  if (e) return e;
  if (reshard_selftest_alloc(&p->d, p->dst, rank, -1)) return RESHARD_ERROR_OUT_OF_MEMORY;
  p->before = calloc((size_t)p->d.nbuf + 1, sizeof *p->before);
  for (int b = 0; b < p->d.nbuf; b++)
    if (p->d.ptr[b]) {
      p->before[b] = malloc(p->d.bytes[b]);
      memcpy(p->before[b], p->d.ptr[b], p->d.bytes[b]);
    }
  return RESHARD_SUCCESS;
}

static reshard_result_t run_plan(ipc_plan *p, int rank, int step) {
  reshard_selftest_free(&p->s);
  if (reshard_selftest_alloc(&p->s, p->src, rank, step)) return RESHARD_ERROR_OUT_OF_MEMORY;
  return reshard_plan_execute(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf, (void *const *)p->d.ptr,
                              (size_t)p->d.nbuf, NULL);
}

/* Bytes of the destination buffers that differ from before any execute. */
static long changed_bytes(const ipc_plan *p) {
  long n = 0;
  for (int b = 0; b < p->d.nbuf; b++)
    for (size_t i = 0; p->d.ptr[b] && i < p->d.bytes[b]; i++) n += p->d.ptr[b][i] != p->before[b][i];
  return n;
}

static void free_plan(ipc_plan *p) {
  reshard_plan_destroy(p->plan);
  for (int b = 0; p->before && b < p->d.nbuf; b++) free(p->before[b]);
  free(p->before);
  reshard_selftest_free(&p->s);
  reshard_selftest_free(&p->d);
  reshard_layout_destroy(p->src);
  reshard_layout_destroy(p->dst);
}

/* Polls reshard_plan_get_status until the plan failed or `ms` passed. */
static reshard_plan_status_t wait_failed(const reshard_plan_t *plan, int ms) {
  reshard_plan_status_t st = {.struct_size = sizeof st};
  int64_t t0 = ms_now();
  while (ms_now() - t0 < ms) {
    reshard_plan_get_status(plan, &st);
    if (st.failed) break;
    mock_stream_drain(NULL);
  }
  return st;
}

/* ------------------------------------------------------------ tests */

/* Random layout pairs over a world of IPC ranks: staging offsets,
 * halves, rounds, relays and local copies move every destination byte
 * right, through mailboxes and pulls from the peers' pools. */
typedef struct rand_ctx {
  const rl_pair *pair;
  size_t staging;
  int relay;
  const char *topology;
  int registered; /* reshard_plan_register_buffers, then direct executes */
  uint32_t flags;  /* options.flags */
  int nccl;        /* the NCCL transport instead */
} rand_ctx;

static void random_rank(ipc_rank *r) {
  const rand_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, x->nccl, &host))) return;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.flags = x->flags;
  o.staging_bytes = x->staging;
  o.timeout_ms = 20000;
  o.relay = x->relay;
  o.topology = x->topology;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(c, x->pair->src, x->pair->dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    close_ipc(c, host);
    return;
  }
  reshard_selftest_t s = {0}, d;
  if (reshard_selftest_alloc(&d, x->pair->dst, r->rank, -1)) RFAIL(r, "selftest alloc");
  if (x->registered) {
    /* one set of source buffers, registered, refilled every step (the
     * last step passes other buffers: the staged path) */
    if (reshard_selftest_alloc(&s, x->pair->src, r->rank, 0)) RFAIL(r, "selftest alloc");
    else if (reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                           (size_t)d.nbuf))
      RFAIL(r, "register_buffers: %s", reshard_last_error());
  }
  for (int step = 0; step < (x->registered ? 3 : 2) && !r->failed; step++) {
    if (x->registered && step == 2 && reshard_plan_register_buffers(plan, NULL, 0, NULL, 0)) {
      RFAIL(r, "unregister: %s", reshard_last_error());
      break;
    }
    if (x->registered && step < 2) {
      reshard_selftest_fill(&s, x->pair->src, (uint64_t)step);
    } else if (reshard_selftest_alloc(&s, x->pair->src, r->rank, step)) {
      RFAIL(r, "selftest alloc");
      break;
    }
    reshard_result_t e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                              (size_t)d.nbuf, NULL);
    if (e) RFAIL(r, "execute: %s", reshard_last_error());
    else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    else r->wrong += reshard_selftest_check_from(&d, x->pair->dst, x->pair->src, r->rank, (uint64_t)step, "ipc world");
    reshard_plan_status_t st = {.struct_size = sizeof st};
    reshard_plan_get_status(plan, &st);
    if (st.failed) RFAIL(r, "status: %s", st.failure_message);
    if (!x->registered || step == 1) reshard_selftest_free(&s); /* registered: step 2 gets other buffers */
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  close_ipc(c, host);
}

/* What a run of random worlds varies (each test sets all of it, so a
 * failed test leaves nothing behind for the next). */
typedef struct worlds_cfg {
  int registered;  /* rand_ctx.registered */
  rl_mode mode;    /* RL_ANY, or RL_CASTS: dtypes converted on the way */
  int iters;       /* 0: 120 (RS_ITERS overrides either) */
  uint32_t flags;  /* rand_ctx.flags */
  int nccl;        /* every other world over NCCL */
} worlds_cfg;

static void run_worlds(worlds_cfg cfg) {
  /* RS_SEED0, RS_IT0, RS_ITERS replay a failure (seed = seed0 + it * 104729) */
  const char *e0 = getenv("RS_SEED0"), *ei = getenv("RS_ITERS"), *ef = getenv("RS_IT0");
  uint64_t seed0 = e0 ? strtoull(e0, NULL, 10) : (uint64_t)time(NULL);
  int iters = ei ? atoi(ei) : cfg.iters ? cfg.iters : 120, it0 = ef ? atoi(ef) : 0;
  long delivered0 = world.delivered;
  for (int it = it0; it < it0 + iters; it++) {
    uint64_t seed = seed0 + (uint64_t)it * 104729;
    rl_pair pair;
    if (rl_pair_make(seed, cfg.mode, &pair)) fail_msg("seed %llu: layout generation failed", (unsigned long long)seed);
    assert_true(pair.nranks <= MAXR);
    int relay = it % 4 == 1 ? 1 : it % 4 == 3 ? -1 : 0;
    rand_ctx x = {&pair, it % 3 == 0 ? (size_t)1 << 20 : it % 3 == 1 ? 4096 : 16384, relay,
                  it % 4 == 3 ? "h100-8x400g" : NULL, cfg.registered, cfg.flags, cfg.nccl && it % 2};
    rs_relay_min_part_bytes = relay ? 0 : RS_RELAY_MIN_PART_DEFAULT;
    /* run_world's failure message, with the seed first */
    ipc_rank r[MAXR];
    mw_outcome o = mw_run(pair.nranks, 4000, random_rank, &x, r);
    int64_t wrong = o.wrong;
    int failed = o.failed;
    long hangs = o.hangs, mapped = o.ipc_mapped, closed = o.ipc_closed_reads + o.ipc_freed_mapped;
    if (wrong || failed >= 0 || hangs || mapped || closed) {
      rl_pair_print(&pair, stderr);
      for (int i = 0; i < pair.nranks; i++)
        if (r[i].failed) fprintf(stderr, "rank %d: %s\n", i, r[i].why);
      fprintf(stderr, "replay: RS_SEED0=%llu RS_IT0=%d RS_ITERS=1\n", (unsigned long long)seed0, it);
      fail_msg("seed %llu (%d ranks, staging %zu, relay %d): %lld wrong, %ld hangs, %ld mappings open, %ld pulls "
               "through closed mappings or frees of mapped memory%s%s", (unsigned long long)seed, pair.nranks, x.staging, relay,
               (long long)wrong, hangs, mapped, closed,
               failed >= 0 ? "; first failed rank: " : "", failed >= 0 ? r[failed].why : "");
    }
    rl_pair_free(&pair);
  }
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  world.hang_ms = 3000;
  printf("random IPC worlds: %ld messages pulled\n", world.delivered - delivered0);
  if (iters >= 100) assert_true(world.delivered - delivered0 > 300);
}

/* A random-worlds test: its worlds_cfg is its state
 * (cmocka_unit_test_prestate, named in main by WORLDS_TEST). */
static void worlds_test(void **state) {
  run_worlds(*(const worlds_cfg *)*state);
}

/* The random-world cases, each a worlds_cfg {registered, mode, iters,
 * flags, nccl} named as its test. */
static worlds_cfg random_worlds = {0, RL_ANY, 0, 0, 0};

/* The same with registered buffers: direct copies from the senders'
 * buffers (relays included: forwards read the relaying rank's registered
 * destination buffers), then unregistered, a step with other buffers
 * (staged). */
static worlds_cfg registered_random_worlds = {1, RL_ANY, 0, 0, 0};

/* Registered buffers with dtypes converted on the way (support/
 * random_layout RL_CASTS: f32, bf16, f16 and fp8 into each other): each
 * direct copy casts as the composed pack and unpack would
 * (rs_copy_compose carries the cast), checked against the self-test's
 * reference casts; the unregistered step goes staged. */
static worlds_cfg registered_cast_worlds = {1, RL_CASTS, 48, 0, 0};

/* RESHARD_FLAG_VERIFY with registered buffers: each receiver sums the
 * senders' boxes from their mapped buffers and its own after the direct
 * copies; clean worlds (relays, local copies) agree. */
static worlds_cfg registered_verify_worlds = {1, RL_ANY, 60, RESHARD_FLAG_VERIFY, 0};

/* RESHARD_FLAG_VERIFY on the device (issue 17, item 4), over CUDA IPC and
 * NCCL (every other world): the box sums of both ends agree on clean
 * transfers, relays and local copies included. */
static worlds_cfg verify_random_worlds = {0, RL_ANY, 0, RESHARD_FLAG_VERIFY, 1};

/* A bit flipped in flight: verify on the device catches it (MISMATCH
 * naming the tensor, the box and the sender); without the flag the same
 * damage goes unnoticed by reshard (the self-test sees it). */
typedef struct corrupt_ctx {
  int nccl;
  uint32_t flags;
  int registered; /* registered buffers: the direct copy is corrupted */
  int caught, wrong_unnoticed, wrong;
  pthread_mutex_t mu;
} corrupt_ctx;

static void corrupt_rank(ipc_rank *r) {
  corrupt_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, x->nccl, &host))) return;
  reshard_layout_t *src, *dst;
  mw_layouts_all(r->n, 48, 32 * (int64_t)r->n, &src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = 1 << 20;
  o.timeout_ms = 3000;
  o.flags = x->flags;
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s = {0}, d = {0};
  if (reshard_plan_create(c, src, dst, &o, &plan) || reshard_selftest_alloc(&s, src, r->rank, 0) ||
      reshard_selftest_alloc(&d, dst, r->rank, -1)) {
    RFAIL(r, "setup: %s", reshard_last_error());
  } else {
    if (x->registered && reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf,
                                                       (void *const *)d.ptr, (size_t)d.nbuf))
      RFAIL(r, "register: %s", reshard_last_error());
    if (r->rank == 0) {
      if (x->registered) mock_corrupt_next_copy();
      else mock_corrupt_next();
    }
    if (reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL))
      RFAIL(r, "execute: %s", reshard_last_error());
    mock_stream_drain(NULL);
    int64_t wrong = reshard_selftest_check(&d, dst, r->rank, 0, "corrupt");
    reshard_plan_status_t st = wait_failed(plan, x->flags ? 2000 : 50);
    pthread_mutex_lock(&x->mu);
    if (st.failed && st.failure == RESHARD_ERROR_MISMATCH && strstr(st.failure_message, "verify: tensor 'w'") &&
        (strstr(st.failure_message, "received from rank") ||
         (x->registered && strstr(st.failure_message, "copied locally on rank"))))
      x->caught++;
    if (wrong && !st.failed) x->wrong_unnoticed++;
    if (st.failed && getenv("RS_TEST_VERBOSE")) fprintf(stderr, "rank %d: %s\n", r->rank, st.failure_message);
    if (wrong) x->wrong++;
    pthread_mutex_unlock(&x->mu);
  }
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

static void verify_catches_corruption(void **state) {
  (void)state;
  /* NCCL, IPC staged, IPC registered (a direct copy, or a local one,
   * writes a wrong byte: verify sums the senders' side from their mapped
   * buffers) */
  for (int mode = 0; mode < 3; mode++)
    for (int flag = 0; flag < 2; flag++) {
      const char *name = mode == 0 ? "NCCL" : mode == 1 ? "IPC" : "IPC registered";
      corrupt_ctx x = {.nccl = mode == 0, .registered = mode == 2, .flags = flag ? RESHARD_FLAG_VERIFY : 0,
                       .mu = PTHREAD_MUTEX_INITIALIZER};
      run_world(3, corrupt_rank, &x);
      if (flag && (x.caught != 1 || x.wrong_unnoticed))
        fail_msg("%s, verify: caught by %d ranks (expected 1), %d with wrong data unnoticed", name, x.caught,
                 x.wrong_unnoticed);
      if (!flag && (x.caught || !x.wrong_unnoticed))
        fail_msg("%s, no verify: caught %d, unnoticed %d (the damage must land unnoticed)", name, x.caught,
                 x.wrong_unnoticed);
    }
}

/* ------------------------------------------------------------ world cases */

/* A test that runs a world of n ranks, its world_case its state
 * (cmocka_unit_test_prestate, named in main by WORLD_TEST). Each rank runs
 * fn or, where body is set, opens its communicator (NCCL where nccl, CUDA
 * IPC otherwise) and a plan of 64 rows, 4 KiB of staging and timeout_ms,
 * runs body, and frees both. The cases: below, each after its rank's part. */
typedef void plan_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p);
typedef struct world_case {
  int n;
  mw_fn fn;
  plan_body *body;
  int64_t timeout_ms;
  int nccl;
} world_case;

static void plan_rank(ipc_rank *r) {
  const world_case *w = r->ctx;
  reshard_comm_t *host = NULL, *c = open_comm(r, w->nccl, &host);
  if (!c) return;
  ipc_plan p;
  if (make_plan(c, &p, r->n, 64, 4096, w->timeout_ms, r->rank)) RFAIL(r, "plan: %s", reshard_last_error());
  else w->body(r, host, &p);
  free_plan(&p);
  close_ipc(c, host);
}

static void world_test(void **state) {
  world_case *w = *state;
  run_world(w->n, w->body ? plan_rank : w->fn, w);
}

/* Registered buffers move no byte through staging: every message is a
 * token and the receiver copies from the sender's buffer (no pull from a
 * pool); unregistered, other buffers go staged; registering them goes
 * direct again, and the old mappings are released. */
static void direct_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p) {
  if (reshard_selftest_alloc(&p->s, p->src, r->rank, 0)) RFAIL(r, "selftest alloc");
  long pulls0 = world.ipc_pool_pulls;
  if (!r->failed && reshard_plan_register_buffers(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf,
                                                  (void *const *)p->d.ptr, (size_t)p->d.nbuf))
    RFAIL(r, "register: %s", reshard_last_error());
  for (int step = 0; step < 4 && !r->failed; step++) {
    if (step == 2) { /* unregistered, other source buffers: staged */
      if (reshard_plan_register_buffers(p->plan, NULL, 0, NULL, 0)) RFAIL(r, "unregister: %s", reshard_last_error());
      reshard_selftest_t old = p->s;
      if (reshard_selftest_alloc(&p->s, p->src, r->rank, step)) RFAIL(r, "selftest alloc");
      reshard_selftest_free(&old);
    } else {
      reshard_selftest_fill(&p->s, p->src, (uint64_t)step);
    }
    if (step == 3 && reshard_plan_register_buffers(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf,
                                                   (void *const *)p->d.ptr, (size_t)p->d.nbuf))
      RFAIL(r, "register again: %s", reshard_last_error());
    if (reshard_plan_execute(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf, (void *const *)p->d.ptr,
                             (size_t)p->d.nbuf, NULL))
      RFAIL(r, "execute: %s", reshard_last_error());
    if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    r->wrong += reshard_selftest_check(&p->d, p->dst, r->rank, (uint64_t)step, "direct");
    /* every rank is past this step before anyone looks at the counter */
    uint64_t v = 0;
    host->ops->allreduce_max_u64(host, &v, 1, INT64_MAX);
    long pulls = world.ipc_pool_pulls - pulls0;
    if (step < 2 && pulls) RFAIL(r, "step %d: %ld messages pulled from staging pools (direct expected)", step, pulls);
    if (step == 2 && pulls == 0) RFAIL(r, "step 2 (other buffers): nothing went through staging");
    if (step == 2) pulls0 = world.ipc_pool_pulls;
    if (step == 3 && pulls) RFAIL(r, "step 3 (registered again): %ld messages through staging", pulls);
    host->ops->allreduce_max_u64(host, &v, 1, INT64_MAX);
  }
  if (r->wrong) RFAIL(r, "%lld wrong bytes", (long long)r->wrong);
}
static world_case registered_buffers_go_direct = {.n = 3, .body = direct_body, .timeout_ms = 5000};

/* An execute of a registered plan with other buffers is refused (its
 * partners would read the registered ones): INVALID_ARGUMENT naming the
 * buffer, nothing written, and the partner learns of it (REMOTE). */
static void other_buffers_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p) {
  (void)host;
  if (reshard_selftest_alloc(&p->s, p->src, r->rank, 0)) RFAIL(r, "selftest alloc");
  if (!r->failed && reshard_plan_register_buffers(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf,
                                                  (void *const *)p->d.ptr, (size_t)p->d.nbuf))
    RFAIL(r, "register: %s", reshard_last_error());
  if (r->failed) return;
  if (r->rank == 0) {
    reshard_selftest_t other;
    if (reshard_selftest_alloc(&other, p->src, r->rank, 0)) {
      RFAIL(r, "selftest alloc");
      return;
    }
    reshard_result_t e = reshard_plan_execute(p->plan, (void *const *)other.ptr, (size_t)other.nbuf,
                                              (void *const *)p->d.ptr, (size_t)p->d.nbuf, NULL);
    if (e != RESHARD_ERROR_INVALID_ARGUMENT || !strstr(reshard_last_error(), "registered"))
      RFAIL(r, "execute with other buffers gave %s: %s", reshard_result_string(e), reshard_last_error());
    reshard_selftest_free(&other);
  } else {
    if (reshard_plan_execute(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf, (void *const *)p->d.ptr,
                             (size_t)p->d.nbuf, NULL))
      RFAIL(r, "execute: %s", reshard_last_error());
    reshard_plan_status_t st = wait_failed(p->plan, 3000);
    if (!st.failed || st.failure != RESHARD_ERROR_REMOTE)
      RFAIL(r, "partner: failed %d, %s", st.failed, reshard_result_string(st.failure));
  }
  if (changed_bytes(p)) RFAIL(r, "%ld destination bytes written", changed_bytes(p));
}
static world_case registered_plan_refuses_other_buffers = {.n = 2, .body = other_buffers_body, .timeout_ms = 5000};

/* Registration is a call of the plan like execute: while rank 0's
 * register_buffers waits in its exchange for rank 1 (which comes 400 ms
 * later), an execute of the plan from another thread of rank 0 is
 * refused (INVALID_USAGE, "must not overlap") and writes nothing; the
 * registration then completes and the plan runs direct. */
typedef struct reg_job {
  ipc_plan *p;
  int rank, n, own_thread;
  reshard_result_t r;
  char why[256];
  long mem, streams, events; /* what the thread's emulated device holds at its end */
} reg_job;

static void *register_thread(void *arg) {
  reg_job *j = arg;
  if (j->own_thread) mock_reset(j->rank, j->n); /* this thread is of the rank's process */
  j->r = reshard_plan_register_buffers(j->p->plan, (void *const *)j->p->s.ptr, (size_t)j->p->s.nbuf,
                                       (void *const *)j->p->d.ptr, (size_t)j->p->d.nbuf);
  snprintf(j->why, sizeof j->why, "%s", reshard_last_error());
  if (j->own_thread) j->mem = M.mem, j->streams = M.streams, j->events = M.events;
  return NULL;
}

static void register_overlap_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p) {
  (void)host;
  if (reshard_selftest_alloc(&p->s, p->src, r->rank, 0)) {
    RFAIL(r, "selftest alloc");
    return;
  }
  reg_job j = {p, r->rank, r->n, r->rank == 0, RESHARD_SUCCESS, "", 0, 0, 0};
  if (r->rank == 1) {
    struct timespec ts = {0, 400 * 1000 * 1000};
    nanosleep(&ts, NULL);
    register_thread(&j);
  } else {
    pthread_t th;
    pthread_create(&th, NULL, register_thread, &j);
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL); /* the registration is inside, waiting for rank 1 */
    reshard_result_t e = reshard_plan_execute(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf,
                                              (void *const *)p->d.ptr, (size_t)p->d.nbuf, NULL);
    if (e != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "must not overlap"))
      RFAIL(r, "an execute during the registration gave %s: %s", reshard_result_string(e), reshard_last_error());
    if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    if (changed_bytes(p)) RFAIL(r, "the refused execute wrote %ld destination bytes", changed_bytes(p));
    pthread_join(th, NULL);
    /* what the registration allocated is the rank's, freed with its plan */
    M.mem += j.mem, M.streams += j.streams, M.events += j.events;
  }
  if (j.r) RFAIL(r, "register: %s", j.why);
  if (r->failed) return;
  if (reshard_plan_execute(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf, (void *const *)p->d.ptr,
                           (size_t)p->d.nbuf, NULL))
    RFAIL(r, "execute after the registration: %s", reshard_last_error());
  else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
  else r->wrong += reshard_selftest_check(&p->d, p->dst, r->rank, 0, "registered after the overlap");
  if (r->wrong) RFAIL(r, "%lld wrong bytes", (long long)r->wrong);
}
static world_case register_overlap_refused = {.n = 2, .body = register_overlap_body, .timeout_ms = 5000};

/* Registration on a transport that cannot map peers' buffers: refused,
 * UNSUPPORTED, on every rank, and execute still works. */
static void register_unsupported_on_nccl_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p) {
  (void)host;
  if (reshard_plan_register_buffers(p->plan, NULL, 0, NULL, 0) != RESHARD_ERROR_UNSUPPORTED ||
      !strstr(reshard_last_error(), "nccl"))
    RFAIL(r, "register on NCCL: %s", reshard_last_error());
  if (run_plan(p, r->rank, 0)) RFAIL(r, "execute: %s", reshard_last_error());
  else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
  else r->wrong += reshard_selftest_check(&p->d, p->dst, r->rank, 0, "nccl after refusal");
}
static world_case register_unsupported_on_nccl = {.n = 2, .body = register_unsupported_on_nccl_body, .timeout_ms = 5000,
                                                  .nccl = 1};

/* Plans of growing staging on one communicator: each plan creation
 * re-exchanges the pools that grew (a peer's old mapping is closed), and
 * the older plan keeps working on the new pool. */
static void regrow_rank(ipc_rank *r) {
  reshard_comm_t *host, *c = open_ipc(r, &host);
  if (!c) return;
  ipc_plan a, b;
  if (make_plan(c, &a, r->n, 64, 4096, 5000, r->rank)) RFAIL(r, "plan a: %s", reshard_last_error());
  if (!r->failed && run_plan(&a, r->rank, 0)) RFAIL(r, "execute a: %s", reshard_last_error());
  if (!r->failed && make_plan(c, &b, r->n, 96, 1 << 16, 5000, r->rank)) RFAIL(r, "plan b: %s", reshard_last_error());
  for (int step = 1; step < 4 && !r->failed; step++) {
    ipc_plan *p = step % 2 ? &b : &a;
    if (run_plan(p, r->rank, step)) RFAIL(r, "execute: %s", reshard_last_error());
    else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    else r->wrong += reshard_selftest_check(&p->d, p->dst, r->rank, (uint64_t)step, "regrow");
  }
  if (r->wrong) RFAIL(r, "%lld wrong elements", (long long)r->wrong);
  free_plan(&a);
  free_plan(&b);
  close_ipc(c, host);
}
static world_case pools_regrow = {.n = 4, .fn = regrow_rank};

/* A rank that never runs its execute: its partners' waits on the GPU
 * give up at the plan's timeout (no host wait anywhere), the agreement's
 * gate closes before any unpack, so no destination byte is written, and
 * reshard_plan_get_status reports TIMEOUT naming the absent rank (or
 * REMOTE, when the other partner's poison came first). */
static void absent_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p) {
  (void)host;
  if (r->rank == 2) return;
  int64_t t0 = ms_now();
  if (run_plan(p, r->rank, 0)) RFAIL(r, "execute: %s", reshard_last_error());
  reshard_plan_status_t st = wait_failed(p->plan, 3000);
  int64_t dt = ms_now() - t0;
  /* TIMEOUT, or REMOTE when the other waiting rank timed out first and
   * its poison reached this one */
  if (!st.failed || (st.failure != RESHARD_ERROR_TIMEOUT && st.failure != RESHARD_ERROR_REMOTE))
    RFAIL(r, "status: failed %d, %s (%s)", st.failed, reshard_result_string(st.failure), st.failure_message);
  else if (!strstr(st.failure_message, "rank 2"))
    RFAIL(r, "the message does not name rank 2: %s", st.failure_message);
  if (dt > 2000) RFAIL(r, "the failure took %lld ms (timeout 300 ms)", (long long)dt);
  long ch = changed_bytes(p);
  if (ch) RFAIL(r, "%ld destination bytes written", ch);
  if (reshard_plan_execute(p->plan, (void *const *)p->s.ptr, (size_t)p->s.nbuf, (void *const *)p->d.ptr,
                           (size_t)p->d.nbuf, NULL) == RESHARD_SUCCESS)
    RFAIL(r, "the failed plan executed again");
}
static world_case absent_partner_times_out = {.n = 3, .body = absent_body, .timeout_ms = 300};

/* A rank's execute is refused (the wrong current device): it poisons the
 * communicator, on its peers too (their windows' abort words), so their
 * waits give up long before their 10 s timeout, with REMOTE. */
static void refused_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p) {
  (void)host;
  if (r->rank == 1) {
    M.device = 1;
    reshard_result_t e = run_plan(p, r->rank, 0);
    if (e != RESHARD_ERROR_INVALID_USAGE) RFAIL(r, "execute gave %s", reshard_result_string(e));
    M.device = 0;
    return;
  }
  int64_t t0 = ms_now();
  if (run_plan(p, r->rank, 0)) RFAIL(r, "execute: %s", reshard_last_error());
  reshard_plan_status_t st = wait_failed(p->plan, 5000);
  int64_t dt = ms_now() - t0;
  if (!st.failed || st.failure != RESHARD_ERROR_REMOTE)
    RFAIL(r, "status: failed %d, %s (%s)", st.failed, reshard_result_string(st.failure), st.failure_message);
  if (dt > 3000) RFAIL(r, "the failure took %lld ms: the poison did not reach this rank", (long long)dt);
  long ch = changed_bytes(p);
  if (ch) RFAIL(r, "%ld destination bytes written", ch);
}
static world_case poison_reaches_partners = {.n = 3, .body = refused_body, .timeout_ms = 10000};

/* A rank one weight version ahead: the agreement on the device fails on
 * its partners (MISMATCH naming both versions), nothing is written. */
static void version_body(ipc_rank *r, reshard_comm_t *host, ipc_plan *p) {
  (void)host;
  if (r->rank == 1) M.tamper_version = 1;
  if (run_plan(p, r->rank, 0)) RFAIL(r, "execute: %s", reshard_last_error());
  reshard_plan_status_t st = wait_failed(p->plan, 3000);
  if (!st.failed || (st.failure != RESHARD_ERROR_MISMATCH && st.failure != RESHARD_ERROR_REMOTE))
    RFAIL(r, "status: failed %d, %s (%s)", st.failed, reshard_result_string(st.failure), st.failure_message);
  long ch = changed_bytes(p);
  if (ch) RFAIL(r, "%ld destination bytes written", ch);
}
static world_case version_mismatch_writes_nothing = {.n = 3, .body = version_body, .timeout_ms = 5000};

/* A rank cannot map a peer's window: creation fails on every rank
 * (BACKEND naming the peer there, REMOTE elsewhere), nothing leaks, no
 * mapping stays open. */
static void open_fail_rank(ipc_rank *r) {
  reshard_comm_t *host = NULL, *c = NULL;
  if (reshard_comm_create_inproc(r->host_world, r->rank, &host)) {
    RFAIL(r, "inproc: %s", reshard_last_error());
    return;
  }
  if (r->rank == 2) M.fail_ipc_open = 1;
  reshard_result_t e = reshard_comm_create_cuda_ipc(host, &c);
  reshard_result_t want = r->rank == 2 ? RESHARD_ERROR_BACKEND : RESHARD_ERROR_REMOTE;
  if (e != want || c) RFAIL(r, "create gave %s (%s)", reshard_result_string(e), reshard_last_error());
  if (r->rank == 2 && !strstr(reshard_last_error(), "cudaIpcOpenMemHandle"))
    RFAIL(r, "the message does not say what failed: %s", reshard_last_error());
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}
static world_case map_failure_fails_creation = {.n = 3, .fn = open_fail_rank};

/* RESHARD_FLAG_DOUBLE_BUFFER on the device (issue 17, item 5), over
 * either device transport: each execute writes the inactive copy and the
 * GPU flips the copies only when every rank's verdict was good (a
 * one-word reduction); reshard_plan_get_status reports the commit once
 * the GPU made it. A rank one version ahead at step 4 fails the call on
 * every rank: nobody commits, the active copy keeps step 3 byte for byte
 * and the committed version stays 4. */
static void dbuf_rank(ipc_rank *r) {
  int nccl = *(const int *)r->ctx;
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, nccl, &host))) return;
  mw_double_buffer(r, c);
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

static void double_buffer_on_device(void **state) {
  (void)state;
  int ipc = 0, nccl = 1;
  run_world(3, dbuf_rank, &ipc);
  run_world(3, dbuf_rank, &nccl);
}

/* The commit's vote (kernels/rs_agree.h, the host's too) carries each
 * rank's call and version: a rank out of step that no partner's header
 * can catch (rank 2 copies only locally, its data its own) makes the
 * call commit nowhere. Ranks 0 and 1 exchange a tensor, rank 2 holds
 * another on both sides; at step 1 rank 2 passes version 7, the others
 * 2: every rank reports MISMATCH ("different executes" where the vote
 * found it), the active copy keeps step 0 byte for byte and the
 * committed version stays 1. Before, rank 2 flipped alone. And the vote's
 * failure word: when rank 1 passes version 7 instead, ranks 0 and 1 fail
 * their agreement, and rank 2, which has no partner to tell it, fails
 * with REMOTE (it used to keep its plan silently uncommitted). */
typedef struct apart_ctx {
  int nccl;
  int odd; /* the rank at another version */
} apart_ctx;

static void apart_rank(ipc_rank *r) {
  const apart_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, x->nccl, &host))) return;
  mw_commit_apart(r, c, x->odd);
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

static void commit_vote_catches_ranks_apart(void **state) {
  (void)state;
  for (int odd = 1; odd <= 2; odd++)
    for (int nccl = 0; nccl < 2; nccl++) {
      apart_ctx x = {nccl, odd};
      run_world(3, apart_rank, &x);
    }
}

/* Bad arguments: no host communicator, a device communicator as host. */
/* ------------------------------------------------------------ fp8 blocks */

/* Block quantization on the device (issue 19): a bf16 / f16 / f32 source
 * weight arrives as fp8 codes plus f32 block scales, quantized by the
 * kernel's code (pack/quant_block.h, 256 emulated threads a block) at the
 * start of the main plan's execute, after a pre-plan that gathers blocks
 * split across source ranks. Every code and scale is checked against the
 * self-test's reference quantizer, every other byte as usual. */
typedef struct quant_ctx {
  reshard_layout_t *src, *dst;
  int nccl;
  size_t staging;
  int tamper; /* rank 1 runs one version ahead at step 1: 1 in both
                 plans, 2 in the pre-plan only (gathering blocks) */
  int named_pre; /* ranks whose failure names the pre-plan */
  int had_pre;   /* ranks whose plan has a pre-plan */
  int registered; /* IPC: reshard_plan_register_buffers, direct copies */
} quant_ctx;

static void quant_rank(ipc_rank *r) {
  const quant_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, x->nccl, &host))) return;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = x->staging;
  o.timeout_ms = x->tamper ? 3000 : 20000;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(c, x->src, x->dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    close_ipc(c, host);
    return;
  }
  reshard_selftest_t s = {0}, d;
  if (reshard_selftest_alloc(&d, x->dst, r->rank, -1)) RFAIL(r, "selftest alloc");
  /* NCCL maps no peer memory; IPC unregisters (nothing registered) */
  if (reshard_plan_register_buffers(plan, NULL, 0, NULL, 0) != (x->nccl ? RESHARD_ERROR_UNSUPPORTED : 0))
    RFAIL(r, "unregistering a quantizing plan: %s", reshard_last_error());
  if (x->registered) {
    /* one set of sources, registered with the destinations (the scratch
     * and the gathering plan's with them), refilled every step */
    if (reshard_selftest_alloc(&s, x->src, r->rank, 0)) RFAIL(r, "selftest alloc");
    else if (reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                           (size_t)d.nbuf))
      RFAIL(r, "register_buffers: %s", reshard_last_error());
  }
  for (int step = 0; step < 3 && !r->failed; step++) {
    if (x->registered) {
      reshard_selftest_fill(&s, x->src, (uint64_t)step);
    } else if (reshard_selftest_alloc(&s, x->src, r->rank, step)) {
      RFAIL(r, "selftest alloc");
      break;
    }
    unsigned char **before = NULL;
    /* (every rank has a pre-plan, or none: it is created collectively) */
    const reshard_plan_t *pre = plan->quant ? plan->quant->pre : NULL;
    if (x->tamper && step == 1 && (x->tamper == 1 || pre)) {
      /* the destination as step 0 left it: step 1 must leave it so */
      before = calloc((size_t)d.nbuf + 1, sizeof *before);
      for (int b = 0; b < d.nbuf; b++)
        if (d.ptr[b]) before[b] = malloc(d.bytes[b]), memcpy(before[b], d.ptr[b], d.bytes[b]);
      if (pre) __atomic_fetch_add(&((quant_ctx *)r->ctx)->had_pre, 1, __ATOMIC_RELAXED);
      if (r->rank == 1) {
        M.tamper_version = 1;
        M.tamper_digest = x->tamper == 2 ? pre->digest : 0;
      }
    }
    reshard_result_t e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                              (size_t)d.nbuf, NULL);
    if (before) {
      /* every rank with partners fails (MISMATCH, or REMOTE: poisoned);
       * nothing of the call is written anywhere */
      /* polled without draining the stream: on NCCL a rank whose
       * partners aborted waits until its deadline (3 s), then fails */
      reshard_plan_status_t st = {.struct_size = sizeof st};
      for (int64_t t0 = ms_now(); ms_now() - t0 < 6000;) {
        reshard_plan_get_status(plan, &st);
        if (st.failed) break;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
      }
      long ch = 0;
      for (int b = 0; b < d.nbuf; b++)
        for (size_t i = 0; d.ptr[b] && i < d.bytes[b]; i++) ch += d.ptr[b][i] != before[b][i];
      /* A rank writes the call whole or not at all (its gate is its own):
       * nothing where a partner's header differed or, in a plan with a
       * pre-plan (whose verdict every rank reduces), anywhere; elsewhere
       * either nothing, or the call's data exactly (its partners agreed
       * with it and packed their current data; a stale staging half
       * would be neither). */
      if (ch && (pre || reshard_selftest_check_from(&d, x->dst, x->src, r->rank, 1, "fp8 on device, step 1")))
        RFAIL(r, "%ld destination bytes changed by a call that failed its agreement%s (e=%d status %d %s; step-1 data %s)", ch,
              pre ? "" : ", and not to the call's data", e, st.failed, st.failure_message,
              reshard_selftest_check_from(&d, x->dst, x->src, r->rank, 1, "dbg") ? "no" : "yes");
      /* the rank out of step fails wherever it has partners (in the
       * pre-plan only: where that has); others may succeed with the
       * call's data (checked above) */
      const reshard_plan_t *tp = x->tamper == 2 ? pre : plan;
      if (r->rank == 1 && !e && !st.failed && tp->npeers)
        RFAIL(r, "the mismatched call did not fail");
      if (st.failed && st.failure != RESHARD_ERROR_MISMATCH && st.failure != RESHARD_ERROR_REMOTE &&
          st.failure != RESHARD_ERROR_TIMEOUT)
        RFAIL(r, "status: %s (%s)", reshard_result_string(st.failure), st.failure_message);
      /* a rank whose pre-plan failed says so (counted: not every rank
       * has partners in the pre-plan) */
      if (st.failed && strstr(st.failure_message, "gathering fp8 blocks"))
        __atomic_fetch_add(&((quant_ctx *)r->ctx)->named_pre, 1, __ATOMIC_RELAXED);
      for (int b = 0; b < d.nbuf; b++) free(before[b]);
      free(before);
      reshard_selftest_free(&s);
      break;
    }
    if (e) RFAIL(r, "execute: %s", reshard_last_error());
    else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    else if ((r->wrong += reshard_selftest_check_from(&d, x->dst, x->src, r->rank, (uint64_t)step, "fp8 on device")))
      RFAIL(r, "step %d: %lld wrong", step, (long long)r->wrong);
    reshard_plan_status_t st = {.struct_size = sizeof st};
    reshard_plan_get_status(plan, &st);
    if (st.failed) RFAIL(r, "status: %s", st.failure_message);
    if (!x->registered) reshard_selftest_free(&s);
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  close_ipc(c, host);
}

static void quant_worlds(void **state) {
  (void)state;
  int registered_worlds_run = 0;
  /* RS_QUANT_SEED0 replays (seed = seed0 + it); RS_QUANT_VERBOSE lists
   * the worlds */
  const char *e0 = getenv("RS_QUANT_SEED0");
  uint64_t seed0 = e0 ? strtoull(e0, NULL, 10) : (uint64_t)time(NULL);
  for (int it = 0; it < 40; it++) {
    uint64_t seed = seed0 + (uint64_t)it;
    /* IPC worlds alternate staged and registered */
    quant_ctx x = {NULL, NULL, it % 2, it % 3 == 0 ? 4096 : (size_t)1 << 20, 0, 0, 0, it % 4 == 2};
    int n = 2 + (int)(seed % 4);
    mw_quant_pair(seed, n, &x.src, &x.dst);
    if (getenv("RS_QUANT_VERBOSE"))
      print_message("seed %llu: %d ranks over %s\n", (unsigned long long)seed, n, x.nccl ? "NCCL" : "CUDA IPC");
    snprintf(world_label, sizeof world_label, "seed %llu (RS_QUANT_SEED0 replays it), %d ranks over %s%s: ",
             (unsigned long long)seed, n, x.nccl ? "NCCL" : "CUDA IPC", x.registered ? ", registered" : "");
    run_world(n, quant_rank, &x);
    world_label[0] = '\0';
    /* registered: both plans copy straight from the partners' buffers
     * and scratch, nothing through a staging pool */
    if (x.registered && world.ipc_pool_pulls)
      fail_msg("seed %llu, registered: %ld messages pulled from staging pools", (unsigned long long)seed,
               world.ipc_pool_pulls);
    registered_worlds_run += x.registered;
    reshard_layout_destroy(x.src);
    reshard_layout_destroy(x.dst);
  }
  assert_true(registered_worlds_run >= 5);
}

/* A rank one version ahead at the second execute of a quantizing plan,
 * in both plans or in its pre-plan only (so that only the ranks gathering
 * blocks with it see the difference, and the main plan's partners must
 * learn it from the verdict every rank reduces): every rank's status
 * fails and no destination byte of that call is written on any rank. */
static void quant_mismatch_writes_nothing(void **state) {
  (void)state;
  int pre_only_worlds = 0;
  for (int tamper = 1; tamper <= 2; tamper++)
    for (uint64_t seed = 11; seed < 17; seed++)
      for (int nccl = 0; nccl < 2; nccl++) {
        quant_ctx x = {NULL, NULL, nccl, (size_t)1 << 20, tamper, 0, 0, 0};
        const int n = 3 + (int)(seed % 3);
        mw_quant_pair(seed, n, &x.src, &x.dst);
        snprintf(world_label, sizeof world_label, "seed %llu, %d ranks over %s, tamper %d: ",
                 (unsigned long long)seed, n, nccl ? "NCCL" : "CUDA IPC", tamper);
        run_world(n, quant_rank, &x);
        world_label[0] = '\0';
        if (tamper == 1 && x.had_pre) assert_true(x.named_pre > 0);
        pre_only_worlds += tamper == 2 && x.had_pre;
        reshard_layout_destroy(x.src);
        reshard_layout_destroy(x.dst);
      }
  print_message("worlds where only the pre-plan disagreed: %d\n", pre_only_worlds);
  assert_true(pre_only_worlds >= 4);
}

static void bad_arguments(void **state) {
  (void)state;
  mock_reset(0, 1);
  reshard_comm_t *c = (reshard_comm_t *)0x1;
  assert_int_equal(reshard_comm_create_cuda_ipc(NULL, &c), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(c);
  assert_int_equal(reshard_comm_create_cuda_ipc(NULL, NULL), RESHARD_ERROR_INVALID_ARGUMENT);
  reshard_inproc_world_t *hw = NULL;
  reshard_comm_t *host = NULL, *ipc = NULL, *again = NULL;
  assert_int_equal(reshard_inproc_world_create(1, &hw), 0);
  assert_int_equal(reshard_comm_create_inproc(hw, 0, &host), 0);
  assert_int_equal(reshard_comm_create_cuda_ipc(host, &ipc), 0);
  assert_int_equal(reshard_comm_create_cuda_ipc(ipc, &again), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "cuda_ipc"));
  reshard_comm_destroy(ipc);
  reshard_comm_destroy(host);
  reshard_inproc_world_destroy(hw);
  assert_int_equal(M.mem, 0);
}

/* A case of a runner as a test named after the case (its state). */
#define WORLD_TEST(c) {#c, world_test, NULL, NULL, &c}
#define WORLDS_TEST(c) {#c, worlds_test, NULL, NULL, &c}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_arguments),
      WORLD_TEST(map_failure_fails_creation),
      WORLD_TEST(pools_regrow),
      WORLD_TEST(absent_partner_times_out),
      WORLD_TEST(poison_reaches_partners),
      WORLD_TEST(version_mismatch_writes_nothing),
      cmocka_unit_test(double_buffer_on_device),
      cmocka_unit_test(commit_vote_catches_ranks_apart),
      WORLDS_TEST(random_worlds),
      WORLD_TEST(registered_buffers_go_direct),
      WORLD_TEST(registered_plan_refuses_other_buffers),
      WORLD_TEST(register_overlap_refused),
      WORLD_TEST(register_unsupported_on_nccl),
      WORLDS_TEST(registered_random_worlds),
      WORLDS_TEST(registered_cast_worlds),
      WORLDS_TEST(registered_verify_worlds),
      WORLDS_TEST(verify_random_worlds),
      cmocka_unit_test(verify_catches_corruption),
      cmocka_unit_test(quant_worlds),
      cmocka_unit_test(quant_mismatch_writes_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
