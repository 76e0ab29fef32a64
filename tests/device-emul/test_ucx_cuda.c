/* GPU memory over UCX (src/transport/ucx_cuda.c, issue 46) against the
 * emulated device (mock_device.h): ranks as threads, each with a real UCX
 * communicator (Debian's libucx, shared memory between the threads' UCP
 * workers) under a UCX (CUDA) communicator, whose groups wait for the
 * emulated streams and move the staging pool's "device" memory with UCP
 * tagged messages.
 *
 * Every test runs twice (main):
 * - UCX moving the device memory itself: the capability the transport
 *   asks UCX for (the memory type it declares on every message) is
 *   answered by a wrap of rs_ux_device_memtype (tests.cmake) with host
 *   memory, which the emulated device's is and Debian's UCX moves; a
 *   stand-in, as the whole emulated device is (the real CUDA path runs in
 *   scripts/gpu_check.sh with a CUDA-enabled UCX);
 * - the real query: Debian's UCX moves no CUDA memory, so every message
 *   goes through pinned host memory (the pools' mirrors and the arena),
 *   copied from the device after the packs and back before the unpacks:
 *   the path a user of a UCX without CUDA takes, as it is.
 *
 * UCX's registrations and tagged messages are wrapped too: after every
 * world (its host communicators destroyed) no registration is left, every
 * message that named one lay inside it, and every message inside one
 * named it (a staging pool is registered when it is allocated, ucx_cuda.c
 * region); random_worlds and pool_growth check that some did.
 *
 * Every test that moves data checks every destination element against the
 * self-test's values from global coordinates and every byte outside
 * destination fragments (reshard_selftest_check_from); no test may hang
 * (the emulation cuts a host wait that could never end, and every UCX
 * wait has the plan's deadline).
 *
 * random_worlds: random layout pairs (relays, staging sizes, a topology,
 *   RESHARD_FLAG_VERIFY: two messages a pair and round), two versions
 *   each, byte for byte, the odd ranks' kernels taking 2 ms
 *   of emulated GPU time (a group must wait for its round's packs).
 * absent_partner_times_out: a rank that never executes: its partners'
 *   executes end by the deadline with TIMEOUT, no destination byte
 *   written, and the communicator refuses a new plan; a new communicator
 *   over the same host then moves a version whole.
 * absent_partner_pins_its_pool: the same with the failed transfers
 *   reported still running (rs_ux_settle wrapped): the pool is kept, and
 *   the host's destroy releases its registration (no ucp_cleanup abort).
 * two_communicators_over_one_host: plans on two communicators over one
 *   host, executed in the same order on both ranks (both versions whole)
 *   and in opposite orders (TIMEOUT, nothing written: never each other's
 *   data).
 * double_buffer: the double-buffered commit (its vote is the
 *   communicator's reduction of five words), a rank out of step at the
 *   last version: nothing commits (mw_double_buffer); a rank apart that
 *   only the vote can tell (mw_commit_apart).
 * pool_growth: a second plan of a larger staging budget grows the
 *   communicator's pool (a bounce's mirror replaced with it); both plans
 *   then move their versions whole, alternating.
 * arena_growth: groups of the transport itself (its stream ops) moving
 *   device buffers that are not a staging pool, two groups posted before
 *   either is settled: in the bounce, their host bytes come from the
 *   arena, which grows (to 512 KiB within the first group, to 1 MiB for
 *   the second while the first group's messages still use the arenas
 *   outgrown); every byte checked, then a third group once nothing is
 *   pending (the outgrown arenas freed).
 * refusals: registered buffers (UNSUPPORTED: staging only) and an
 *   execute in a CUDA graph capture (UNSUPPORTED, nothing enqueued), after
 *   which a whole version moves; the wrong device; a host communicator
 *   that is not UCX. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>

#include <cuda_runtime.h>

#include "common/clock.h"
#include "device-emul/mock_device.h"
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
/* what a pinned pool keeps is leaked by design: not LeakSanitizer's finding */
#define KEPT_BY_DESIGN_BEGIN() __lsan_disable()
#define KEPT_BY_DESIGN_END() __lsan_enable()
#else
#define KEPT_BY_DESIGN_BEGIN() ((void)0)
#define KEPT_BY_DESIGN_END() ((void)0)
#endif
#include "device-emul/mock_world.h"
#include "plan/relay.h"
#include "reshard.h"
#include "reshard_inproc.h"
#include "reshard_selftest.h"
#include "reshard_ucx.h"
#include "support/random_layout.h"
#include "transport/stream.h"
#include "transport/transport.h"

/* The capability query (ucx.c), wrapped: the emulated device's memory is
 * host memory (UCS_MEMORY_TYPE_HOST, 0); moves_cuda 0 asks the real one
 * (Debian's UCX: none, so the transport bounces through host memory). */
