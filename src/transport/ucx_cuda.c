/* GPU memory over UCX (issue 46): a stream transport for the device
 * executor whose transfers are UCP tagged messages of device memory,
 * over a UCX host communicator (reshard_ucx.h reshard_comm_create_ucx_cuda).
 *
 * UCX is host-driven: a transfer is posted and completed by the host,
 * not enqueued on a CUDA stream as NCCL's are. So a round's group
 * (group_async, transport/stream.h) waits (polled, until the plan's
 * deadline) for the work before it on its stream (the round's packs, and
 * the unpack that last read the receive half it reuses), posts every
 * receive and send of the group with the staging pool's device pointers
 * and their memory type (a CUDA-enabled UCX moves them: CUDA IPC inside a
 * node, RDMA with GPUDirect across nodes), or, through a UCX that moves
 * no CUDA memory, with pinned host copies of them ("bounce": a mirror of
 * each pool, an arena for other buffers; the sends copied on the stream
 * before that wait, the receives copied back when settled), and returns; the executor settles it (waits for its
 * messages) before it enqueues what reads its receives or rewrites its
 * sends, one round later in the schedule's walk: so round k's messages
 * travel while the host enqueues, and the GPU runs, the next round's pack
 * and the previous round's unpack. Every send is posted before anything
 * waits, so groups pair as NCCL's do whatever the interleaving. The other
 * groups (the agreement's headers) are posted and settled at once. The
 * executor's host thread is held for each settle, and an execute cannot
 * be captured into a CUDA graph (graphs 0). Each staging pool (or its
 * mirror) is registered with UCX when it is allocated (ucp_mem_map) and
 * that handle goes with every message in it (region, below).
 *
 * Tags. A message's tag holds this communicator's number (agreed at
 * creation: every UCX (CUDA) communicator over one host communicator has
 * its own) and its place among the messages of its pair and direction
 * (counted on both ends, in the posting order both ends share), so that
 * messages pair as NCCL's do, in order per pair, and nothing of another
 * communicator over the same host, or of one destroyed after a failure,
 * ever pairs with this one's. The reduction of words (relay plans'
 * global agreement, the commit's vote) is messages of this communicator
 * too, not the host's collectives. Plan agreement at creation runs over
 * the host communicator, which must outlive this one and keep its
 * membership: a rejoin or resize of it makes every call here refuse.
 *
 * Failure. A failed call poisons the communicator, which ends the
 * requests still pending (cancelled, the worker driven for a grace
 * second); one UCX still runs (a rendezvous transfer with a live peer)
 * keeps the staging pool (and its mirror), the arena and the reduction's
 * words from ever being freed (leaked, as for GPU work that never ended:
 * dev_comm.h pool_abandoned). The plans' gates close,
 * later calls refuse.
 *
 * Threads: one lock keeps the transport's own state whole (a call of
 * another thread waits for it), but executes of one communicator's plans
 * must not run at once from several threads, as on NCCL: they share the
 * staging pool, and messages pair in the order each rank posts them. */
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
#include <pthread.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/vec.h"
#include "cuda/cuda_util.h"
#include "kernels/rs_agree.h"
#include "transport/dev_comm.h"
#include "transport/stream.h"
#include "transport/ucx_internal.h"

/* reshard's 64-bit tag of a message (the host transport hashes it with
 * the sender's rank and its membership epoch): a marker, the
 * communicator's number, the message's place in its pair and direction. */
static uint64_t msg_tag(uint64_t id, uint64_t seq) {
  return (uint64_t)0xd5 << 56 | (id & 0xffffffull) << 32 | (seq & 0xffffffffull);
}

/* How long a failed group drives its cancelled requests to an end. */
#define SETTLE_NS 1000000000ll

typedef struct pending {
  rs_request *req;
  uint64_t ticket; /* its group's */
  /* bounce: a receive's host copy and its device place (copied there once
   * it landed; dev NULL: nothing to copy) */
  void *dev, *host;
  uint64_t bytes;
} pending;

