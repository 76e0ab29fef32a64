/* Source-side spreading on device transports (src/plan/spread.h, issue
 * 44) against the emulated device (mock_device.h): ranks as threads over
 * the emulated NCCL and CUDA IPC transports, stream order and its hazards
 * modelled. The pre-plan copies slices of an over-loaded rank's sole-held
 * experts over NVLink into device scratch of its domain's idle ranks, on
 * the caller's stream; the main plan sends them on from there.
 *
 * Every destination element is checked against the self-test's values
 * from global coordinates and every byte outside destination fragments
 * against its sentinel (reshard_selftest_check_from), over three versions
 * so that the scratch is rewritten.
 *
 * moe_nccl, moe_ipc: one pipeline stage's experts with one replica each
 * (ranks 0 and 1 of an h100-8x400g domain hold them, the other six a
 * replicated dense tensor; ranks 8..15 take both): with the default
 * flags the cost model keeps the spread plan on every rank, as on host
 * transports (tests/system/test_spread.c moe_stage), rank 0 sends less
 * than half of what it sends out of its domain without spreading, the
 * idle ranks send, and the bytes are right; RESHARD_FLAG_NO_SPREAD gives
 * the plain plan. Over CUDA IPC once more with registered buffers: both
 * stages copy straight from the partners' buffers and scratch, nothing
 * through a staging pool.
 * moe_fp8: block quantization and spreading together (bf16 -> fp8
 * blocks): the codes are made at the start of the spreading pre-plan,
 * which copies them; every code and scale is checked against the
 * self-test's reference quantizer, over NCCL and CUDA IPC (staged and
 * registered).
 * scratch_short: the cudaMalloc of an idle rank's scratch fails: every
 * rank keeps the plain plan, which moves every byte right.
 * pre_mismatch: rank 0 runs one version ahead in the pre-plan only, at
 * the second execute: its domain's partners see it, every other rank
 * must learn it from the main plan's verdict (reduced over every rank):
 * every rank's status fails and no destination byte of that call is
 * written anywhere. */
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
#include "plan/plan.h"
#include "plan/spread.h"
#include "reshard.h"
#include "reshard_cuda_ipc.h"
#include "reshard_inproc.h"
#include "reshard_nccl.h"
#include "reshard_selftest.h"

#define NR 16

/* This rank's device communicator: NCCL over the mocked caller's, or CUDA
 * IPC over an in-process host communicator (*host). NULL after RFAIL. */
static reshard_comm_t *open_comm(mw_rank *r, int nccl, reshard_comm_t **host) {
  *host = NULL;
  reshard_comm_t *c = NULL;
  if (nccl) {
    if (reshard_comm_create_nccl(MOCK_PARENT, &c)) RFAIL(r, "comm_create_nccl: %s", reshard_last_error());
    return c;
  }
  if (reshard_comm_create_inproc(r->host_world, r->rank, host)) {
    RFAIL(r, "inproc: %s", reshard_last_error());
    return NULL;
  }
  if (reshard_comm_create_cuda_ipc(*host, &c)) {
    RFAIL(r, "comm_create_cuda_ipc: %s", reshard_last_error());
    reshard_comm_destroy(*host);
    *host = NULL;
  }
  return c;
}

typedef struct sctx {
  reshard_layout_t *src, *dst;
  int nccl;
  uint32_t flags;
  int steps;
  int short_rank;  /* this rank's scratch cudaMalloc fails (-1: none) */
  int registered;  /* CUDA IPC: reshard_plan_register_buffers, direct copies */
  int tamper;      /* rank 0 one version ahead in the pre-plan at step 1 */
  /* results, per rank */
  int spread[NR], quant[NR];
  uint64_t egress[NR];
  int named_pre; /* ranks whose failure names the spreading pre-plan */
} sctx;

/* The destination as the calls before left it. */
static unsigned char **snapshot(const reshard_selftest_t *d) {
  unsigned char **before = calloc((size_t)d->nbuf + 1, sizeof *before);
  for (int b = 0; b < d->nbuf; b++)
    if (d->ptr[b]) before[b] = malloc(d->bytes[b]), memcpy(before[b], d->ptr[b], d->bytes[b]);
  return before;
}