static int moves_cuda = 1;
static int real_answer = -2; /* the real query's last answer (-2: not asked) */
int __real_rs_ux_device_memtype(const reshard_comm_t *c);
int __wrap_rs_ux_device_memtype(const reshard_comm_t *c) {
  if (moves_cuda) return (int)UCS_MEMORY_TYPE_HOST;
  int a = __real_rs_ux_device_memtype(c);
  __atomic_store_n(&real_answer, a, __ATOMIC_RELAXED);
  return a;
}

/* UCX's registrations and messages, wrapped (tests.cmake): every staging
 * pool is registered once (rs_ux_mem_map) and released before it is
 * freed, and a message that names a registration (UCP_OP_ATTR_FIELD_MEMH)
 * lies inside a live one. */
typedef struct live_reg {
  void *h;
  const unsigned char *addr;
  size_t len;
} live_reg;
static live_reg regs[1024];
static int nregs, regs_overflow;
/* messages that named a registration, named one not holding them, named
 * none while inside one (a pool's message without its registration) */
static long msgs_with_memh, msgs_bad_memh, msgs_missed_memh;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
ucs_status_t __real_ucp_mem_map(ucp_context_h ctx, const ucp_mem_map_params_t *p, ucp_mem_h *h);
ucs_status_t __wrap_ucp_mem_map(ucp_context_h ctx, const ucp_mem_map_params_t *p, ucp_mem_h *h) {
  ucs_status_t s = __real_ucp_mem_map(ctx, p, h);
  pthread_mutex_lock(&reg_mu);
  if (s == UCS_OK && nregs < 1024) regs[nregs++] = (live_reg){*h, p->address, p->length};
  else if (s == UCS_OK) regs_overflow = 1;
  pthread_mutex_unlock(&reg_mu);
  return s;
}
ucs_status_t __real_ucp_mem_unmap(ucp_context_h ctx, ucp_mem_h h);
ucs_status_t __wrap_ucp_mem_unmap(ucp_context_h ctx, ucp_mem_h h) {
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nregs; i++)
    if (regs[i].h == h) {
      regs[i] = regs[--nregs];
      break;
    }
  pthread_mutex_unlock(&reg_mu);
  return __real_ucp_mem_unmap(ctx, h);
}
static void note_memh(const void *buf, size_t len, const ucp_request_param_t *p) {
  const unsigned char *b = buf;
  const int named = (p->op_attr_mask & UCP_OP_ATTR_FIELD_MEMH) != 0;
  int ok = 0, inside = 0;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nregs; i++) {
    const int in = len && b >= regs[i].addr && b + len <= regs[i].addr + regs[i].len;
    inside |= in;
    ok |= named && in && regs[i].h == p->memh;
  }
  msgs_with_memh += named;
  msgs_bad_memh += named && !ok;
  msgs_missed_memh += !named && inside;
  pthread_mutex_unlock(&reg_mu);
}
ucs_status_ptr_t __real_ucp_tag_send_nbx(ucp_ep_h ep, const void *buf, size_t count, ucp_tag_t tag,
                                         const ucp_request_param_t *p);
ucs_status_ptr_t __wrap_ucp_tag_send_nbx(ucp_ep_h ep, const void *buf, size_t count, ucp_tag_t tag,
                                         const ucp_request_param_t *p) {
  note_memh(buf, count, p);
  return __real_ucp_tag_send_nbx(ep, buf, count, tag, p);
}
ucs_status_ptr_t __real_ucp_tag_recv_nbx(ucp_worker_h w, void *buf, size_t count, ucp_tag_t tag, ucp_tag_t mask,
                                         const ucp_request_param_t *p);
ucs_status_ptr_t __wrap_ucp_tag_recv_nbx(ucp_worker_h w, void *buf, size_t count, ucp_tag_t tag, ucp_tag_t mask,
                                         const ucp_request_param_t *p) {
  note_memh(buf, count, p);
  return __real_ucp_tag_recv_nbx(w, buf, count, tag, mask, p);
}

/* After a world (its host communicators destroyed: they release what a
 * pinned pool kept): no registration left, no message named a dead or
 * wrong one, none inside one named none; returns the messages that named
 * one. */
static long registrations_balanced(const char *what) {
  pthread_mutex_lock(&reg_mu);
  const int left = nregs, over = regs_overflow;
  const long with = msgs_with_memh, bad = msgs_bad_memh, missed = msgs_missed_memh;
  nregs = regs_overflow = 0; /* (a failure here does not fail the tests after it) */
  msgs_with_memh = msgs_bad_memh = msgs_missed_memh = 0;
  pthread_mutex_unlock(&reg_mu);
  if (left || bad || missed || over)
    fail_msg("%s%d UCX registrations left%s, %ld messages named a registration not holding them, %ld inside "
             "one named none", what, left, over ? " (over 1024 at once)" : "", bad, missed);
  return with;
}

/* The end of a failed call's transfers (ucx.c rs_ux_settle), wrapped:
 * with settle_claims_running, each still ends (the real one runs) but is
 * reported as still running after its grace second, as a rendezvous
 * transfer with a live peer can be: the transport then pins its pool. */
