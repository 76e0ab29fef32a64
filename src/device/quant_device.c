/* Block quantization on device transports (plan/quant.h): the scratch in
 * device memory and this rank's boxes uploaded once, at plan creation;
 * the quantize launch that the device executor enqueues at the start of
 * every execute of the main plan (kernels/quant_kernels.cu). */
#include <cuda_runtime.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/error.h"
#include "transport/dev_comm.h"
#include "device/device.h"
#include "kernels/rs_kernels.h"
#include "pack/quant_block.h"
#include "plan/quant.h"

typedef struct rs_qdev {
  reshard_comm_t *comm; /* (registered scratch may be mapped by peers) */
  rs_qbox *d_boxes;
  uint64_t *d_bstart; /* nboxes + 1: each box's first block */
  uint64_t nblocks;
} rs_qdev;

static void qdev_free(rs_quant *q) {
  rs_qdev *x = q->dev;
  /* After the plans' own waits (reshard_plan_destroy: the main plan's
   * streams, then the pre-plan's, destroyed by destroy_stages just before
   * rs_quant_free calls this) nothing runs on this memory, unless
   * the GPU did not let go of the main plan's work: then it stays. */
  if (!q->dev_stuck) {
    /* the scratch may be registered, mapped by the partners until they
     * destroy their plans too: the communicator frees it when none can */
    void *scratch[3] = {q->codes, q->scales, q->gather};
    for (int i = 0; i < 3; i++) {
      if (x && x->comm) rs_dev_comm_free_exported(x->comm, scratch[i]);
      else if (scratch[i]) cudaFree(scratch[i]);
    }
    if (x && x->d_boxes) cudaFree(x->d_boxes);
    if (x && x->d_bstart) cudaFree(x->d_bstart);
  }
  free(x);
  q->dev = NULL;
  q->codes = q->scales = q->gather = NULL;
}

reshard_result_t rs_device_quant_prepare(reshard_comm_t *c, rs_quant *q, int64_t timeout_ms) {
  rs_qdev *x = calloc(1, sizeof *x);
  uint64_t *bstart = malloc((q->nboxes + 1) * sizeof *bstart);
  if (!x || !bstart) {
    free(x);
    free(bstart);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory", c->rank);
  }
  q->dev = x;
  x->comm = c;
  q->dev_free = qdev_free;
  if (q->nboxes > UINT32_MAX) {
    free(bstart);
    return rs_error(RESHARD_ERROR_UNSUPPORTED, "plan_create rank %d: %zu quantization boxes exceed the kernel's "
                    "32-bit index", c->rank, q->nboxes);
  }
  bstart[0] = 0;
  for (size_t i = 0; i < q->nboxes; i++) bstart[i + 1] = bstart[i] + rs_qblock_count(&q->boxes[i]);
  x->nblocks = bstart[q->nboxes];
  cudaStream_t s = NULL;
  cudaError_t ce = cudaSuccess;
  const char *what = "cudaMalloc(quantization scratch)";
  if (q->codes_bytes) ce = cudaMalloc((void **)&q->codes, q->codes_bytes);
  if (!ce && q->scales_bytes) ce = cudaMalloc((void **)&q->scales, q->scales_bytes);
  if (!ce && q->gather_bytes) ce = cudaMalloc((void **)&q->gather, q->gather_bytes);
  if (!ce) ce = cudaMalloc((void **)&x->d_boxes, (q->nboxes ? q->nboxes : 1) * sizeof(rs_qbox));
  if (!ce) ce = cudaMalloc((void **)&x->d_bstart, (q->nboxes + 1) * sizeof *bstart);
  if (!ce) {
    what = "the upload of the quantization boxes";
    ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  if (!ce && q->nboxes)
    ce = cudaMemcpyAsync(x->d_boxes, q->boxes, q->nboxes * sizeof(rs_qbox), cudaMemcpyHostToDevice, s);
  if (!ce) ce = cudaMemcpyAsync(x->d_bstart, bstart, (q->nboxes + 1) * sizeof *bstart, cudaMemcpyHostToDevice, s);
  reshard_result_t r = ce ? rs_cuda_error(ce, what, c->rank) : RESHARD_SUCCESS;
  /* pageable sources: the upload is done before they go (polled) */
  if (s && !r)
    r = rs_dev_comm_wait(c, s, NULL, rs_deadline_after_ms(timeout_ms), "cudaStreamQuery(quantization boxes)",
                         "the upload of the quantization boxes did not finish before the deadline");
  if (s) cudaStreamDestroy(s);
  free(bstart);
  if (r) rs_error_prefix("plan_create rank %d (block quantization on the device, %zu + %zu + %zu bytes): ", c->rank,
                         q->codes_bytes, q->scales_bytes, q->gather_bytes);
  return r;
}

reshard_result_t rs_device_quantize(const rs_quant *q, void *const *tab, void *stream, int rank) {
  const rs_qdev *x = q->dev;
  if (!x || !x->nblocks) return RESHARD_SUCCESS;
  int e = rs_cuda_quantize(x->d_boxes, x->d_bstart, (uint32_t)q->nboxes, x->nblocks, tab, q->gather, q->codes,
                           q->scales, stream);
  return e ? rs_cuda_error(e, "quantize launch", rank) : RESHARD_SUCCESS;
}