/* The tampered call: every rank fails, none writes a byte of it. */
static void check_mismatch(mw_rank *r, sctx *x, reshard_plan_t *plan, reshard_selftest_t *d, unsigned char **before,
                           cudaStream_t st, reshard_result_t e) {
  reshard_plan_status_t sta = {.struct_size = sizeof sta};
  for (int64_t t0 = time(NULL); time(NULL) - t0 < 8;) {
    reshard_plan_get_status(plan, &sta);
    if (sta.failed) break;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  mock_stream_drain(st);
  long ch = 0;
  for (int b = 0; b < d->nbuf; b++)
    for (size_t i = 0; d->ptr[b] && i < d->bytes[b]; i++) ch += d->ptr[b][i] != before[b][i];
  if (ch) RFAIL(r, "%ld destination bytes changed by a call whose pre-plan failed (execute %d)", ch, e);
  if (!sta.failed) RFAIL(r, "the call whose pre-plan disagreed did not fail here (execute %d)", e);
  else if (sta.failure != RESHARD_ERROR_MISMATCH && sta.failure != RESHARD_ERROR_REMOTE &&
           sta.failure != RESHARD_ERROR_TIMEOUT)
    RFAIL(r, "status: %s (%s)", reshard_result_string(sta.failure), sta.failure_message);
  if (sta.failed && strstr(sta.failure_message, "copying sole-held data"))
    __atomic_fetch_add(&x->named_pre, 1, __ATOMIC_RELAXED);
  for (int b = 0; b < d->nbuf; b++) free(before[b]);
  free(before);
}

/* Plan, introspect, execute x->steps versions (each checked), destroy. */
static void spread_rank(mw_rank *r) {
  sctx *x = r->ctx;
  reshard_comm_t *host = NULL, *c = open_comm(r, x->nccl, &host);
  if (!c) return;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.topology = "h100-8x400g";
  o.relay = 0;
  o.flags = x->flags;
  o.staging_bytes = (size_t)1 << 20;
  o.timeout_ms = x->tamper ? 3000 : 20000;
  reshard_plan_t *plan = NULL;
  /* the caller's stream: both stages go on it */
  const cudaStream_t st = (cudaStream_t)(uintptr_t)(0x7000 + 16 * r->rank);
  M.fail_malloc = r->rank == x->short_rank;
  reshard_result_t e = reshard_plan_create(c, x->src, x->dst, &o, &plan);
  M.fail_malloc = 0;
  if (e) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    reshard_comm_destroy(c);
    reshard_comm_destroy(host);
    return;
  }
  x->spread[r->rank] = plan->spread != NULL;
  x->quant[r->rank] = plan->quant != NULL;
  for (size_t i = 0; i < plan->npeers; i++)
    if (plan->map.domain[plan->peers[i].peer] != plan->map.domain[r->rank])
      x->egress[r->rank] += plan->peers[i].send_bytes;
  reshard_selftest_t s = {0}, d = {0};
  if (reshard_selftest_alloc(&d, x->dst, r->rank, -1)) RFAIL(r, "selftest alloc");
  /* NCCL maps no peer memory; CUDA IPC unregisters (nothing registered) */
  e = reshard_plan_register_buffers(plan, NULL, 0, NULL, 0);
  if (e != (x->nccl ? RESHARD_ERROR_UNSUPPORTED : RESHARD_SUCCESS))
    RFAIL(r, "unregistering gave %s: %s", reshard_result_string(e), reshard_last_error());
  if (x->registered) {
    /* one set of sources, registered with the destinations (and every
     * stage's scratch), refilled every step */
    if (reshard_selftest_alloc(&s, x->src, r->rank, 0)) RFAIL(r, "selftest alloc");
    /* the caller's count, not the main plan's (which has the scratch) */
    else if ((e = reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf + 1, (void *const *)d.ptr,
                                                (size_t)d.nbuf)) != RESHARD_ERROR_INVALID_ARGUMENT ||
             !strstr(reshard_last_error(), "source buffers given"))
      RFAIL(r, "one source buffer too many gave %s: %s", reshard_result_string(e), reshard_last_error());
    else if (reshard_plan_register_buffers(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                           (size_t)d.nbuf))
      RFAIL(r, "register_buffers: %s", reshard_last_error());
  }
  /* some GPUs slower: a stage not ordered after the one before it reads
   * what that has not written yet */
  M.kernel_ns = r->rank % 2 ? 0 : 2000000;
  for (int step = 0; step < x->steps && !r->failed; step++) {
    if (x->registered) {
      reshard_selftest_fill(&s, x->src, (uint64_t)step);
    } else if (reshard_selftest_alloc(&s, x->src, r->rank, step)) {
      RFAIL(r, "selftest alloc");
      break;
    }
    const int tampered = x->tamper && step == 1;
    unsigned char **before = tampered ? snapshot(&d) : NULL;
    if (tampered && r->rank == 0) {
      M.tamper_version = 1;
      M.tamper_digest = plan->spread->pre->digest;
    }
    e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, st);
    if (tampered) {
      check_mismatch(r, x, plan, &d, before, st, e);
      reshard_selftest_free(&s);
      break;
    }
    if (e) RFAIL(r, "execute %d: %s", step, reshard_last_error());
    else if (mock_stream_drain(st)) RFAIL(r, "step %d: drain hung", step);
    else r->wrong += reshard_selftest_check_from(&d, x->dst, x->src, r->rank, (uint64_t)step, "spread on device");
    reshard_plan_status_t sta = {.struct_size = sizeof sta};
    reshard_plan_get_status(plan, &sta);
    if (sta.failed) RFAIL(r, "step %d: status: %s", step, sta.failure_message);
    if (!x->registered) reshard_selftest_free(&s);
  }
  M.kernel_ns = 0;
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_comm_destroy(c);
  reshard_comm_destroy(host);
}