static int settle_claims_running;
int __real_rs_ux_settle(reshard_comm_t *c, rs_request *r, int64_t deadline);
int __wrap_rs_ux_settle(reshard_comm_t *c, rs_request *r, int64_t deadline) {
  int ended = __real_rs_ux_settle(c, r, deadline);
  return __atomic_load_n(&settle_claims_running, __ATOMIC_RELAXED) ? 0 : ended;
}

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A free TCP port of the loopback for a world's rendezvous, below the
 * ephemeral range (as tests/support/free_port.py picks: a port the
 * kernel's bind-to-0 hands out may become another socket's source port,
 * a UCX worker's own listener included, before rank 0 binds it again). */
static char rendezvous[64];
static void new_rendezvous(void) {
  static unsigned seed;
  if (!seed) seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  for (int tries = 0; tries < 200; tries++) {
    int port = 10000 + (int)(rand_r(&seed) % 22000u);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_true(fd >= 0);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) {
      snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", port);
      return;
    }
  }
  fail_msg("no free port below the ephemeral range");
}

/* This rank's UCX host communicator and the UCX (CUDA) one over it (NULL
 * after RFAIL). */
static reshard_comm_t *open_comm(mw_rank *r, reshard_comm_t **host) {
  *host = NULL;
  if (reshard_comm_create_ucx(rendezvous, r->rank, r->n, 20000, host)) {
    RFAIL(r, "comm_create_ucx: %s", reshard_last_error());
    return NULL;
  }
  reshard_comm_t *c = NULL;
  if (reshard_comm_create_ucx_cuda(*host, &c)) {
    RFAIL(r, "comm_create_ucx_cuda: %s", reshard_last_error());
    reshard_comm_destroy(*host);
    *host = NULL;
  }
  return c;
}

static void close_comm(reshard_comm_t *c, reshard_comm_t *host) {
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

static char world_label[160];

/* Runs a world: every rank whole, nothing hung, no wrong byte, and its
 * UCX registrations balanced (registrations_balanced, whose count of
 * messages that named one it returns). */
static long run_world(int n, mw_fn fn, void *ctx) {
  mw_rank r[MAXR];
  new_rendezvous();
  mw_outcome o = mw_run(n, 30000, fn, ctx, r);
  for (int i = 0; i < n; i++)
    if (r[i].failed) fail_msg("%srank %d: %s", world_label, i, r[i].why);
  if (o.hangs || o.wrong) fail_msg("%s%ld hangs, %lld wrong bytes", world_label, o.hangs, (long long)o.wrong);
  return registrations_balanced(world_label);
}

/* ------------------------------------------------------------ worlds */

typedef struct rand_ctx {
  const rl_pair *pair;
  size_t staging;
  int relay;
  const char *topology;
  uint32_t flags;
} rand_ctx;

static void random_rank(mw_rank *r) {
  const rand_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, &host))) return;
  /* some ranks' GPUs slow: a pack still running when its round's group
   * is called must be waited for, not sent half written */
  M.kernel_ns = r->rank % 2 ? 2000000 : 0;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = x->staging;
  o.timeout_ms = 20000;
  o.relay = x->relay;
  o.topology = x->topology;
  o.flags = x->flags;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(c, x->pair->src, x->pair->dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    close_comm(c, host);
    return;
  }
  reshard_selftest_t s = {0}, d;
  if (reshard_selftest_alloc(&d, x->pair->dst, r->rank, -1)) RFAIL(r, "selftest alloc");
  for (int step = 0; step < 2 && !r->failed; step++) {
    if (reshard_selftest_alloc(&s, x->pair->src, r->rank, step)) {
      RFAIL(r, "selftest alloc");
      break;
    }
    reshard_result_t e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                              (size_t)d.nbuf, NULL);
    if (e) RFAIL(r, "execute: %s", reshard_last_error());
    else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    else r->wrong += reshard_selftest_check_from(&d, x->pair->dst, x->pair->src, r->rank, (uint64_t)step, "ucx cuda");
    reshard_plan_status_t st = {.struct_size = sizeof st};
    reshard_plan_get_status(plan, &st);
    if (st.failed) RFAIL(r, "status: %s", st.failure_message);
    reshard_selftest_free(&s);
  }
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  close_comm(c, host);
  M.kernel_ns = 0;
}