/* A staging pool (device memory, reshard's own) and, in a bounce, its
 * pinned host mirror of the same size; memh: UCX's registration of the
 * memory its messages use (the pool, or the mirror), made when the pool
 * is (rs_ux_mem_map) and released before it is freed (NULL where UCX
 * could not: its messages then register as they go). With it, the pool
 * is registered once, when a plan is created, not by the messages of the
 * first execute, one region at a time. (UCX's registration cache still
 * holds it: a pool freed and another allocated at the same address rely,
 * as before, on UCX's memory hooks seeing the statically linked runtime's
 * cudaFree, which has not been checked on a GPU.) */
typedef struct region {
  unsigned char *dev, *host;
  size_t bytes;
  void *memh;
  struct region *next;
} region;

typedef struct rs_uxc {
  rs_dev_comm dev; /* first (src/transport/dev_comm.h) */
  reshard_comm_t *host;
  pthread_mutex_t mu; /* every call (recursive: a wait past its deadline poisons) */
  int mu_ok;
  int device;
  int poisoned;
  uint32_t rejoins, resizes; /* the host's, at creation */
  int memtype;               /* declared to UCP: device memory's (rs_ux_device_memtype), HOST for a bounce */
  uint64_t id;               /* this communicator's number over its host */
  uint64_t *sent, *recvd;    /* messages posted to / from each rank so far */
  pending *pend;             /* posted, not yet completed, oldest first */
  size_t npend, pend_cap;
  uint64_t tickets;          /* groups posted so far (the newest one's ticket) */
  /* bounce (a UCX that moves no CUDA memory): messages go through pinned
   * host memory, copied from the device after the packs and to it before
   * the unpacks: the pools' mirrors, and for other buffers (the
   * agreement's headers) an arena reset when nothing is pending */
  int bounce;
  region *regions; /* the staging pools */
  unsigned char *arena;
  size_t arena_bytes, arena_used;
  unsigned char **spent; /* arenas outgrown while messages were pending */
  size_t nspent;
  void **hbuf;           /* a group's host bytes (bounce_out) */
  size_t hbuf_cap;
  cudaStream_t h2d;      /* the receives' copies to the device */
  uint64_t *h_words;         /* reduce_words: this rank's and every rank's (pinned) */
  int words_kept;            /* a transfer of a failed call still ran: never freed */
  rs_p2p *red;               /* reduce_words' messages, 2 per other rank */
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

/* Every pending request ends for good (rs_ux_settle: cancelled, driven
 * for a second); one UCX still runs pins the staging pool (never freed:
 * dev_comm.h pool_abandoned). Under x->mu. */
static void abandon_pending(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  int running = 0;
  const int64_t until = rs_now_ns() + SETTLE_NS;
  for (size_t i = 0; i < x->npend; i++) running += !rs_ux_settle(x->host, x->pend[i].req, until);
  x->npend = 0;
  if (running) {
    x->dev.pool_abandoned = 1;
    x->words_kept = 1;
    RS_LOG(RS_LOG_WARN, RS_SUBSYS_TRANSPORT, "rank %d: %d UCX transfer(s) of a failed call still run after a "
           "second: the staging pool is kept, never freed", c->rank, running);
  }
}

/* Nothing of this rank's will pair again: its transfers in flight end
 * (abandon_pending), the plans' gates close (the launches queued behind
 * a failed transfer write no destination byte). The peers find out
 * through their own deadlines or their agreement. */
static void uxc_poison(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  pthread_mutex_lock(&x->mu);
  if (!x->poisoned) {
    abandon_pending(c);
    rs_dev_comm_close_gates(&x->dev);
    x->poisoned = 1;
  }
  pthread_mutex_unlock(&x->mu);
}

/* bounce: the pinned host bytes standing for `bytes` device bytes at
 * dev: the same offset in a pool's mirror, or a piece of the arena. */
static reshard_result_t host_side(reshard_comm_t *c, void *dev, uint64_t bytes, void **out) {
  rs_uxc *x = c->impl;
  const unsigned char *d = dev;
  for (region *m = x->regions; m; m = m->next)
    if (m->host && d >= m->dev && d + bytes <= m->dev + m->bytes) {
      *out = m->host + (d - m->dev);
      return RESHARD_SUCCESS;
    }
  const size_t need = ((size_t)bytes + 63) & ~(size_t)63;
  if (x->arena_used + need > x->arena_bytes) {
    size_t cap = x->arena_bytes ? 2 * x->arena_bytes : (size_t)64 << 10;
    while (cap < x->arena_used + need) cap *= 2;
    unsigned char *a = NULL;
    cudaError_t ce = cudaMallocHost((void **)&a, cap);
    if (ce) return rs_cuda_error(ce, "cudaMallocHost(UCX bounce arena)", c->rank);
    unsigned char **sp = x->arena ? realloc(x->spent, (x->nspent + 1) * sizeof *sp) : x->spent;
    if (x->arena && !sp) {
      cudaFreeHost(a);
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
    }
    if (x->arena) x->spent = sp, x->spent[x->nspent++] = x->arena; /* pending messages may use it */
    x->arena = a, x->arena_bytes = cap, x->arena_used = 0;
  }
  *out = x->arena + x->arena_used;
  x->arena_used += need;
  return RESHARD_SUCCESS;
}

/* bounce: nothing pending any more uses the arena's bytes. */
static void arena_reset(rs_uxc *x) {
  for (size_t i = 0; i < x->nspent; i++) cudaFreeHost(x->spent[i]);
  x->nspent = 0;
  x->arena_used = 0;
}

/* bounce: every message's pinned host bytes into x->hbuf (NULL for an
 * empty one), and the sends' device bytes copied there on `stream`,
 * after its work (the packs); the caller's polled wait on the stream then
 * covers the copies. Under x->mu. */
static reshard_result_t bounce_out(reshard_comm_t *c, const rs_p2p *ops, size_t n, void *stream) {
  rs_uxc *x = c->impl;
  if (x->npend == 0) arena_reset(x);
  if (rs_vec_reserve((void **)&x->hbuf, &x->hbuf_cap, n, sizeof *x->hbuf))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  for (size_t i = 0; i < n; i++) {
    x->hbuf[i] = NULL;
    if (!ops[i].bytes) continue;
    RS_CHECK(host_side(c, ops[i].buf, ops[i].bytes, &x->hbuf[i]));
    cudaError_t ce = ops[i].is_recv ? cudaSuccess
                                    : cudaMemcpyAsync(x->hbuf[i], ops[i].buf, (size_t)ops[i].bytes,
                                                      cudaMemcpyDeviceToHost, (cudaStream_t)stream);
    if (ce) return rs_cuda_error(ce, "cudaMemcpyAsync(a UCX send to its host bounce)", c->rank);
  }
  return RESHARD_SUCCESS;
}

/* The registration (region.memh) of the pool, or of the mirror, that
 * holds [buf, buf + bytes); NULL: none (another buffer, or UCX could not
 * register it). */
static void *registration(const rs_uxc *x, const void *buf, uint64_t bytes) {
  const unsigned char *b = buf;
  for (const region *m = x->regions; m; m = m->next) {
    const unsigned char *base = m->host ? m->host : m->dev;
    if (b >= base && b + bytes <= base + m->bytes) return m->memh;
  }
  return NULL;
}

/* Posts ops[0, n) (receives first, then sends, each in its order: the
 * order both ends of a pair share) with this communicator's tags, buffers
 * of memtype (hbuf: a bounce's host bytes standing for them, bounce_out),
 * as group *ticket. Under x->mu. */
static reshard_result_t post(reshard_comm_t *c, const rs_p2p *ops, size_t n, int memtype, void *const *hbuf,
                             uint64_t *ticket) {
  rs_uxc *x = c->impl;
  /* (grows to the largest need once, not per call) */
  if (rs_vec_reserve((void **)&x->pend, &x->pend_cap, x->npend + n, sizeof *x->pend))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  const uint64_t t = ++x->tickets;
  *ticket = t;
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < n; i++) {
      const rs_p2p *o = &ops[i];
      if (o->is_recv != !pass) continue;
      if (o->peer < 0 || o->peer >= c->size || o->peer == c->rank)
        return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a transfer to peer %d (self-sends are local copies)",
                        c->rank, o->peer);
      void *buf = hbuf && hbuf[i] ? hbuf[i] : o->buf;
      uint64_t *count = o->is_recv ? &x->recvd[o->peer] : &x->sent[o->peer];
      rs_request *q = NULL;
      RS_CHECK(rs_ux_post_mem(x->host, o->peer, msg_tag(x->id, (*count)++), buf, (size_t)o->bytes, o->is_recv,
                              memtype, registration(x, buf, o->bytes), &q));
      x->pend[x->npend++] = (pending){q, t, hbuf && hbuf[i] && o->is_recv ? o->buf : NULL, buf, o->bytes};
    }
  return RESHARD_SUCCESS;
}

