/* GPU memory over UCX (issue 46): a stream transport for the device
 * executor whose transfers are UCP tagged messages of device memory,
 * over a UCX host communicator (reshard_ucx.h reshard_comm_create_ucx_cuda).
 *
 * UCX is host-driven: a transfer is posted and completed by the host,
 * not enqueued on a CUDA stream as NCCL's are. So a group waits (polled,
 * until the plan's deadline) for the work before it on its stream (the
 * round's packs), posts every receive and send of the group with the
 * staging pool's device pointers (a CUDA-enabled UCX moves them: CUDA IPC
 * inside a node, RDMA with GPUDirect across nodes, staged through host
 * memory elsewhere), and waits for all of them before returning, so that
 * whatever the executor enqueues after it (the unpacks) runs on data that
 * has landed. Every send is posted before anything waits, so groups pair
 * as NCCL's do whatever the interleaving. The executor's host thread is
 * held for the transfer; an execute returns once its last transfer has
 * landed (its last unpacks still queued on the stream), and it cannot be
 * captured into a CUDA graph (graphs 0).
 *
 * Messages of one communicator go with one tag (RS_UXC_TAG), in posting
 * order per pair of ranks (UCP keeps a sender's messages of one tag in
 * order), like NCCL's: after any failure the communicator is poisoned and
 * nothing pairs again. Plan agreement and the host collectives run over
 * the host communicator, which must outlive this one and keep its
 * membership: a rejoin or resize of it makes every call here refuse. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "reshard_ucx.h"
#include "transport/transport.h"

#ifndef RESHARD_HAVE_CUDA

reshard_result_t reshard_comm_create_ucx_cuda(reshard_comm_t *ucx, reshard_comm_t **out) {
  (void)ucx;
  rs_error_clear();
  if (out) *out = NULL;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "comm_create_ucx_cuda: this build of reshard has no CUDA backend "
                  "(configure with -DRESHARD_WITH_CUDA=ON)");
}

#else

#include <cuda_runtime.h>

#include "common/clock.h"
#include "cuda/cuda_util.h"
#include "kernels/rs_agree.h"
#include "transport/dev_comm.h"
#include "transport/stream.h"
#include "transport/ucx_internal.h"

/* reshard's 64-bit tag of every transfer (the host transport hashes it
 * with the sender's rank): a control tag no host plan makes (their
 * control kinds are small numbers, exec/exec_state.h). */
#define RS_UXC_TAG (((uint64_t)1 << 63) | ((uint64_t)0x7fff << 48) | ((uint64_t)0xffff << 32) | 0x75c7da7aull)

typedef struct rs_uxc {
  rs_dev_comm dev; /* first (src/transport/dev_comm.h) */
  reshard_comm_t *host;
  int device;
  int poisoned;
  uint32_t rejoins, resizes; /* the host's, at creation */
  int memtype;               /* device memory's, declared to UCP (rs_ux_device_memtype) */
  rs_request **reqs;         /* group: its requests (grown) */
  size_t reqs_cap;
  uint64_t *h_words;         /* reduce_words: pinned */
} rs_uxc;

static reshard_result_t uxc_health(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  if (x->poisoned)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: reshard's UCX (CUDA) communicator was poisoned after an "
                    "earlier failure (here or on a peer); destroy its plans and it, and create a new one", c->rank);
  if (rs_ux_failed(x->host)) return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: the UCX host communicator under "
                                             "this UCX (CUDA) communicator failed in a membership change; destroy "
                                             "both", c->rank);
  if (x->host->rejoins != x->rejoins || x->host->resizes != x->resizes || x->host->size != c->size)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: the UCX host communicator changed its membership "
                    "(reshard_comm_ucx_rejoin or _resize) after this UCX (CUDA) communicator was made over it; "
                    "destroy this one and its plans, and create them again on every rank", c->rank);
  return RESHARD_SUCCESS;
}

static reshard_result_t uxc_check(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  RS_CHECK(uxc_health(c));
  return rs_dev_comm_on_device(c, x->device);
}

/* Nothing of this rank's will pair again: the plans' gates close (the
 * launches queued behind a failed transfer write no destination byte).
 * The peers find out through their own deadlines or their agreement. */
static void uxc_poison(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  if (x->poisoned) return;
  rs_dev_comm_close_gates(&x->dev);
  x->poisoned = 1;
}

/* Waits for every request of reqs[0, n) until the deadline; on the first
 * failure cancels the rest. */
