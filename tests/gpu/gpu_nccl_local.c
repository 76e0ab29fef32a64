/* A one-rank NCCL plan end to end on a GPU: plan agreement over NCCL, then
 * local device-to-device copies (no NCCL self-send) into a transposed,
 * misaligned raw destination and a fused one, executed on a user stream
 * without host synchronization, then checked byte for byte (every
 * destination element and every byte around the fragments). Three steps
 * with new values; buffers change address on the last one. Then, on the
 * real NCCL, the rules the mocked multi-rank tests check (issue 23): plan
 * creation behind a long GPU backlog is not timed against it; an execute
 * inside the caller's ncclGroupStart is refused (and at depth 0 the probe
 * that tells has no effect: every execute above went through it); the
 * caller's communicator is neither aborted nor destroyed by reshard and
 * still works afterwards. And CUDA graphs (issue 17, item 6) on the real
 * runtime, whose capture rules the emulated device only models: an
 * execute captured, then launched 10 times with new source values, each
 * checked; the same with RESHARD_FLAG_DOUBLE_BUFFER | RESHARD_FLAG_VERIFY
 * (an NCCL allreduce and the commit inside the graph; the active copy
 * alternates). Exit 77 without a device. */
#include <nccl.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_common.h"
#include "reshard.h"
#include "reshard_nccl.h"
#include "reshard_selftest.h"

#define RS(call)                                                          \
  do {                                                                    \
    reshard_result_t rs_r_ = (call);                                      \
    if (rs_r_) {                                                          \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,       \
              reshard_last_error());                                      \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static void layouts(reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t sw[2] = {1200, 1000}, sv[2] = {5, 7}, su[1] = {3001};
  int tw, tv, tu, m, b;
  RS(reshard_layout_create(src));
  RS(reshard_layout_create(dst));
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L = side ? *dst : *src;
    RS(reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, sw, &tw));
    RS(reshard_layout_add_tensor(L, "v", RESHARD_BF16, 2, sv, &tv));
    RS(reshard_layout_add_tensor(L, "u", RESHARD_FP32, 1, su, &tu));
  }
  int s1[1] = {1};
  reshard_placement_t r1[1] = {reshard_replicate()};
  RS(reshard_layout_add_mesh_strided(*src, 1, s1, 0, 1, &m));
  RS(reshard_layout_place(*src, tw, m, r1, &b));
  RS(reshard_layout_place(*src, tv, m, r1, &b));
  RS(reshard_layout_place(*src, tu, m, r1, &b));
  /* destination: w transposed (column-major), v at an odd 2-byte offset,
   * u fused nowhere: its own dense buffer */
  size_t raw = 1200 * 1000 * 4 + 4096;
  RS(reshard_layout_add_buffer(*dst, "raw", 0, raw, &b));
  int64_t z[2] = {0, 0}, colmajor[2] = {1, 1200};
  reshard_fragment_t fw = {tw, b, z, sw, 16, colmajor};
  reshard_fragment_t fv = {tv, b, z, sv, 16 + 1200 * 1000 * 4 + 6, NULL};
  RS(reshard_layout_add_fragment(*dst, &fw));
  RS(reshard_layout_add_fragment(*dst, &fv));
  RS(reshard_layout_add_mesh_strided(*dst, 1, s1, 0, 1, &m));
  RS(reshard_layout_place(*dst, tu, m, r1, &b));
}

static void **to_device(const reshard_selftest_t *s) {
  void **d = calloc((size_t)s->nbuf, sizeof *d);
  for (int i = 0; i < s->nbuf; i++)
    if (s->ptr[i]) {
      CK(cudaMalloc(&d[i], s->bytes[i]));
      CK(cudaMemcpy(d[i], s->ptr[i], s->bytes[i], cudaMemcpyHostToDevice));
    }
  return d;
}

static void free_device(void **d, int n) {
  for (int i = 0; i < n; i++) cudaFree(d[i]);
  free(d);
}

/* A host function on the stream: the GPU work behind it waits 1.5 s. */
static void CUDART_CB stall(void *arg) {
  (void)arg;
  struct timespec ts = {1, 500000000L};
  nanosleep(&ts, NULL);
}

static void copy_back(reshard_selftest_t *d, void *const *dd, int n) {
  for (int i = 0; i < n; i++)
    if (d->ptr[i]) CK(cudaMemcpy(d->ptr[i], dd[i], d->bytes[i], cudaMemcpyDeviceToHost));
}

