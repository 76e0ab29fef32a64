/* The stream-ordered half of the transport seam (device transports: NCCL).
 *
 * A host transport moves bytes when the executor asks and completes
 * requests the executor waits for. A device transport cannot: its
 * transfers are enqueued on CUDA streams and complete later, in stream
 * order. So the plan is executed by a device executor
 * (src/device/execute_device.c) that enqueues packs, transfers and unpacks
 * without waiting, and reaches the transport only through these calls.
 * No CUDA or NCCL type appears here: streams are void *. */
#ifndef RS_TRANSPORT_STREAM_H
#define RS_TRANSPORT_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"
#include "transport/transport.h"

/* One point-to-point transfer of a group. */
typedef struct rs_p2p {
  int32_t peer;
  int32_t is_recv;
  void *buf; /* device memory */
  uint64_t bytes;
} rs_p2p;

struct rs_stream_ops {
  /* Enqueues the whole plan after the work already on `stream` (a
   * cudaStream_t; NULL: the legacy default stream); completion is visible
   * on `stream`. Buffers were checked by the caller. */
  reshard_result_t (*execute)(const reshard_plan_t *plan,
                              void *const *src, size_t nsrc,
                              void *const *dst, size_t ndst, void *stream,
                              uint64_t epoch);
  /* Enqueues one group of transfers (all of one round) on `stream`. A
   * nonblocking communicator may need to finish enqueueing: that wait ends
   * at deadline_ns (then the communicator is aborted: TIMEOUT). */
  reshard_result_t (*group)(reshard_comm_t *comm, const rs_p2p *ops,
                            size_t n, void *stream, int64_t deadline_ns);
  /* Staging memory suited to the transport (ncclMemAlloc). */
  reshard_result_t (*mem_alloc)(reshard_comm_t *comm, size_t bytes,
                                void **ptr);
  void (*mem_free)(reshard_comm_t *comm, void *ptr);
  /* Never blocks: the communicator's asynchronous error, if any. */
  reshard_result_t (*check)(reshard_comm_t *comm);
};

static inline reshard_result_t rs_stream_execute(
    const reshard_plan_t *plan, void *const *src, size_t nsrc,
    void *const *dst, size_t ndst, void *stream, uint64_t epoch) {
  return plan->comm->ops->stream_ops->execute(plan, src, nsrc, dst, ndst,
                                              stream, epoch);
}

#endif