static reshard_result_t wait_all(reshard_comm_t *c, rs_request **reqs, size_t n, int64_t deadline) {
  rs_uxc *x = c->impl;
  reshard_comm_t *h = x->host;
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t i = 0; i < n; i++) {
    if (!reqs[i]) continue;
    if (!r) {
      r = h->ops->wait(h, reqs[i], deadline);
      if (r != RESHARD_ERROR_TIMEOUT) reqs[i] = NULL; /* completed (and freed), well or not */
    }
    if (reqs[i]) h->ops->cancel(h, reqs[i]);
    reqs[i] = NULL;
  }
  return r;
}

static reshard_result_t uxc_group(reshard_comm_t *c, const rs_p2p *ops, size_t n, void *stream, int64_t deadline,
                                  void *gate) {
  (void)gate; /* a failure returns before anything after it is enqueued; poison closes the gates */
  rs_uxc *x = c->impl;
  if (n == 0) return RESHARD_SUCCESS;
  RS_CHECK(uxc_health(c));
  if (n > x->reqs_cap) { /* grows to the largest round once, not per call */
    rs_request **q = realloc(x->reqs, n * sizeof *q);
    if (!q) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
    x->reqs = q;
    x->reqs_cap = n;
  }
  /* the round's packs, and whatever the caller queued before them */
  RS_CHECK(rs_dev_comm_wait(c, stream, NULL, deadline, "cudaStreamQuery(a round's packs)",
                            "the packs before a UCX transfer did not finish by the plan's deadline"));
  reshard_comm_t *h = x->host;
  reshard_result_t r = RESHARD_SUCCESS;
  memset(x->reqs, 0, n * sizeof *x->reqs);
  /* receives first, then sends: a sender's message never waits
   * unexpected for a receive this rank posts in the same group */
  for (int pass = 0; pass < 2 && !r; pass++)
    for (size_t i = 0; i < n && !r; i++) {
      const rs_p2p *o = &ops[i];
      if (o->is_recv != !pass) continue;
      if (o->peer < 0 || o->peer >= c->size || o->peer == c->rank)
        r = rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a transfer to peer %d (self-sends are local copies)",
                     c->rank, o->peer);
      else
        r = rs_ux_post_mem(h, o->peer, RS_UXC_TAG, o->buf, (size_t)o->bytes, o->is_recv, x->memtype, &x->reqs[i]);
    }
  if (r) {
    for (size_t i = 0; i < n; i++)
      if (x->reqs[i]) h->ops->cancel(h, x->reqs[i]), x->reqs[i] = NULL;
    return r;
  }
  r = wait_all(c, x->reqs, n, deadline);
  if (r == RESHARD_ERROR_TIMEOUT)
    return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: a UCX transfer of GPU memory did not complete by the plan's "
                    "deadline (a partner stopped or never called)", c->rank);
  return r;
}

/* The max of n words (device memory) over every rank: the stream's work
 * first, then the words through the host, the host communicator's
 * collective, and back. */