static void random_worlds(void **state) {
  (void)state;
  /* RS_SEED0, RS_IT0, RS_ITERS replay a failure (seed = seed0 + it * 104729) */
  const char *e0 = getenv("RS_SEED0"), *ei = getenv("RS_ITERS"), *ef = getenv("RS_IT0");
  uint64_t seed0 = e0 ? strtoull(e0, NULL, 10) : (uint64_t)time(NULL);
  int iters = ei ? atoi(ei) : 60, it0 = ef ? atoi(ef) : 0;
  long moved = 0, named = 0;
  for (int it = it0; it < it0 + iters; it++) {
    uint64_t seed = seed0 + (uint64_t)it * 104729;
    rl_pair pair;
    if (rl_pair_make(seed, RL_ANY, &pair)) fail_msg("seed %llu: layout generation failed", (unsigned long long)seed);
    assert_true(pair.nranks <= MAXR);
    int relay = it % 4 == 1 ? 1 : it % 4 == 3 ? -1 : 0;
    rand_ctx x = {&pair, it % 3 == 0 ? (size_t)1 << 20 : it % 3 == 1 ? 4096 : 16384, relay,
                  it % 4 == 3 ? "h100-8x400g" : NULL, it % 3 == 2 ? RESHARD_FLAG_VERIFY : 0};
    rs_relay_min_part_bytes = relay ? 0 : RS_RELAY_MIN_PART_DEFAULT;
    snprintf(world_label, sizeof world_label, "seed %llu (%d ranks, staging %zu, relay %d; replay: RS_SEED0=%llu "
             "RS_IT0=%d RS_ITERS=1): ", (unsigned long long)seed, pair.nranks, x.staging, relay,
             (unsigned long long)seed0, it);
    mw_rank r[MAXR];
    new_rendezvous();
    mw_outcome o = mw_run(pair.nranks, 30000, random_rank, &x, r);
    if (o.wrong || o.failed >= 0 || o.hangs) {
      rl_pair_print(&pair, stderr);
      for (int i = 0; i < pair.nranks; i++)
        if (r[i].failed) fprintf(stderr, "rank %d: %s\n", i, r[i].why);
      fail_msg("%s%lld wrong, %ld hangs%s%s", world_label, (long long)o.wrong, o.hangs,
               o.failed >= 0 ? "; first failed rank: " : "", o.failed >= 0 ? r[o.failed].why : "");
    }
    moved += pair.nranks;
    named += registrations_balanced(world_label);
    rl_pair_free(&pair);
  }
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  printf("random UCX (CUDA) worlds: %d worlds, %ld ranks, %ld messages in registered pools\n", iters, moved, named);
  assert_true(named > 0);
}

/* ------------------------------------------------------------ absent */

/* Three ranks exchanging one tensor; rank 2 creates the plan and never
 * executes it. Then every rank makes a new UCX (CUDA) communicator over
 * the same host communicator and a new plan, and a version moves whole
 * (the failed call's messages to rank 2 may still wait unreceived there;
 * the new communicator's tags are its own: two_communicators_over_one_host
 * shows what a shared tag does). */
typedef struct absent_ctx {
  int pinned; /* settle_claims_running: the first communicator's pool stays */
  long leaked[3]; /* allocations left (the pinned pool), then forgiven */
  int64_t took_ms[3];
  reshard_result_t got[3];
  long changed[3];
  reshard_result_t later[3];
  char later_msg[3][256];
  char got_msg[3][512];
} absent_ctx;

static void absent_rank(mw_rank *r) {
  absent_ctx *x = r->ctx;
  if (x->pinned) KEPT_BY_DESIGN_BEGIN(); /* (this thread's allocations, to the end) */
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, &host))) {
    if (x->pinned) KEPT_BY_DESIGN_END();
    return;
  }
  reshard_layout_t *src, *dst;
  mw_layouts_all(r->n, 64, 32 * (int64_t)r->n, &src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 600;
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s = {0}, d = {0};
  reshard_selftest_alloc(&s, src, r->rank, 1);
  reshard_selftest_alloc(&d, dst, r->rank, -1);
  if (reshard_plan_create(c, src, dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
  } else if (r->rank < 2) {
    unsigned char *before = malloc(d.bytes[0]);
    memcpy(before, d.ptr[0], d.bytes[0]);
    int64_t t0 = ms_now();
    reshard_result_t e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                              (size_t)d.nbuf, NULL);
    mock_stream_drain(NULL);
    reshard_plan_status_t st = {.struct_size = sizeof st};
    reshard_plan_get_status(plan, &st);
    if (!e) e = st.failed ? st.failure : RESHARD_SUCCESS;
    x->took_ms[r->rank] = ms_now() - t0;
    x->got[r->rank] = e;
    snprintf(x->got_msg[r->rank], sizeof x->got_msg[r->rank], "%s", st.failed ? st.failure_message : "");
    for (size_t i = 0; i < d.bytes[0]; i++) x->changed[r->rank] += d.ptr[0][i] != before[i];
    free(before);
    /* the communicator itself refuses now: a new plan on it (no peer is
     * asked: its agreement refuses first) */
    reshard_plan_t *again = NULL;
    x->later[r->rank] = reshard_plan_create(c, src, dst, &o, &again);
    snprintf(x->later_msg[r->rank], sizeof x->later_msg[r->rank], "%s", reshard_last_error());
    reshard_plan_destroy(again);
  } else {
    /* outlive the others' deadline: then go on */
    usleep(1500 * 1000);
  }
  reshard_plan_destroy(plan);
  plan = NULL;
  reshard_comm_destroy(c);
  /* a new communicator over the same host, a new plan, a whole version */
  c = NULL;
  if (!r->failed && reshard_comm_create_ucx_cuda(host, &c)) RFAIL(r, "second communicator: %s", reshard_last_error());
  o.timeout_ms = 5000;
  if (!r->failed && reshard_plan_create(c, src, dst, &o, &plan))
    RFAIL(r, "plan_create on the second communicator: %s", reshard_last_error());
  if (!r->failed) {
    reshard_result_t e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                              (size_t)d.nbuf, NULL);
    if (e) RFAIL(r, "execute on the second communicator: %s", reshard_last_error());
    else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    else r->wrong += reshard_selftest_check_from(&d, dst, src, r->rank, 1, "second communicator");
  }
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  close_comm(c, host);
  if (x->pinned) { /* kept by design (a transfer may still use it): counted, then forgiven */
    x->leaked[r->rank] = M.mem;
    M.mem = 0;
    KEPT_BY_DESIGN_END();
  }
}

