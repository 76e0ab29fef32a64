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

/* One partner's side of a registration exchange (share, below). */
typedef struct rs_share {
  int32_t peer;
  const void *out;  /* bytes for the peer (the caller's) */
  size_t out_bytes;
  void *in;         /* the peer's bytes (malloc'd by the transport) */
  size_t in_bytes;
  void **bufs;      /* the peer's buffers as mapped here (malloc'd by the
                       transport; NULL where the peer passed none) */
  size_t nbufs;
} rs_share;

struct rs_stream_ops {
  /* Enqueues the whole plan after the work already on `stream` (a
   * cudaStream_t; NULL: the legacy default stream); completion is visible
   * on `stream`. Buffers were checked by the caller. call and version go
   * into the agreement headers the partners check on the device. */
  reshard_result_t (*execute)(const reshard_plan_t *plan,
                              void *const *src, size_t nsrc,
                              void *const *dst, size_t ndst, void *stream,
                              uint64_t call, uint64_t version);
  /* Plan creation, in two steps around an agreement (src/plan/create.c):
   * prepare_local sets up everything an execute needs that only this rank
   * can fail at (device copies of the descriptors, staging, streams), so
   * that a failure fails creation on every rank instead of stranding the
   * peers at the first execute; prepare_peers then connects the plan's
   * peers (collective), so that a late peer at the first execute costs a
   * wait on the GPU, never a host wait or an abort. */
  reshard_result_t (*prepare_local)(reshard_plan_t *plan);
  reshard_result_t (*prepare_peers)(reshard_plan_t *plan);
  /* Enqueues a max-reduction, word by word, of n words (device memory, at
   * most RS_COMMIT_WORDS) over the whole communicator on `stream` (the
   * global agreement of relay plans, one word; the commit's vote); the
   * enqueue's wait ends at deadline_ns like group's, and gate is group's. */
  reshard_result_t (*reduce_words)(reshard_comm_t *comm, uint64_t *words,
                                   uint32_t n, void *stream,
                                   int64_t deadline_ns, void *gate);
  /* Enqueues one group of transfers (all of one round) on `stream`. A
   * nonblocking communicator may need to finish enqueueing: that wait ends
   * at deadline_ns (then reshard's communicator is aborted: TIMEOUT).
   * gate: the plan's verdict on the device (an rs_dev_agree,
   * kernels/rs_agree.h; NULL: none), which a transport that waits on the
   * device (CUDA IPC) closes when a wait gives up, so that nothing later
   * writes a destination byte; NCCL ends its waits by abort instead. */
  reshard_result_t (*group)(reshard_comm_t *comm, const rs_p2p *ops,
                            size_t n, void *stream, int64_t deadline_ns,
                            void *gate);
  /* The communicator's staging pool, shared by its plans (their executes
   * run one after another, see begin): acquire makes it at least `bytes`
   * (waiting for earlier executes' work first, see drain) and counts a
   * user; release drops one (the last frees it; in_use: the GPU may still
   * run work on it, so it is never freed). */
  reshard_result_t (*staging_acquire)(reshard_comm_t *comm, size_t bytes);
  void (*staging_release)(reshard_comm_t *comm, int in_use);
  /* An execute starts: `stream` waits for the previous execute of any plan
   * on the communicator; *staging is the pool. end records the execute's
   * end (the work on `stream` so far) and its deadline. */
  reshard_result_t (*begin)(reshard_comm_t *comm, void *stream,
                            void **staging);
  reshard_result_t (*end)(reshard_comm_t *comm, void *stream,
                          int64_t deadline_ns);
  /* Waits for the last execute's work until its deadline (past it:
   * TIMEOUT, and the communicator is poisoned). */
  reshard_result_t (*drain)(reshard_comm_t *comm);
  /* Never blocks: whether reshard may use the communicator now (not
   * poisoned, no asynchronous error, the current device is its device,
   * not inside the caller's ncclGroupStart). */
  reshard_result_t (*check)(reshard_comm_t *comm);
  /* reshard_plan_get_status: never blocks. A plan whose last execute is
   * not done past its deadline fails with TIMEOUT, and the communicator is
   * poisoned (which ends the work on the GPU): the way to wait for an
   * execute without hanging on a peer that never comes. */
  void (*poll)(const reshard_plan_t *plan);
  /* reshard's work on the communicator can no longer pair with its peers'
   * (a call failed or was refused after peers may have queued theirs):
   * aborts reshard's private communicator, never the caller's. Later
   * calls fail with INVALID_USAGE. */
  void (*poison)(reshard_comm_t *comm);
  /* reshard_plan_register_buffers (NULL: the transport cannot map its
   * peers' memory; the call is UNSUPPORTED). */
  reshard_result_t (*register_buffers)(reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst,
                                       size_t ndst);
  /* Transports that map peers' memory (CUDA IPC): exchanges with each
   * partner of sh[0, n) its bytes (out -> the peer's in) and this rank's
   * buffers bufs[0, nbufs) (device memory, NULL where none), which the
   * peer maps; *mapset holds the mappings made here until unshare. A
   * partner appears once and exchanges both ways; every rank calls it
   * with its partners at the same point (p2p over the host
   * communicator, with deadlines). */
  reshard_result_t (*share)(reshard_comm_t *comm, void *const *bufs, size_t nbufs, rs_share *sh, size_t n,
                            void **mapset);
  void (*unshare)(reshard_comm_t *comm, void *mapset);
  /* Plan creation with block quantization (plan/quant.h): allocates the
   * quantization scratch in device memory and uploads this rank's boxes,
   * setting q->dev and q->dev_free (which rs_quant_free calls); waits end
   * timeout_ms from now. The device executor then quantizes at the start
   * of every execute of the main plan (NULL: UNSUPPORTED). */
  reshard_result_t (*quant_prepare)(reshard_comm_t *comm, struct rs_quant *q, int64_t timeout_ms);
  /* Whether an execute may be captured into a CUDA graph: every launch
   * of the graph then runs the same enqueued work again. A transport
   * whose enqueued work carries per-message state the host counts (CUDA
   * IPC's sequence numbers, kernels/rs_ipc.h) cannot be replayed. */
  int graphs;
};

static inline reshard_result_t rs_stream_execute(
    const reshard_plan_t *plan, void *const *src, size_t nsrc,
    void *const *dst, size_t ndst, void *stream, uint64_t call,
    uint64_t version) {
  return plan->comm->ops->stream_ops->execute(plan, src, nsrc, dst, ndst,
                                              stream, call, version);
}

#endif