static reshard_result_t uxc_reduce_words(reshard_comm_t *c, uint64_t *words, uint32_t n, void *stream,
                                         int64_t deadline, void *gate) {
  (void)gate;
  rs_uxc *x = c->impl;
  if (n < 1 || n > RS_COMMIT_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a reduction of %u words", c->rank, n);
  RS_CHECK(uxc_health(c));
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t ce = cudaMemcpyAsync(x->h_words, words, 8 * (size_t)n, cudaMemcpyDeviceToHost, s);
  if (ce) return rs_cuda_error(ce, "cudaMemcpyAsync(words to reduce)", c->rank);
  RS_CHECK(rs_dev_comm_wait(c, stream, NULL, deadline, "cudaStreamQuery(words to reduce)",
                            "the work before a reduction did not finish by the plan's deadline"));
  reshard_comm_t *h = x->host;
  reshard_result_t r = h->ops->allreduce_max_u64(h, x->h_words, (int)n, deadline);
  if (r) return r;
  ce = cudaMemcpyAsync(words, x->h_words, 8 * (size_t)n, cudaMemcpyHostToDevice, s);
  if (ce) return rs_cuda_error(ce, "cudaMemcpyAsync(reduced words)", c->rank);
  /* h_words is reused by the next reduction: the copy must have read it */
  return rs_dev_comm_wait(c, stream, NULL, deadline, "cudaStreamQuery(reduced words)",
                          "the copy of a reduction's result did not finish by the plan's deadline");
}

static reshard_result_t uxc_pool_alloc(reshard_comm_t *c, size_t bytes, void **out) {
  cudaError_t ce = cudaMalloc(out, bytes);
  if (ce) {
    *out = NULL;
    return rs_cuda_error(ce, "cudaMalloc(staging pool)", c->rank);
  }
  return RESHARD_SUCCESS;
}

static void uxc_pool_free(reshard_comm_t *c, void *p) {
  (void)c;
  cudaFree(p);
}

static reshard_result_t uxc_allreduce(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline) {
  rs_uxc *x = c->impl;
  RS_CHECK(uxc_health(c));
  return x->host->ops->allreduce_max_u64(x->host, vals, n, deadline);
}

static void uxc_release(rs_uxc *x) {
  free(x->reqs);
  if (x->h_words) cudaFreeHost(x->h_words);
}

static void uxc_destroy(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  if (!x) return;
  /* The last execute's transfers are over (they completed on the host);
   * its last unpacks may still read the pool: wait for them until its
   * deadline (past it the memory is freed under nothing of ours, since
   * no message of this communicator can land any more). */
  if (x->dev.have_last)
    rs_dev_comm_wait(c, NULL, x->dev.last_end, rs_dev_comm_busy_until(c), "cudaEventQuery(last execute)",
                     "the last execute's unpacks did not finish by its deadline");
  rs_dev_comm_fini(c);
  uxc_release(x);
  free(x);
  c->impl = NULL;
}

static const rs_dev_comm_hooks rs_uxc_hooks = {
    .name = "UCX (CUDA)",
    .health = uxc_health,
    .poison = uxc_poison,
    .pool_alloc = uxc_pool_alloc,
    .pool_free = uxc_pool_free,
};

static const rs_stream_ops rs_uxc_stream_ops = {
    .group = uxc_group,
    .reduce_words = uxc_reduce_words,
    .check = uxc_check,
    .poison = uxc_poison,
    .graphs = 0, /* a group waits on the host */
};

static const rs_transport_ops rs_uxc_ops = {
    .name = "ucx_cuda",
    .allreduce_max_u64 = uxc_allreduce,
    .destroy = uxc_destroy,
    .stream_ops = &rs_uxc_stream_ops,
};

reshard_result_t reshard_comm_create_ucx_cuda(reshard_comm_t *ucx, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx_cuda: out is NULL");
  *out = NULL;
  if (!ucx || !ucx->ops) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx_cuda: ucx is NULL");
  if (ucx->ops != &rs_ux_ops)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx_cuda: ucx must be a UCX communicator "
                    "(reshard_comm_create_ucx), not '%s'", ucx->ops->name);
  /* This rank's part; the agreement below makes it all or nothing. */
  reshard_result_t r = RESHARD_SUCCESS;
  const int memtype = rs_ux_device_memtype(ucx);
  if (rs_ux_failed(ucx)) r = rs_ux_refuse_failed(ucx);
  else if (memtype < 0)
    r = rs_error(RESHARD_ERROR_UNSUPPORTED, "comm_create_ucx_cuda rank %d: the UCX this process loaded moves no CUDA "
                 "memory (ucp_context_query lists no CUDA memory type: a UCX built without CUDA, as Debian's is, "
                 "or no GPU driver); load a CUDA-enabled UCX (e.g. the libucx-cu13 wheel's libraries first on "
                 "LD_LIBRARY_PATH)", ucx->rank);
  reshard_comm_t *c = NULL;
  rs_uxc *x = NULL;
  if (!r) {
    c = calloc(1, sizeof *c);
    x = calloc(1, sizeof *x);
    if (!c || !x) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx_cuda: out of memory");
  }
  if (!r) {
    c->rank = ucx->rank;
    c->size = ucx->size;
    c->impl = x;
    x->host = ucx;
    x->rejoins = ucx->rejoins;
    x->resizes = ucx->resizes;
    x->memtype = memtype;
    cudaError_t ce = cudaGetDevice(&x->device);
    if (!ce) ce = cudaMallocHost((void **)&x->h_words, 8 * RS_COMMIT_WORDS);
    if (ce) r = rs_cuda_error(ce, "comm_create_ucx_cuda: CUDA setup", c->rank);
    else r = rs_dev_comm_init(c, &rs_uxc_hooks);
  }
  /* every rank learns whether any failed: all get a communicator or none */
  uint64_t bad = r != RESHARD_SUCCESS;
  reshard_result_t ra = ucx->ops->allreduce_max_u64(ucx, &bad, 1, rs_deadline_after_ms(60000));
  if (!r && ra) r = ra;
  else if (!r && bad)
    r = rs_error(RESHARD_ERROR_REMOTE, "comm_create_ucx_cuda rank %d: another rank failed to create its "
                 "communicator", c->rank);
  if (r) {
    if (x && x->dev.hooks) rs_dev_comm_fini(c);
    if (x) uxc_release(x);
    free(x);
    free(c);
    return r;
  }
  c->ops = &rs_uxc_ops;
  *out = c;
  return RESHARD_SUCCESS;
}

#endif