static void absent_partner_times_out(void **state) {
  (void)state;
  absent_ctx x;
  memset(&x, 0, sizeof x);
  snprintf(world_label, sizeof world_label, "absent partner: ");
  run_world(3, absent_rank, &x);
  for (int k = 0; k < 2; k++) {
    printf("rank %d: %s after %lld ms; a new plan on the communicator: %d (%s)\n", k,
           x.got[k] == RESHARD_ERROR_TIMEOUT ? "TIMEOUT" : "?", (long long)x.took_ms[k], (int)x.later[k],
           x.later_msg[k]);
    assert_int_equal(x.got[k], RESHARD_ERROR_TIMEOUT);
    /* the plan's failure says why (not what poisoning then cancelled) */
    printf("rank %d: the plan's failure: %s\n", k, x.got_msg[k]);
    assert_non_null(strstr(x.got_msg[k], "did not complete by the plan's deadline"));
    assert_true(x.took_ms[k] < 600 + 1000);
    assert_int_equal(x.changed[k], 0);
    assert_int_equal(x.later[k], RESHARD_ERROR_INVALID_USAGE);
    assert_non_null(strstr(x.later_msg[k], "poisoned"));
  }
}

/* The same absent partner, its partners' transfers reported still running
 * after the grace second (settle_claims_running): each partner's first
 * communicator keeps its staging pool for good (never freed under a
 * transfer: allocations left after its destroy), a second communicator
 * over the same host moves a version whole, and destroying the host
 * releases the kept pool's UCX registration after its worker (no
 * registration left, and no abort in ucp_cleanup, which aborts on one). */
static void absent_partner_pins_its_pool(void **state) {
  (void)state;
  absent_ctx x;
  memset(&x, 0, sizeof x);
  x.pinned = 1;
  snprintf(world_label, sizeof world_label, "absent partner, transfers still running: ");
  __atomic_store_n(&settle_claims_running, 1, __ATOMIC_RELAXED);
  run_world(3, absent_rank, &x);
  __atomic_store_n(&settle_claims_running, 0, __ATOMIC_RELAXED);
  for (int k = 0; k < 2; k++) {
    printf("rank %d: %s; %ld allocations kept\n", k, x.got[k] == RESHARD_ERROR_TIMEOUT ? "TIMEOUT" : "?",
           x.leaked[k]);
    assert_int_equal(x.got[k], RESHARD_ERROR_TIMEOUT);
    assert_int_equal(x.changed[k], 0);
    assert_true(x.leaked[k] > 0);
  }
}

/* ------------------------------------------------------------ two */

/* Two UCX (CUDA) communicators over one host communicator, a plan of the
 * same layouts on each (a version apart). In the same order on both
 * ranks both versions move whole; in opposite orders (rank 0: A then B,
 * rank 1: B then A) each rank's first execute waits for a partner busy in
 * the other communicator's until one times out: what fails writes
 * nothing, what succeeds holds its own version. With one tag for
 * every communicator the opposite orders "succeeded" with each plan's
 * destination holding the other's version. */
typedef struct two_ctx {
  int opposite;
  reshard_result_t got[2][2];
  long wrong_after_fail[2];
} two_ctx;

