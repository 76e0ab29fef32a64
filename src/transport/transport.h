/* The seam between the executors and a transport. The host executor drives
 * any host transport (in-process threads, MPI, UCX) through these
 * operations and knows nothing else about it; a stream transport (NCCL,
 * CUDA IPC) fills the collective slots and stream_ops
 * (transport/stream.h) instead. Transports know no plan and no executor.
 *
 * Messages are matched by (source rank, destination rank, tag) and, for
 * equal keys, delivered in the order they were sent (MPI's non-overtaking
 * rule). Every blocking operation takes an absolute deadline in
 * nanoseconds of CLOCK_MONOTONIC (RS_NO_DEADLINE: none) and returns
 * RESHARD_ERROR_TIMEOUT when it passes. */
#ifndef RS_TRANSPORT_TRANSPORT_H
#define RS_TRANSPORT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

typedef struct rs_request rs_request; /* owned by the transport */
typedef struct rs_stream_ops rs_stream_ops; /* device transports only */
struct rs_copy;                             /* src/pack/copy.h */
struct rs_share;                            /* transport/stream.h */


/* The most words one allreduce_max_u64 carries (plan creation's first
 * agreement, src/plan/create_agree.c, is the largest); fixed so that device
 * transports can keep a preallocated scratch. */
#define RS_AGREE_MAX_WORDS 160

