/* A one-rank NCCL plan end to end on a GPU: plan agreement over NCCL, then
 * local device-to-device copies (no NCCL self-send) into a transposed,
 * misaligned raw destination and a fused one, executed on a user stream
 * without host synchronization, then checked byte for byte (every
 * destination element and every byte around the fragments). Three steps
 * with new values; buffers change address on the last one. Exit 77
 * without a device. */
#include <nccl.h>
#include <stdio.h>
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
  free_device(dd, d.nbuf);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_comm_destroy(comm);
  ncclCommDestroy(nc);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  CK(cudaStreamDestroy(stream));
  printf("gpu_nccl_local: %lld wrong bytes/elements: %s\n", (long long)bad, bad ? "FAILED" : "passed");
  return bad ? 1 : 0;
}