static void two_rank(mw_rank *r) {
  two_ctx *x = r->ctx;
  reshard_comm_t *host = NULL, *cm[2] = {NULL, NULL};
  if (!(cm[0] = open_comm(r, &host))) return;
  if (reshard_comm_create_ucx_cuda(host, &cm[1])) {
    RFAIL(r, "second communicator: %s", reshard_last_error());
    close_comm(cm[0], host);
    return;
  }
  /* "w" [64, 32] f32 by rows over ranks (0, 1) on the source and (1, 0)
   * on the destination: every byte crosses, no local copy (which a call
   * failing in a later round would already have written) */
  reshard_layout_t *src = NULL, *dst = NULL;
  int64_t shape[2] = {64, 32};
  int n2[1] = {2};
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L = NULL;
    int t, m, b;
    reshard_placement_t rows[1] = {reshard_shard(0)};
    if (reshard_layout_create(&L) || reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, shape, &t) ||
        reshard_layout_add_mesh(L, 1, n2, side ? (int[]){1, 0} : (int[]){0, 1}, &m) ||
        reshard_layout_place(L, t, m, rows, &b))
      RFAIL(r, "layout: %s", reshard_last_error());
    *(side ? &dst : &src) = L;
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = x->opposite ? 500 : 5000;
  reshard_plan_t *plan[2] = {NULL, NULL};
  reshard_selftest_t s[2] = {{0}}, d[2] = {{0}};
  for (int k = 0; k < 2 && !r->failed; k++) {
    if (reshard_plan_create(cm[k], src, dst, &o, &plan[k])) RFAIL(r, "plan_create %d: %s", k, reshard_last_error());
    reshard_selftest_alloc(&s[k], src, r->rank, (uint64_t)(10 + k)); /* plan k moves version 10 + k */
    reshard_selftest_alloc(&d[k], dst, r->rank, -1);
  }
  for (int i = 0; i < 2 && !r->failed; i++) {
    const int k = x->opposite && r->rank == 1 ? 1 - i : i;
    x->got[r->rank][k] = reshard_plan_execute(plan[k], (void *const *)s[k].ptr, (size_t)s[k].nbuf,
                                              (void *const *)d[k].ptr, (size_t)d[k].nbuf, NULL);
    mock_stream_drain(NULL);
    if (!x->got[r->rank][k]) {
      reshard_plan_status_t st = {.struct_size = sizeof st};
      reshard_plan_get_status(plan[k], &st);
      if (st.failed) x->got[r->rank][k] = st.failure;
    }
  }
  for (int k = 0; k < 2 && !r->failed; k++) {
    if (x->got[r->rank][k] == RESHARD_SUCCESS) {
      r->wrong += reshard_selftest_check_from(&d[k], dst, src, r->rank, (uint64_t)(10 + k), "two communicators");
    } else {
      /* nothing written: the destination is as allocated */
      reshard_selftest_t fresh;
      reshard_selftest_alloc(&fresh, dst, r->rank, -1);
      for (int b = 0; b < d[k].nbuf; b++)
        for (size_t j = 0; d[k].ptr[b] && j < d[k].bytes[b]; j++) x->wrong_after_fail[r->rank] += d[k].ptr[b][j] != fresh.ptr[b][j];
      reshard_selftest_free(&fresh);
    }
  }
  for (int k = 0; k < 2; k++) {
    reshard_plan_destroy(plan[k]);
    reshard_selftest_free(&s[k]);
    reshard_selftest_free(&d[k]);
  }
  reshard_comm_destroy(cm[1]);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  close_comm(cm[0], host);
}

static void two_communicators_over_one_host(void **state) {
  (void)state;
  for (int opposite = 0; opposite < 2; opposite++) {
    two_ctx x;
    memset(&x, 0, sizeof x);
    x.opposite = opposite;
    snprintf(world_label, sizeof world_label, "two communicators, %s orders: ", opposite ? "opposite" : "the same");
    run_world(2, two_rank, &x);
    for (int rk = 0; rk < 2; rk++) {
      printf("%s orders, rank %d: plan A %d, plan B %d\n", opposite ? "opposite" : "same", rk, (int)x.got[rk][0],
             (int)x.got[rk][1]);
      assert_int_equal(x.wrong_after_fail[rk], 0);
      if (!opposite) {
        assert_int_equal(x.got[rk][0], RESHARD_SUCCESS);
        assert_int_equal(x.got[rk][1], RESHARD_SUCCESS);
      }
    }
    /* opposite orders: a first execute waits for a partner busy in the
     * other communicator until one of them times out (the other may then
     * pair with its partner's late execute); what succeeded holds its own
     * version (run_world counts wrong bytes), what failed wrote nothing */
    if (opposite)
      assert_true(x.got[0][0] || x.got[0][1] || x.got[1][0] || x.got[1][1]);
  }
}

/* ------------------------------------------------------------ commit */

/* The double-buffered commit (mw_double_buffer): its vote is the
 * communicator's reduction of five words. */
static void dbuf_rank(mw_rank *r) {
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, &host))) return;
  mw_double_buffer(r, c);
  close_comm(c, host);
}

/* The vote is all a rank without partners hears (mw_commit_apart): with
 * a reduction that reduced nothing, rank 2 would commit alone. */
static void apart_rank(mw_rank *r) {
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, &host))) return;
  mw_commit_apart(r, c, *(const int *)r->ctx);
  close_comm(c, host);
}

static void double_buffer(void **state) {
  (void)state;
  snprintf(world_label, sizeof world_label, "double buffer: ");
  run_world(3, dbuf_rank, NULL);
  for (int odd = 1; odd <= 2; odd++) {
    snprintf(world_label, sizeof world_label, "commit vote, rank %d apart: ", odd);
    run_world(3, apart_rank, &odd);
  }
}

/* ------------------------------------------------------------ growth */

/* A plan with a small staging budget, then one of a larger budget on the
 * same communicator: the staging pool grows (the old one freed, its
 * bounce mirror with it, a new one mapped), and both plans move their
 * versions whole, alternating (each execute of the small plan now packs
 * into the larger pool). */