/* Completes every pending request of the groups up to `ticket`, oldest
 * first, until the deadline; bounce: the received bytes go to their
 * device places (on x->h2d, waited for with the same deadline) before it
 * returns, so before anything the executor enqueues after this settle
 * reads them. Under x->mu. */
static reshard_result_t complete(reshard_comm_t *c, uint64_t ticket, int64_t deadline) {
  rs_uxc *x = c->impl;
  reshard_comm_t *h = x->host;
  size_t done = 0, copies = 0;
  reshard_result_t r = RESHARD_SUCCESS;
  while (done < x->npend && x->pend[done].ticket <= ticket) {
    pending *q = &x->pend[done];
    r = h->ops->wait(h, q->req, deadline);
    if (r == RESHARD_ERROR_TIMEOUT) break; /* (still pending) */
    done++;                                /* completed (and freed), well or not */
    if (r) break;
    cudaError_t ce = q->dev ? cudaMemcpyAsync(q->dev, q->host, (size_t)q->bytes, cudaMemcpyHostToDevice, x->h2d)
                            : cudaSuccess;
    if (ce) {
      r = rs_cuda_error(ce, "cudaMemcpyAsync(a UCX receive from its host bounce)", c->rank);
      break;
    }
    copies += q->dev != NULL;
  }
  if (done) {
    memmove(x->pend, x->pend + done, (x->npend - done) * sizeof *x->pend);
    x->npend -= done;
  }
  if (r == RESHARD_ERROR_TIMEOUT)
    return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: a UCX transfer of GPU memory did not complete by the plan's "
                    "deadline (a partner stopped or never called)", c->rank);
  /* (past the deadline this poisons, which abandons what is still
   * pending: x->pend is consistent again by now) */
  if (copies) {
    reshard_result_t rw = rs_dev_comm_wait(c, x->h2d, NULL, deadline, "cudaStreamQuery(UCX receives to the device)",
                                           "the copies of UCX receives to the device did not finish by the plan's "
                                           "deadline");
    if (!r) r = rw;
  }
  return r;
}

