/* The device executor's prepare_peers: the transport's own connections,
 * then the plan's headers and agreement with its partners
 * (connect_peers). Apart because it is collective, unlike the rest of the
 * setup. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "transport/dev_comm.h"
#include "device/device.h"
#include "device/device_internal.h"
#include "exec/direct.h"
#include "kernels/rs_kernels.h"
#include "exec/exec_state.h"
#include "exec/schedule.h"
#include "plan/quant.h"
#include "transport/stream.h"

/* NCCL connects a peer lazily, inside the first ncclGroupEnd that names
 * it, and then sets up every point-to-point channel of that peer and
 * direction whatever the message size (NCCL src/enqueue.cc, the p2p task
 * append: "Mark channels that need pre-connect"). A one-byte exchange
 * with each of the plan's peers, in the plan's directions, while every
 * rank is in plan creation, makes the first execute connect nothing: a
 * peer that comes late to it only delays the GPU. */
static reshard_result_t connect_peers(reshard_plan_t *p) {
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  rs_dev *d = p->device;
  if (!d || (!(p->nsends + p->nrecvs) && !d->global && !d->dbuf)) return RESHARD_SUCCESS;
  reshard_result_t r = rs_dev_comm_drain(p->comm); /* the pool is about to be used */
  if (r) return r;
  size_t n = 2 * p->npeers;
  rs_p2p *ops = calloc(n + 1, sizeof *ops);
  unsigned char *seen = calloc((size_t)p->comm->size, 2);
  if (!ops || !seen) {
    free(ops);
    free(seen);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory", p->rank);
  }
  unsigned char *pool = NULL;
  r = rs_dev_comm_begin(p->comm, d->s[S_XFER], (void **)&pool);
  /* Both directions with every partner, not only the plan's: the
   * agreement headers go both ways (NCCL connects each direction on its
   * own). */
  size_t k = 0, nrecv = 0;
  for (size_t i = 0; !r && i < n; i++) {
    int peer = p->peers[i / 2].peer, recv = (int)(i % 2);
    unsigned char *mark = &seen[2 * (size_t)peer + (size_t)recv];
    if (*mark) continue;
    *mark = 1;
    /* receives into distinct bytes after the one every send reads */
    unsigned char *buf = recv ? pool + 1 + nrecv++ % (d->staging_bytes - 1) : pool;
    ops[k++] = (rs_p2p){peer, recv, buf, 1};
  }
  int64_t deadline = rs_deadline_after_ms(p->opts.timeout_ms);
  d->last_deadline = deadline == RS_NO_DEADLINE ? INT64_MAX : deadline;
  if (!r) r = so->group(p->comm, ops, k, d->s[S_XFER], deadline, d->d_agree);
  /* relay plans: the verdict's reduction over every rank, once, so that
   * its connections are made here too */
  if (!r && (d->global || d->dbuf))
    r = so->reduce_words(p->comm, d->d_word, d->dbuf ? RS_COMMIT_WORDS : 1, d->s[S_XFER], deadline, d->d_agree);
  if (!r) r = rs_dev_comm_end(p->comm, d->s[S_XFER], deadline);
  if (!r) r = rs_dev_comm_drain(p->comm);
  /* a transport whose waits give up on the device (CUDA IPC) closed the
   * gate instead of failing the drain: that is a peer that did not come */
  if (!r && d->d_agree) {
    rs_dev_agree a;
    cudaError_t ce = cudaMemcpy(&a, d->d_agree, sizeof a, cudaMemcpyDeviceToHost);
    if (ce) r = rs_cuda_error(ce, "cudaMemcpy(connection verdict)", p->rank);
    else if (!a.ok)
      r = rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: connecting to rank %d did not complete within the plan's timeout",
                   p->rank, (int)(int64_t)a.got.digest);
  }
  free(ops);
  free(seen);
  if (r) {
    so->poison(p->comm);
    rs_error_prefix("plan_create rank %d (connecting the plan's peers): ", p->rank);
  }
  return r;
}

/* prepare_peers: the transport's own connections first (collective on
 * every rank, partners or not), then the plan's. */
reshard_result_t device_prepare_peers(reshard_plan_t *p) {
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  if (so->connect) RS_CHECK(so->connect(p->comm));
  return connect_peers(p);
}