/* Captures one execute of `plan` (sources sd, destinations dd, nd of them)
 * on `stream` and launches it `n` times, the sources refilled with step
 * 100 + k before launch k and the destination copy `dsel(k)` checked
 * after it; plain executes with the same buffers come first (the
 * capture's rule). Returns the wrong elements plus failures. */
static int64_t graph_steps(reshard_plan_t *plan, const reshard_layout_t *src, const reshard_layout_t *dst,
                           cudaStream_t stream, int dbuf, int n) {
  reshard_selftest_t s, d[2];
  int64_t bad = 0;
  if (reshard_selftest_alloc(&s, src, 0, 99) || reshard_selftest_alloc(&d[0], dst, 0, -1) ||
      reshard_selftest_alloc(&d[1], dst, 0, -1))
    return 1;
  void **sd = to_device(&s), **d0 = to_device(&d[0]), **d1 = to_device(&d[1]);
  int nb = d[0].nbuf;
  void **dd = calloc(2 * (size_t)nb, sizeof *dd);
  for (int i = 0; i < nb; i++) dd[i] = d0[i], dd[nb + i] = d1[i];
  size_t nd = (size_t)(dbuf ? 2 * nb : nb);
  RS(reshard_plan_execute(plan, sd, (size_t)s.nbuf, dd, nd, stream));
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t g;
  cudaGraphExec_t gx;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  reshard_result_t r = reshard_plan_execute(plan, sd, (size_t)s.nbuf, dd, nd, stream);
  cudaError_t ce = cudaStreamEndCapture(stream, &g);
  if (r || ce) {
    fprintf(stderr, "FAIL: capture: %s (%s), cudaStreamEndCapture: %s\n", reshard_result_string(r),
            reshard_last_error(), cudaGetErrorString(ce));
    return 1;
  }
  CK(cudaGraphInstantiate(&gx, g, 0));
  for (int k = 0; k < n; k++) {
    reshard_selftest_fill(&s, src, 100 + (uint64_t)k);
    for (int i = 0; i < s.nbuf; i++)
      if (s.ptr[i]) CK(cudaMemcpy(sd[i], s.ptr[i], s.bytes[i], cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(gx, stream));
    CK(cudaStreamSynchronize(stream));
    reshard_plan_status_t st = {.struct_size = sizeof st};
    RS(reshard_plan_get_status(plan, &st));
    /* (double buffering: the plain execute committed copy 0, each launch
     * flips) */
    int act = dbuf ? (k + 1) % 2 : 0;
    if (st.failed || (dbuf && st.active_copy != act)) {
      fprintf(stderr, "FAIL: launch %d: failed %d (%s), active copy %d\n", k, st.failed, st.failure_message,
              st.active_copy);
      bad++;
    }
    copy_back(&d[act], act ? d1 : d0, nb);
    bad += reshard_selftest_check(&d[act], dst, 0, 100 + (uint64_t)k, "gpu_nccl_local graph");
  }
  CK(cudaGraphExecDestroy(gx));
  CK(cudaGraphDestroy(g));
  free_device(sd, s.nbuf);
  free_device(d0, nb);
  free_device(d1, nb);
  free(dd);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d[0]);
  reshard_selftest_free(&d[1]);
  return bad;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
  gpu_require_device("gpu_nccl_local");
  int dev = 0;
  CK(cudaSetDevice(dev));
  ncclComm_t nc;
  if (ncclCommInitAll(&nc, 1, &dev) != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll failed\n");
    return 1;
  }
  reshard_comm_t *comm;
  RS(reshard_comm_create_nccl(nc, &comm));
  reshard_layout_t *src, *dst;
  layouts(&src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 30000;
  reshard_plan_t *plan;
  RS(reshard_plan_create(comm, src, dst, &o, &plan));
  reshard_plan_stats_t st;
  RS(reshard_plan_get_stats(plan, &st));
  if (st.send_messages || st.recv_messages || !st.local_copy_bytes) {
    fprintf(stderr, "FAIL: a one-rank plan should be local copies only\n");
    return 1;
  }
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int64_t bad = 0;
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&d, dst, 0, -1)) return 1;
  void **dd = to_device(&d);
  for (int step = 0; step < 3; step++) {
    if (reshard_selftest_alloc(&s, src, 0, step)) return 1;
    void **sd = to_device(&s);
    if (step == 2) { /* new destination addresses: table re-upload */
      free_device(dd, d.nbuf);
      dd = to_device(&d);
    }
    RS(reshard_plan_execute(plan, sd, (size_t)s.nbuf, dd, (size_t)d.nbuf, stream));
    CK(cudaStreamSynchronize(stream));
    for (int i = 0; i < d.nbuf; i++)
      if (d.ptr[i]) CK(cudaMemcpy(d.ptr[i], dd[i], d.bytes[i], cudaMemcpyDeviceToHost));
    bad += reshard_selftest_check(&d, dst, 0, (uint64_t)step, "gpu_nccl_local");
    free_device(sd, s.nbuf);
    reshard_selftest_free(&s);
  }
  int fails = 0;
  {
    /* a backlog: an execute queued behind 1.5 s of stalled stream, then a
     * plan created with a 300 ms timeout: it waits for the backlog (until
     * that execute's own deadline), then agrees in time */
    reshard_selftest_alloc(&s, src, 0, 7);
    void **sd = to_device(&s);
    CK(cudaLaunchHostFunc(stream, stall, NULL));
    RS(reshard_plan_execute(plan, sd, (size_t)s.nbuf, dd, (size_t)d.nbuf, stream));
    reshard_options_t quick = o;
    quick.timeout_ms = 300;
    reshard_plan_t *plan2 = NULL;
    double t0 = now_s();
    reshard_result_t r = reshard_plan_create(comm, src, dst, &quick, &plan2);
    double dt = now_s() - t0;
    printf("gpu_nccl_local: plan_create behind a 1.5 s backlog: %s in %.2f s\n", reshard_result_string(r), dt);
    if (r) {
      fprintf(stderr, "FAIL: plan_create behind the backlog: %s\n", reshard_last_error());
      fails++;
    }
    CK(cudaStreamSynchronize(stream));
    /* inside the caller's own group: refused */
    if (plan2) {
      ncclGroupStart();
      r = reshard_plan_execute(plan2, sd, (size_t)s.nbuf, dd, (size_t)d.nbuf, stream);
      ncclGroupEnd();
      printf("gpu_nccl_local: execute inside ncclGroupStart: %s\n", reshard_result_string(r));
      if (r != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "ncclGroupStart")) {
        fprintf(stderr, "FAIL: execute inside the caller's group: %s (%s)\n", reshard_result_string(r),
                reshard_last_error());
        fails++;
      }
      reshard_plan_destroy(plan2);
    }
    free_device(sd, s.nbuf);
    reshard_selftest_free(&s);
  }
  free_device(dd, d.nbuf);
  reshard_selftest_free(&d);
  {
    /* CUDA graphs: the plain plan, then double buffering with verify */
    int64_t gbad = graph_steps(plan, src, dst, stream, 0, 10);
    reshard_options_t od = o;
    od.flags = RESHARD_FLAG_DOUBLE_BUFFER | RESHARD_FLAG_VERIFY;
    reshard_plan_t *plan3 = NULL;
    RS(reshard_plan_create(comm, src, dst, &od, &plan3));
    gbad += graph_steps(plan3, src, dst, stream, 1, 10);
    reshard_plan_destroy(plan3);
    printf("gpu_nccl_local: 2 x 10 graph launches: %lld wrong\n", (long long)gbad);
    bad += gbad;
  }
  reshard_plan_destroy(plan);
  reshard_comm_destroy(comm);
  {
    /* the caller's communicator is still the caller's, and works */
    float *x;
    CK(cudaMalloc((void **)&x, sizeof *x));
    ncclResult_t e = ncclAllReduce(x, x, 1, ncclFloat, ncclSum, nc, stream);
    if (e == ncclSuccess) CK(cudaStreamSynchronize(stream));
    printf("gpu_nccl_local: the caller's communicator after reshard_comm_destroy: %s\n", ncclGetErrorString(e));
    if (e != ncclSuccess) fails++;
    cudaFree(x);
  }
  ncclCommDestroy(nc);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  CK(cudaStreamDestroy(stream));
  printf("gpu_nccl_local: %lld wrong bytes/elements, %d other failures: %s\n", (long long)bad, fails,
         bad || fails ? "FAILED" : "passed");
  return bad || fails ? 1 : 0;
}
