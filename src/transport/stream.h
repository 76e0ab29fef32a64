/* The stream-ordered half of the transport seam (stream transports: NCCL,
 * CUDA IPC).
 *
 * A host transport moves bytes when the executor asks and completes
 * requests the executor waits for. A stream transport cannot: its
 * transfers are enqueued on CUDA streams and complete later, in stream
 * order. So its plans are run by the device executor
 * (src/device/executor.c, chosen at plan creation: plan/executor.h),
 * which enqueues packs, transfers and unpacks without waiting and reaches
 * the transport only through these calls; what every stream transport's
 * communicator holds (execute order, staging pool) is
 * transport/dev_comm.h, which the executor drives directly. No CUDA or
 * NCCL type appears here: streams are void *. */
#ifndef RS_TRANSPORT_STREAM_H
#define RS_TRANSPORT_STREAM_H

#include <stddef.h>
#include <stdint.h>

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
                       transport; NULL where the peer passed none); on a
                       host transport's rma_share (transport.h) its
                       addresses there, never dereferenced here */
  size_t nbufs;
  uint64_t *lens;   /* rma_share: each of those buffers' registered bytes
                       (malloc'd by the transport); NULL elsewhere */
  int skip;         /* rma_share with a kept set: not exchanged with
                       (transport.h); 0 elsewhere */
} rs_share;

struct rs_stream_ops {
  /* Plan creation, after the device executor set the plan up
   * (collective; NULL: nothing to do): transports that map their peers'
   * memory (CUDA IPC) map every peer's staging pool of the communicator
   * (transport/dev_comm.h) here, so that an execute never waits for a
   * mapping. */
  reshard_result_t (*connect)(reshard_comm_t *comm);
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
  /* Optional (NULL for transports whose transfers are stream-ordered):
   * a transport driven by the host (UCX) posts a round's group and
   * returns without waiting for it (*ticket names it), and the executor
   * calls settle(ticket) before anything reads what the group received
   * or writes what it sent (dev_wait, at a dependency on that transfer);
   * settle completes every group up to the ticket, until deadline_ns.
   * group then is group_async and settle at once. */
  reshard_result_t (*group_async)(reshard_comm_t *comm, const rs_p2p *ops,
                                  size_t n, void *stream, int64_t deadline_ns,
                                  void *gate, uint64_t *ticket);
  reshard_result_t (*settle)(reshard_comm_t *comm, uint64_t ticket,
                             int64_t deadline_ns);
  /* Never blocks: whether reshard may use the communicator now (not
   * poisoned, no asynchronous error, the current device is its device,
   * not inside the caller's ncclGroupStart). */
  reshard_result_t (*check)(reshard_comm_t *comm);
  /* reshard's work on the communicator can no longer pair with its peers'
   * (a call failed or was refused after peers may have queued theirs):
   * aborts reshard's private communicator, never the caller's. Later
   * calls fail with INVALID_USAGE. */
  void (*poison)(reshard_comm_t *comm);
  /* Transports that map peers' memory (CUDA IPC; NULL elsewhere): exchanges with each
   * partner of sh[0, n) its bytes (out -> the peer's in) and this rank's
   * buffers bufs[0, nbufs) (device memory, NULL where none), which the
   * peer maps; *mapset holds the mappings made here until unshare. A
   * partner appears once and exchanges both ways; every rank calls it
   * with its partners at the same point (p2p over the host
   * communicator, with deadlines). */
  reshard_result_t (*share)(reshard_comm_t *comm, void *const *bufs, size_t nbufs, rs_share *sh, size_t n,
                            void **mapset);
  void (*unshare)(reshard_comm_t *comm, void *mapset);
  /* Whether an execute may be captured into a CUDA graph: every launch
   * of the graph then runs the same enqueued work again. A transport
   * whose enqueued work carries per-message state the host counts (CUDA
   * IPC's sequence numbers, kernels/rs_ipc.h) cannot be replayed. */
  int graphs;
};

#endif