typedef struct rs_transport_ops {
  const char *name;
  /* Starts sending bytes from buf to peer; buf must stay valid until the
   * request completes. */
  reshard_result_t (*isend)(reshard_comm_t *comm, int peer, uint64_t tag,
                            const void *buf, size_t bytes, rs_request **req);
  /* Starts receiving exactly `bytes` bytes from peer into buf; a message of
   * another size is RESHARD_ERROR_MISMATCH when it completes. */
  reshard_result_t (*irecv)(reshard_comm_t *comm, int peer, uint64_t tag,
                            void *buf, size_t bytes, rs_request **req);
  /* Polls: *done = 1 and the request is freed when it has completed
   * (successfully or not: the result says which). */
  reshard_result_t (*test)(reshard_comm_t *comm, rs_request *req, int *done);
  /* Blocks until the request completes (and frees it) or the deadline
   * passes (the request then stays alive: cancel it). */
  reshard_result_t (*wait)(reshard_comm_t *comm, rs_request *req,
                           int64_t deadline_ns);
  /* Abandons a request on an error path and frees it; never blocks. */
  void (*cancel)(reshard_comm_t *comm, rs_request *req);
  /* Element-wise maximum of n values over all ranks of comm, in place.
   * Collective; used for plan agreement (digests, error flags, sizes,
   * phase estimates). Every transport takes n up to RS_AGREE_MAX_WORDS. */
  reshard_result_t (*allreduce_max_u64)(reshard_comm_t *comm, uint64_t *vals,
                                        int n, int64_t deadline_ns);
  /* Frees the transport's state of this communicator. */
  void (*destroy)(reshard_comm_t *comm);
  /* Optional. NULL where a collective that passed its deadline on one
   * rank is over on every rank (the in-process world breaks its
   * collectives, NCCL aborts its communicator): the rank that timed out
   * then knows its values reached nobody. Set where such a collective
   * stays pending and can still complete when the late ranks arrive
   * (MPI): *ticket 0 names the newest allreduce this rank abandoned and
   * is set to its number, a number names that one. Waits until it has
   * completed (*done = 1, vals = its n reduced values) or the deadline
   * passes (*done = 0). */
  reshard_result_t (*allreduce_late)(reshard_comm_t *comm, uint64_t *ticket, uint64_t *vals, int n,
                                     int64_t deadline_ns, int *done);
  /* Stream-ordered transports only (NCCL, CUDA IPC), NULL otherwise: their
   * plans get the device executor (plan/executor.h), which reaches them
   * through these; the message slots above (isend .. cancel, and the
   * boxes below) are NULL on such a transport, since only the host
   * executor calls them. */
  const rs_stream_ops *stream_ops;
  /* 1 where a rank can be replaced in a live communicator (UCX:
   * reshard_comm_ucx_rejoin), so that plans may be kept across it
   * (reshard_plan_rejoin); 0 elsewhere. */
  int replaces_ranks;
  /* Optional (NULL, or RESHARD_ERROR_UNSUPPORTED for a given message: the
   * executor then packs into staging). Sends, as one message of `bytes`
   * bytes, the source-side boxes of copies[0..n) in order, straight from
   * the buffers bases[copy->src_buf], the way MPI derived datatypes do:
   * no staging copy. irecv_boxes receives into the destination-side boxes
   * (bases[copy->dst_buf]). Same matching and completion as isend/irecv. */
  reshard_result_t (*isend_boxes)(reshard_comm_t *comm, int peer, uint64_t tag,
                                  const struct rs_copy *copies, uint32_t n,
                                  void *const *bases, size_t bytes,
                                  rs_request **req);
  reshard_result_t (*irecv_boxes)(reshard_comm_t *comm, int peer, uint64_t tag,
                                  const struct rs_copy *copies, uint32_t n,
                                  void *const *bases, size_t bytes,
                                  rs_request **req);
  /* Optional (UCX; NULL elsewhere): one-sided reads of the partners'
   * memory, for the host executor's registered buffers
   * (reshard_plan_register_buffers, exec/register.c). rma_share is
   * collective over the partners sh[0..n) (each calls it with this rank
   * among its own, in any order): it registers this rank's buffers
   * bufs[0..nbufs) (bytes[b] each; a NULL or empty one: none), sends each
   * partner sh[i].out and the keys of those registrations with `tag`,
   * and fills sh[i].in, in_bytes, nbufs, bufs and lens with the
   * partner's (rs_share, transport/stream.h); *set holds what it made
   * until rma_unshare. A rank that failed before passes bufs NULL and
   * nbufs 0, so that no partner waits for it. Table entry t counts the
   * partners' buffers in the order of sh: sh[0]'s first buffer is entry
   * 0. With keep (a set this rank's earlier rma_share made over the same
   * partners in the same order; NULL: none) the new set borrows from it:
   * a buffer of the same index, address and bytes as one keep registered
   * is not registered again, and a partner with sh[i].skip set is not
   * exchanged with (it skips this rank too): its table entries, keys and
   * sh[i].nbufs, bufs and lens come from keep (in stays NULL). rma_adopt
   * then hands what the new set borrowed over to it and frees the rest
   * of keep; rma_unshare of a set that did not adopt frees only what it
   * made (keep stays whole). rma_get starts reading `bytes` bytes at offset `off` of entry t
   * into `to` (MISMATCH past the registered bytes); rma_flush waits
   * until every read of the set has landed (or failed: BACKEND naming
   * the partner) or the deadline passes (TIMEOUT; reads still in flight
   * may land later: the caller fails its plan). */
  reshard_result_t (*rma_share)(reshard_comm_t *comm, uint64_t tag, void *const *bufs, const uint64_t *bytes,
                                size_t nbufs, struct rs_share *sh, size_t n, int64_t deadline_ns, void *keep,
                                void **set);
  void (*rma_adopt)(reshard_comm_t *comm, void *set, void *keep);
  reshard_result_t (*rma_get)(reshard_comm_t *comm, void *set, size_t t, uint64_t off, void *to, size_t bytes);
  reshard_result_t (*rma_flush)(reshard_comm_t *comm, void *set, int64_t deadline_ns);
  void (*rma_unshare)(reshard_comm_t *comm, void *set);
} rs_transport_ops;

struct reshard_comm {
  const rs_transport_ops *ops;
  int rank;
  int size;
  /* reshard_plan_create calls on this communicator so far: the same on
   * every rank, since the call is collective; it tells plans apart in
   * message tags, even plans of identical layouts. */
  uint32_t plans_created;
  /* Ranks this communicator has replaced (reshard_comm_ucx_rejoin; the
   * same on every rank, a newcomer's included): a plan made before the
   * latest replacement may take part in the newcomer's creation of it
   * (reshard_plan_rejoin) once. 0 on transports that replace no rank. */
  uint32_t rejoins;
  /* The ranks the latest rejoin replaced (sorted; malloc'd, freed with
   * the communicator), and on a newcomer 1 + the rejoins count it joined
   * at (0: created with the others). A kept plan's registration
   * (exec/register.c) trades keys again only with those ranks. */
  int32_t *replaced;
  int32_t nreplaced;
  uint32_t joined;
  /* Membership changes that renumbered the ranks (reshard_comm_ucx_resize)
   * this process took part in as a staying rank: plans made before one
   * are refused (plan.h resizes). Local to the process. */
  uint32_t resizes;
  void *impl; /* the transport's own state */
};

#endif