static reshard_result_t uxc_group_async(reshard_comm_t *c, const rs_p2p *ops, size_t n, void *stream,
                                        int64_t deadline, void *gate, uint64_t *ticket) {
  (void)gate; /* a failure poisons the communicator, which closes the gates */
  rs_uxc *x = c->impl;
  pthread_mutex_lock(&x->mu);
  *ticket = x->tickets; /* (nothing new to settle for an empty group) */
  reshard_result_t r = n ? uxc_health(c) : RESHARD_SUCCESS;
  /* what the stream waits for before the group: the round's packs, the
   * unpack that last read the receive half it reuses */
  if (n && !r && x->bounce) r = bounce_out(c, ops, n, stream);
  if (n && !r) r = rs_dev_comm_wait(c, stream, NULL, deadline, "cudaStreamQuery(a round's packs)",
                                    "the work before a UCX transfer did not finish by the plan's deadline");
  if (n && !r) r = post(c, ops, n, x->memtype, x->bounce ? x->hbuf : NULL, ticket);
  pthread_mutex_unlock(&x->mu);
  return r;
}

static reshard_result_t uxc_settle(reshard_comm_t *c, uint64_t ticket, int64_t deadline) {
  rs_uxc *x = c->impl;
  pthread_mutex_lock(&x->mu);
  /* poisoned since the group was posted (another thread's failure or
   * status poll): its requests were abandoned, not completed */
  reshard_result_t r = x->poisoned ? uxc_health(c) : complete(c, ticket, deadline);
  pthread_mutex_unlock(&x->mu);
  return r;
}