static void growth_rank(mw_rank *r) {
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, &host))) return;
  reshard_layout_t *src, *dst;
  mw_layouts_all(r->n, 256, 32 * (int64_t)r->n, &src, &dst);
  reshard_plan_t *plan[2] = {NULL, NULL};
  reshard_selftest_t s = {0}, d[2] = {{0}, {0}};
  for (int k = 0; k < 2 && !r->failed; k++) {
    reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
    o.timeout_ms = 5000;
    o.staging_bytes = k ? (size_t)1 << 20 : 4096;
    if (reshard_plan_create(c, src, dst, &o, &plan[k])) RFAIL(r, "plan_create %d: %s", k, reshard_last_error());
    else if (reshard_selftest_alloc(&d[k], dst, r->rank, -1)) RFAIL(r, "selftest alloc");
  }
  for (int step = 0; step < 4 && !r->failed; step++) {
    const int k = step % 2;
    reshard_selftest_free(&s);
    if (reshard_selftest_alloc(&s, src, r->rank, step)) {
      RFAIL(r, "selftest alloc");
      break;
    }
    reshard_result_t e = reshard_plan_execute(plan[k], (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d[k].ptr,
                                              (size_t)d[k].nbuf, NULL);
    if (e) RFAIL(r, "step %d: execute: %s", step, reshard_last_error());
    else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    else r->wrong += reshard_selftest_check_from(&d[k], dst, src, r->rank, (uint64_t)step, "pool growth");
  }
  for (int k = 0; k < 2; k++) {
    reshard_plan_destroy(plan[k]);
    reshard_selftest_free(&d[k]);
  }
  reshard_selftest_free(&s);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  close_comm(c, host);
}

static void pool_growth(void **state) {
  (void)state;
  snprintf(world_label, sizeof world_label, "pool growth: ");
  assert_true(run_world(3, growth_rank, NULL) > 0); /* (its pools' messages named their registrations) */
}

/* ------------------------------------------------------------ arena */

/* Byte i of what rank `from` sends in message k. */
static unsigned char arena_byte(int from, int k, size_t i) {
  return (unsigned char)(i * 131u + (unsigned)from * 71u + (unsigned)k * 29u + (i >> 9));
}

/* Messages of these sizes (bytes) each way between the two ranks, in
 * three groups: {0, 1} and {2} posted before either is settled (the
 * bounce's arena grows within the first group, then again while bytes
 * of pending messages are in the arenas it outgrew), {3} after both
 * settled. */
static const size_t arena_sizes[4] = {100 << 10, 90 << 10, 300 << 10, 40 << 10};

static void arena_rank(mw_rank *r) {
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, &host))) return;
  const rs_stream_ops *so = c->ops->stream_ops;
  const int peer = 1 - r->rank;
  cudaStream_t st = NULL;
  unsigned char *sbuf[4] = {0}, *rbuf[4] = {0}, *h = malloc(arena_sizes[2]);
  if (!h || cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) RFAIL(r, "stream or host buffer");
  for (int k = 0; k < 4 && !r->failed; k++) {
    if (cudaMalloc((void **)&sbuf[k], arena_sizes[k]) || cudaMalloc((void **)&rbuf[k], arena_sizes[k])) {
      RFAIL(r, "cudaMalloc");
      break;
    }
    for (size_t i = 0; i < arena_sizes[k]; i++) h[i] = arena_byte(r->rank, k, i);
    cudaMemcpyAsync(sbuf[k], h, arena_sizes[k], cudaMemcpyHostToDevice, st);
    cudaMemsetAsync(rbuf[k], 0xee, arena_sizes[k], st);
  }
  const int64_t deadline = rs_now_ns() + 10000000000ll;
  uint64_t t[3] = {0, 0, 0};
  const int first[3] = {0, 2, 3}, count[3] = {2, 1, 1};
  for (int g = 0; g < 3 && !r->failed; g++) {
    rs_p2p ops[4];
    size_t n = 0;
    for (int k = first[g]; k < first[g] + count[g]; k++) {
      ops[n++] = (rs_p2p){.peer = peer, .is_recv = 1, .buf = rbuf[k], .bytes = arena_sizes[k]};
      ops[n++] = (rs_p2p){.peer = peer, .is_recv = 0, .buf = sbuf[k], .bytes = arena_sizes[k]};
    }
    if (so->group_async(c, ops, n, st, deadline, NULL, &t[g])) RFAIL(r, "group %d: %s", g, reshard_last_error());
    /* the first two pend together; the third follows their settle */
    else if (g >= 1 && so->settle(c, t[g], deadline)) RFAIL(r, "settle %d: %s", g, reshard_last_error());
  }
  if (!r->failed && mock_stream_drain(st)) RFAIL(r, "drain hung");
  for (int k = 0; k < 4 && !r->failed; k++) {
    if (cudaMemcpy(h, rbuf[k], arena_sizes[k], cudaMemcpyDeviceToHost)) RFAIL(r, "copy back");
    for (size_t i = 0; i < arena_sizes[k] && !r->failed; i++)
      if (h[i] != arena_byte(peer, k, i)) {
        r->wrong++;
        RFAIL(r, "message %d byte %zu: %u, not %u", k, i, h[i], arena_byte(peer, k, i));
      }
  }
  for (int k = 0; k < 4; k++) {
    cudaFree(sbuf[k]);
    cudaFree(rbuf[k]);
  }
  if (st) cudaStreamDestroy(st);
  free(h);
  close_comm(c, host);
}