static void run(sctx *x, const char *what) {
  mw_rank r[NR];
  memset(x->spread, 0, sizeof x->spread);
  memset(x->quant, 0, sizeof x->quant);
  memset(x->egress, 0, sizeof x->egress);
  x->named_pre = 0;
  mw_outcome o = mw_run(NR, 6000, spread_rank, x, r);
  for (int i = 0; i < NR; i++)
    if (r[i].failed) fail_msg("%s over %s: rank %d: %s", what, x->nccl ? "NCCL" : "CUDA IPC", i, r[i].why);
  if (o.wrong || o.hangs || o.ipc_mapped || o.ipc_closed_reads || o.ipc_freed_mapped || o.bad_size)
    fail_msg("%s over %s: %lld wrong bytes, %ld hangs, %ld IPC mappings open, %ld pulls through closed mappings, "
             "%ld frees of mapped memory, %ld size mismatches", what, x->nccl ? "NCCL" : "CUDA IPC",
             (long long)o.wrong, o.hangs, o.ipc_mapped, o.ipc_closed_reads, o.ipc_freed_mapped, o.bad_size);
}

static void expect_all(const int *v, int want) {
  for (int q = 0; q < NR; q++) assert_int_equal(v[q], want);
}

static void moe(int nccl) {
  sctx x = {0};
  mw_moe_pair(1024, 0, &x.src, &x.dst); /* 4 MiB of experts, 2 MiB on each of ranks 0 and 1 */
  x.nccl = nccl, x.steps = 3, x.short_rank = -1;
  x.flags = RESHARD_FLAG_NO_SPREAD;
  run(&x, "plain");
  expect_all(x.spread, 0);
  const uint64_t plain_egress = x.egress[0];
  assert_true(plain_egress >= ((uint64_t)2 << 20)); /* rank 0 sends its experts itself */
  x.flags = 0; /* the cost model decides, as on host transports */
  run(&x, "spread");
  expect_all(x.spread, 1);
  print_message("moe over %s: rank 0 sends %llu bytes out of its domain against %llu\n", nccl ? "NCCL" : "CUDA IPC",
                (unsigned long long)x.egress[0], (unsigned long long)plain_egress);
  assert_true(x.egress[0] < plain_egress / 2);
  for (int q = 2; q < 8; q++) assert_true(x.egress[q] > x.egress[0] / 4); /* the idle ranks send now */
  if (!nccl) {
    x.registered = 1;
    run(&x, "spread, registered");
    expect_all(x.spread, 1);
    assert_int_equal(world.ipc_pool_pulls, 0);
  }
  reshard_layout_destroy(x.src);
  reshard_layout_destroy(x.dst);
}

static void moe_nccl(void **state) {
  (void)state;
  moe(1);
}

static void moe_ipc(void **state) {
  (void)state;
  moe(0);
}

static void moe_fp8(void **state) {
  (void)state;
  for (int nccl = 0; nccl < 2; nccl++) {
    sctx x = {0};
    mw_moe_pair(512, 1, &x.src, &x.dst);
    x.nccl = nccl, x.steps = 3, x.short_rank = -1;
    x.flags = RESHARD_FLAG_NO_SPREAD;
    run(&x, "fp8 plain");
    expect_all(x.spread, 0);
    expect_all(x.quant, 1);
    const uint64_t plain_egress = x.egress[0];
    x.flags = RESHARD_FLAG_SPREAD_ALWAYS;
    run(&x, "fp8 spread");
    expect_all(x.spread, 1);
    expect_all(x.quant, 1);
    assert_true(x.egress[0] < plain_egress / 2);
    if (!nccl) {
      x.registered = 1;
      run(&x, "fp8 spread, registered");
      expect_all(x.spread, 1);
      assert_int_equal(world.ipc_pool_pulls, 0);
    }
    reshard_layout_destroy(x.src);
    reshard_layout_destroy(x.dst);
  }
}

static void scratch_short(void **state) {
  (void)state;
  sctx x = {0};
  mw_moe_pair(256, 0, &x.src, &x.dst);
  x.nccl = 1, x.steps = 2, x.short_rank = -1;
  x.flags = RESHARD_FLAG_SPREAD_ALWAYS;
  run(&x, "control");
  expect_all(x.spread, 1);
  x.short_rank = 3; /* an idle rank of the experts' domain: it takes copies */
  run(&x, "scratch short");
  expect_all(x.spread, 0);
  reshard_layout_destroy(x.src);
  reshard_layout_destroy(x.dst);
}

static void pre_mismatch(void **state) {
  (void)state;
  for (int nccl = 0; nccl < 2; nccl++) {
    sctx x = {0};
    mw_moe_pair(256, 0, &x.src, &x.dst);
    x.nccl = nccl, x.steps = 2, x.short_rank = -1, x.tamper = 1;
    x.flags = RESHARD_FLAG_SPREAD_ALWAYS;
    run(&x, "pre-plan mismatch");
    expect_all(x.spread, 1);
    /* rank 0's partners in the copies say where it failed */
    assert_true(x.named_pre > 0);
    reshard_layout_destroy(x.src);
    reshard_layout_destroy(x.dst);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(moe_nccl),      cmocka_unit_test(moe_ipc),      cmocka_unit_test(moe_fp8),
      cmocka_unit_test(scratch_short), cmocka_unit_test(pre_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