static reshard_result_t uxc_group(reshard_comm_t *c, const rs_p2p *ops, size_t n, void *stream, int64_t deadline,
                                  void *gate) {
  uint64_t t = 0;
  RS_CHECK(uxc_group_async(c, ops, n, stream, deadline, gate, &t));
  return uxc_settle(c, t, deadline);
}

/* The max of n words (device memory) over every rank: the stream's work
 * first, then the words through pinned host memory to every other rank
 * and back, as messages of this communicator. */
static reshard_result_t uxc_reduce_words(reshard_comm_t *c, uint64_t *words, uint32_t n, void *stream,
                                         int64_t deadline, void *gate) {
  (void)gate;
  rs_uxc *x = c->impl;
  if (n < 1 || n > RS_COMMIT_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a reduction of %u words", c->rank, n);
  if (c->size == 1) return RESHARD_SUCCESS;
  pthread_mutex_lock(&x->mu);
  cudaStream_t s = (cudaStream_t)stream;
  uint64_t *mine = x->h_words, *theirs = x->h_words + RS_COMMIT_WORDS;
  reshard_result_t r = uxc_health(c);
  if (!r) {
    cudaError_t ce = cudaMemcpyAsync(mine, words, 8 * (size_t)n, cudaMemcpyDeviceToHost, s);
    if (ce) r = rs_cuda_error(ce, "cudaMemcpyAsync(words to reduce)", c->rank);
  }
  if (!r) r = rs_dev_comm_wait(c, stream, NULL, deadline, "cudaStreamQuery(words to reduce)",
                               "the work before a reduction did not finish by the plan's deadline");
  size_t k = 0;
  for (int p = 0; !r && p < c->size; p++) {
    if (p == c->rank) continue;
    x->red[k++] = (rs_p2p){.peer = p, .is_recv = 1, .buf = theirs + (size_t)p * RS_COMMIT_WORDS, .bytes = 8 * n};
    x->red[k++] = (rs_p2p){.peer = p, .is_recv = 0, .buf = mine, .bytes = 8 * n};
  }
  uint64_t t = 0;
  if (!r) r = post(c, x->red, k, (int)UCS_MEMORY_TYPE_HOST, NULL, &t);
  if (!r) r = complete(c, t, deadline);
  for (int p = 0; !r && p < c->size; p++)
    for (uint32_t w = 0; p != c->rank && w < n; w++)
      if (theirs[(size_t)p * RS_COMMIT_WORDS + w] > mine[w]) mine[w] = theirs[(size_t)p * RS_COMMIT_WORDS + w];
  if (!r) {
    cudaError_t ce = cudaMemcpyAsync(words, mine, 8 * (size_t)n, cudaMemcpyHostToDevice, s);
    if (ce) r = rs_cuda_error(ce, "cudaMemcpyAsync(reduced words)", c->rank);
  }
  /* the pinned words are reused by the next reduction: the copy must have read them */
  if (!r) r = rs_dev_comm_wait(c, stream, NULL, deadline, "cudaStreamQuery(reduced words)",
                               "the copy of a reduction's result did not finish by the plan's deadline");
  pthread_mutex_unlock(&x->mu);
  return r;
}

static reshard_result_t uxc_pool_alloc(reshard_comm_t *c, size_t bytes, void **out) {
  rs_uxc *x = c->impl;
  *out = NULL;
  void *p = NULL;
  cudaError_t ce = cudaMalloc(&p, bytes);
  if (ce) return rs_cuda_error(ce, "cudaMalloc(staging pool)", c->rank);
  region *m = calloc(1, sizeof *m);
  if (!m) {
    cudaFree(p);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  }
  if (x->bounce && (ce = cudaMallocHost((void **)&m->host, bytes))) {
    free(m);
    cudaFree(p);
    return rs_cuda_error(ce, "cudaMallocHost(the staging pool's host bounce)", c->rank);
  }
  m->dev = p, m->bytes = bytes;
  m->memh = x->bounce ? rs_ux_mem_map(x->host, m->host, bytes, (int)UCS_MEMORY_TYPE_HOST)
                      : rs_ux_mem_map(x->host, p, bytes, x->memtype);
  pthread_mutex_lock(&x->mu);
  m->next = x->regions, x->regions = m;
  pthread_mutex_unlock(&x->mu);
  *out = p;
  return RESHARD_SUCCESS;
}

/* (dev_comm frees a pool only once nothing uses it: an abandoned one,
 * which a transfer may still use, is never freed, nor its region) */
static void uxc_pool_free(reshard_comm_t *c, void *p) {
  rs_uxc *x = c->impl;
  pthread_mutex_lock(&x->mu);
  for (region **at = &x->regions; *at; at = &(*at)->next)
    if ((*at)->dev == p) {
      region *m = *at;
      *at = m->next;
      rs_ux_mem_unmap(x->host, m->memh);
      if (m->host) cudaFreeHost(m->host);
      free(m);
      break;
    }
  pthread_mutex_unlock(&x->mu);
  cudaFree(p);
}

static reshard_result_t uxc_allreduce(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline) {
  rs_uxc *x = c->impl;
  RS_CHECK(uxc_health(c));
  return x->host->ops->allreduce_max_u64(x->host, vals, n, deadline);
}

static void uxc_release(rs_uxc *x) {
  /* the pools left are abandoned ones (dev_comm freed the others): a
   * transfer may still use them, so their memory stays (leaked) and their
   * registrations go with the host communicator (rs_ux_mem_map) */
  for (region *m = x->regions, *next; m; m = next) {
    next = m->next;
    free(m);
  }
  x->regions = NULL;
  free(x->pend);
  free(x->hbuf);
  if (x->h2d) cudaStreamDestroy(x->h2d);
  if (!x->words_kept) { /* (else: a transfer of a failed call may still use them) */
    arena_reset(x);
    if (x->arena) cudaFreeHost(x->arena);
  }
  free(x->spent);
  free(x->sent);
  free(x->recvd);
  free(x->red);
  if (x->h_words && !x->words_kept) cudaFreeHost(x->h_words);
  if (x->mu_ok) pthread_mutex_destroy(&x->mu);
}

static void uxc_destroy(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  if (!x) return;
  /* An execute's transfers completed before its last unpacks were
   * enqueued, or were abandoned when it failed (a running one pinned the
   * pool); nothing should be left, but nothing is freed under UCX. */
  pthread_mutex_lock(&x->mu);
  abandon_pending(c);
  pthread_mutex_unlock(&x->mu);
  /* its last unpacks may still read the pool: wait for them until its
   * deadline, poisoned or not */
  if (x->dev.have_last) {
    const int64_t deadline = rs_dev_comm_busy_until(c);
    for (unsigned spin = 0; rs_cuda_query(NULL, x->dev.last_end) == cudaErrorNotReady && rs_now_ns() < deadline;
         spin++)
      rs_nap(spin);
  }
  rs_dev_comm_fini(c);
  uxc_release(x);
  free(x);
  c->impl = NULL;
}

/* Between the polls of a wait on the GPU (the next round's pack), the
 * rounds in flight move on: UCP's rendezvous handshakes and host-staged
 * pipelines advance only when the worker is driven. */
static void uxc_idle(reshard_comm_t *c) {
  rs_uxc *x = c->impl;
  if (__atomic_load_n(&x->npend, __ATOMIC_RELAXED)) rs_ux_progress(x->host);
}

static const rs_dev_comm_hooks rs_uxc_hooks = {
    .name = "UCX (CUDA)",
    .idle = uxc_idle,
    .health = uxc_health,
    .poison = uxc_poison,
    .pool_alloc = uxc_pool_alloc,
    .pool_free = uxc_pool_free,
};

static const rs_stream_ops rs_uxc_stream_ops = {
    .group = uxc_group,
    .group_async = uxc_group_async,
    .settle = uxc_settle,
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

/* This rank's part of creation (local failures only). */
static reshard_result_t setup(reshard_comm_t *c, rs_uxc *x, reshard_comm_t *ucx) {
  c->rank = ucx->rank;
  c->size = ucx->size;
  c->impl = x;
  x->host = ucx;
  x->rejoins = ucx->rejoins;
  x->resizes = ucx->resizes;
  pthread_mutexattr_t ma;
  x->mu_ok = pthread_mutexattr_init(&ma) == 0;
  if (x->mu_ok) {
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    x->mu_ok = pthread_mutex_init(&x->mu, &ma) == 0;
    pthread_mutexattr_destroy(&ma);
  }
  x->sent = calloc((size_t)c->size, sizeof *x->sent);
  x->recvd = calloc((size_t)c->size, sizeof *x->recvd);
  x->red = calloc(2 * (size_t)c->size, sizeof *x->red);
  if (!x->mu_ok || !x->sent || !x->recvd || !x->red)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx_cuda rank %d: out of memory", c->rank);
  cudaError_t ce = cudaGetDevice(&x->device);
  if (!ce) ce = cudaMallocHost((void **)&x->h_words, 8 * RS_COMMIT_WORDS * ((size_t)c->size + 1));
  if (!ce && x->bounce) ce = cudaStreamCreateWithFlags(&x->h2d, cudaStreamNonBlocking);
  if (ce) return rs_cuda_error(ce, "comm_create_ucx_cuda: CUDA setup", c->rank);
  return rs_dev_comm_init(c, &rs_uxc_hooks);
}

reshard_result_t reshard_comm_create_ucx_cuda(reshard_comm_t *ucx, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx_cuda: out is NULL");
  *out = NULL;
  if (!ucx || !ucx->ops) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx_cuda: ucx is NULL");
  if (ucx->ops != &rs_ux_ops)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx_cuda: ucx must be a UCX communicator "
                    "(reshard_comm_create_ucx), not '%s'", ucx->ops->name);
  ux_comm *m = ucx->impl;
  /* This rank's part; the agreement below makes it all or nothing. */
  reshard_result_t r = RESHARD_SUCCESS;
  const int memtype = rs_ux_device_memtype(ucx);
  if (rs_ux_failed(ucx)) r = rs_ux_refuse_failed(ucx);
  reshard_comm_t *c = NULL;
  rs_uxc *x = NULL;
  if (!r) {
    c = calloc(1, sizeof *c);
    x = calloc(1, sizeof *x);
    if (!c || !x) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx_cuda: out of memory");
  }
  if (!r) {
    /* a UCX that moves no CUDA memory (built without CUDA, as Debian's
     * is): through pinned host memory, each rank as its UCX allows (the
     * bytes on the wire are the same) */
    x->bounce = memtype < 0;
    x->memtype = memtype < 0 ? (int)UCS_MEMORY_TYPE_HOST : memtype;
    r = setup(c, x, ucx);
    if (!r && x->bounce)
      RS_LOG(RS_LOG_INFO, RS_SUBSYS_TRANSPORT, "rank %d: the UCX loaded moves no CUDA memory: UCX (CUDA) messages "
             "go through pinned host memory (a CUDA-enabled UCX moves device memory itself)", c->rank);
  }
  /* every rank learns whether any failed (all get a communicator or
   * none), and the communicator's number: past every rank's count (a
   * newcomer of a rejoin counted none) */
  uint64_t v[2] = {r != RESHARD_SUCCESS, m->cuda_comms + 1};
  reshard_result_t ra = ucx->ops->allreduce_max_u64(ucx, v, 2, rs_deadline_after_ms(60000));
  if (!ra) m->cuda_comms = v[1];
  if (!r && ra) r = ra;
  else if (!r && v[0])
    r = rs_error(RESHARD_ERROR_REMOTE, "comm_create_ucx_cuda rank %d: another rank failed to create its "
                 "communicator", ucx->rank);
  if (r) {
    if (x && x->dev.hooks) rs_dev_comm_fini(c);
    if (x) uxc_release(x);
    free(x);
    free(c);
    return r;
  }
  x->id = v[1];
  c->ops = &rs_uxc_ops;
  *out = c;
  return RESHARD_SUCCESS;
}

#endif