static void arena_growth(void **state) {
  (void)state;
  snprintf(world_label, sizeof world_label, "arena growth: ");
  run_world(2, arena_rank, NULL);
}

/* ------------------------------------------------------------ refusals */

static void refusals_rank(mw_rank *r) {
  reshard_comm_t *host = NULL, *c = NULL;
  if (!(c = open_comm(r, &host))) return;
  reshard_layout_t *src, *dst;
  mw_layouts_all(r->n, 16, 32 * (int64_t)r->n, &src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 5000;
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s = {0}, d = {0};
  if (reshard_plan_create(c, src, dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    goto out;
  }
  reshard_selftest_alloc(&s, src, r->rank, 0);
  reshard_selftest_alloc(&d, dst, r->rank, -1);
  reshard_result_t e = reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf,
                                                     (void *const *)d.ptr, (size_t)d.nbuf);
  if (e != RESHARD_ERROR_UNSUPPORTED) RFAIL(r, "register_buffers returned %d: %s", (int)e, reshard_last_error());
  /* a capture: refused before anything is enqueued, the plan usable */
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed);
  e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, st);
  cudaGraph_t g = NULL;
  cudaStreamEndCapture(st, &g);
  if (g) cudaGraphDestroy(g);
  cudaStreamDestroy(st);
  if (!r->failed && (e != RESHARD_ERROR_UNSUPPORTED || !strstr(reshard_last_error(), "CUDA graph")))
    RFAIL(r, "captured execute returned %d: %s", (int)e, reshard_last_error());
  /* after the refusals, a whole version */
  if (!r->failed) {
    e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
    if (e) RFAIL(r, "execute: %s", reshard_last_error());
    else if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    else r->wrong += reshard_selftest_check_from(&d, dst, src, r->rank, 0, "after refusals");
  }
  /* the wrong device (fails the plan, as on every device transport) */
  int dev = 0;
  cudaGetDevice(&dev);
  cudaSetDevice(dev + 1);
  e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
  cudaSetDevice(dev);
  if (!r->failed && (e != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "cudaSetDevice")))
    RFAIL(r, "execute on the wrong device returned %d: %s", (int)e, reshard_last_error());
  /* a host communicator that is not UCX */
  reshard_comm_t *ip = NULL, *bad = (reshard_comm_t *)1;
  if (!r->failed && reshard_comm_create_inproc(r->host_world, r->rank, &ip)) RFAIL(r, "inproc");
  if (!r->failed) {
    e = reshard_comm_create_ucx_cuda(ip, &bad);
    if (e != RESHARD_ERROR_INVALID_ARGUMENT || bad || !strstr(reshard_last_error(), "UCX communicator"))
      RFAIL(r, "over inproc: %d: %s", (int)e, reshard_last_error());
    e = reshard_comm_create_ucx_cuda(NULL, &bad);
    if (!r->failed && e != RESHARD_ERROR_INVALID_ARGUMENT) RFAIL(r, "NULL host: %d", (int)e);
  }
  reshard_comm_destroy(ip);
out:
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  close_comm(c, host);
}

static void refusals(void **state) {
  (void)state;
  snprintf(world_label, sizeof world_label, "refusals: ");
  real_answer = -2;
  run_world(2, refusals_rank, NULL);
  if (!moves_cuda) {
    /* the second run is the bounce's only where the real UCX says so */
    printf("the real capability query: %d (-1: no CUDA memory type: every message bounces)\n", real_answer);
    assert_int_not_equal(real_answer, -2);
    if (real_answer >= 0) {
      printf("this UCX moves CUDA memory: the bounce is not what this run tests\n");
      skip();
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(refusals),
      cmocka_unit_test(absent_partner_times_out),
      cmocka_unit_test(absent_partner_pins_its_pool),
      cmocka_unit_test(two_communicators_over_one_host),
      cmocka_unit_test(double_buffer),
      cmocka_unit_test(pool_growth),
      cmocka_unit_test(arena_growth),
      cmocka_unit_test(random_worlds),
  };
  /* UCX moving the device memory itself (the capability query wrapped:
   * host memory, as the emulated device's is) */
  moves_cuda = 1;
  int rc = cmocka_run_group_tests_name("UCX moves device memory", tests, NULL, NULL);
  /* the real query: Debian's UCX moves no CUDA memory, so every message
   * goes through pinned host memory (a CUDA-enabled UCX with a driver
   * would run the first group again) */
  moves_cuda = 0;
  rc |= cmocka_run_group_tests_name("through pinned host memory (the real capability query)", tests, NULL, NULL);
  return rc;
}
