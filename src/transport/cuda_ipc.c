/* The CUDA IPC transport: stream-ordered transfers between the ranks of
 * one node, ordered on the GPU (kernels/rs_ipc.h has the protocol), for
 * the device executor. The host half of the seam goes to the host
 * communicator it was bootstrapped over: plan agreement runs there.
 *
 * Windows and pools. Every rank's window (mailboxes, acknowledgements,
 * the abort word) is exchanged once, at creation; its staging pool each
 * time a plan is created (prepare_peers, collective), since a plan may
 * have grown it. A peer in another process is mapped with
 * cudaIpcOpenMemHandle; a peer in this process (ranks as threads) is
 * used by address.
 *
 * Failure. Every wait is a kernel that gives up after the plan's timeout
 * and closes the plan's gate (transport/stream.h). Poisoning writes the
 * abort word of this rank's window and of every peer's, with copies (the
 * copy engines run even while spinning kernels fill the SMs), so every
 * partner's waits on this communicator give up at once. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "transport/dev_comm.h"
#include "cuda/cuda_util.h"
#include "kernels/rs_kernels.h"
#include "reshard_cuda_ipc.h"
#include "transport/stream.h"
#include "transport/transport.h"

/* One rank's record in an exchange, as words (an allreduce-max gathers
 * them: every other rank contributes zeros). */
enum { H_WORDS = sizeof(cudaIpcMemHandle_t) / 8 };
typedef struct rec {
  uint64_t pid, device, ptr, bytes, gen;
  uint64_t kept; /* pools: the owner keeps those it replaces until the
                    communicator goes (a capture on it, dev_comm.c) */
  uint64_t handle[H_WORDS];
} rec;
#define REC_WORDS (sizeof(rec) / 8)
_Static_assert(sizeof(cudaIpcMemHandle_t) % 8 == 0, "IPC handle size");

typedef struct mapping {
  unsigned char *base;
  uint64_t rptr; /* the allocation's address in its owner's process */
  uint64_t gen;
  int opened; /* cudaIpcOpenMemHandle (closed at the end) */
} mapping;

/* A peer's allocation mapped here, shared by every registration that
 * names it (cudaIpcOpenMemHandle once per allocation and process). */
typedef struct region {
  uint64_t pid;
  uint64_t handle[sizeof(cudaIpcMemHandle_t) / 8];
  unsigned char *base;
  int refs;
  struct region *next;
} region;

typedef struct rs_ipc {
  rs_dev_comm dev; /* first (src/transport/dev_comm.h) */
  reshard_comm_t *host;
  int device;
  int poisoned;
  uint32_t n;
  unsigned char *win;     /* this rank's window */
  mapping *win_of;        /* every rank's window as mapped here */
  mapping *pool_of;       /* every rank's staging pool as mapped here */
  /* messages posted to / expected from each peer: 2n counts on the device
   * (kernels/rs_ipc.h, rs_ipc_at), [2 * peer] sent, [2 * peer + 1]
   * received, which a group's kernels read and advance in stream order:
   * a launch of a CUDA graph numbers its messages after everything
   * before it */
  uint64_t *d_count;
  uint64_t *d_words;      /* reduce_words: every rank's words (device) */
  uint64_t *h_abort;      /* pinned: the poison value */
  cudaStream_t ctl;       /* poisoning copies */
  uint32_t *count;        /* group: messages per peer (scratch) */
  rs_ipc_op *ops;         /* group: its sends, then its receives (scratch, grown) */
  size_t ops_cap;
  rs_p2p *red;            /* reduce_words' group: 2 per other rank */
  region *regions;        /* registered peers' allocations mapped here */
  void **deferred;        /* pools freed at destroy (see ipc_pool_free) */
  size_t ndeferred;
  mapping *kept;          /* peers' replaced pools a CUDA graph may pull from
                             (exchange_pools), closed at destroy */
  size_t nkept;
} rs_ipc;

static reshard_result_t cu(cudaError_t e, const char *what, int rank) {
  return e == cudaSuccess ? RESHARD_SUCCESS : rs_cuda_error(e, what, rank);
}

static reshard_result_t ipc_health(reshard_comm_t *c) {
  rs_ipc *x = c->impl;
  if (x->poisoned)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: reshard's CUDA IPC communicator was poisoned after an "
                    "earlier failure (here or on a peer); destroy its plans and it, and create a new one",
                    c->rank);
  return RESHARD_SUCCESS;
}

static reshard_result_t ipc_check(reshard_comm_t *c) {
  rs_ipc *x = c->impl;
  RS_CHECK(ipc_health(c));
  return rs_dev_comm_on_device(c, x->device);
}

/* Sets the abort word of every window this rank has mapped (its own
 * included): every wait on this communicator, here and on the peers, then
 * gives up. Asynchronous copies from pinned memory; never blocks. */
static void ipc_poison(reshard_comm_t *c) {
  rs_ipc *x = c->impl;
  if (x->poisoned) return;
  x->poisoned = 1;
  if (!x->win_of || !x->ctl) return;
  for (uint32_t r = 0; r < x->n; r++)
    if (x->win_of[r].base)
      cudaMemcpyAsync(x->win_of[r].base + RS_IPC_ABORT_OFF, x->h_abort, 8, cudaMemcpyHostToDevice, x->ctl);
}

/* The wait of a kernel: the plan's remaining time (at least 1 ms), the
 * window's abort word, the plan's gate. */
static rs_ipc_wait wait_of(rs_ipc *x, int64_t deadline, void *gate) {
  int64_t left = deadline == RS_NO_DEADLINE ? INT64_MAX / 2 : deadline - rs_now_ns();
  if (left < 1000000) left = 1000000;
  return (rs_ipc_wait){(uint64_t *)(x->win + RS_IPC_ABORT_OFF), gate, (uint64_t)left};
}

/* Launches the operations of one kind in batches of RS_IPC_MAX_OPS. */
enum { L_POST, L_PULL, L_ACK, L_ACKED };
static reshard_result_t launch(reshard_comm_t *c, const rs_ipc_op *ops, size_t n, int kind, rs_ipc_wait w,
                               cudaStream_t s) {
  for (size_t i = 0; i < n; i += RS_IPC_MAX_OPS) {
    rs_ipc_batch b;
    memset(&b, 0, sizeof b);
    b.n = (uint32_t)(n - i < RS_IPC_MAX_OPS ? n - i : RS_IPC_MAX_OPS);
    memcpy(b.op, ops + i, b.n * sizeof *ops);
    int e = 0;
    if (kind == L_POST) e = rs_cuda_ipc_post(&b, w, s);
    if (kind == L_ACK) e = rs_cuda_ipc_ack(&b, s);
    if (kind == L_ACKED) e = rs_cuda_ipc_acked(&b, w, s);
    if (kind == L_PULL) {
      /* enough blocks per receive to spread a large message over the
       * GPU (a block per 256 KiB), but not many more blocks than SMs in
       * all when the batch has many receives */
      uint64_t most = 0;
      for (uint32_t k = 0; k < b.n; k++)
        if (b.op[k].bytes > most) most = b.op[k].bytes;
      uint64_t blocks = (most + (256u << 10) - 1) / (256u << 10);
      uint64_t cap = 256 / b.n;
      if (blocks > cap) blocks = cap;
      if (blocks < 1) blocks = 1;
      e = rs_cuda_ipc_pull(&b, w, (unsigned)blocks, s);
    }
    if (e) return rs_cuda_error(e, "CUDA IPC kernel launch", c->rank);
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t ipc_group(reshard_comm_t *c, const rs_p2p *ops, size_t nops, void *stream, int64_t deadline,
                                  void *gate) {
  rs_ipc *x = c->impl;
  if (nops == 0) return RESHARD_SUCCESS;
  RS_CHECK(ipc_health(c));
  if (2 * nops > x->ops_cap) { /* grows to the largest round once, not per call */
    rs_ipc_op *o = realloc(x->ops, 2 * nops * sizeof *o);
    if (!o) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
    x->ops = o;
    x->ops_cap = 2 * nops;
  }
  rs_ipc_op *send = x->ops, *recv = x->ops + nops;
  reshard_result_t r = RESHARD_SUCCESS;
  size_t ns = 0, nr = 0;
  memset(x->count, 0, 2 * x->n * sizeof *x->count);
  const unsigned char *pool = x->dev.pool;
  for (size_t i = 0; i < nops && !r; i++) {
    const rs_p2p *o = &ops[i];
    uint32_t peer = (uint32_t)o->peer;
    if (o->peer < 0 || o->peer >= c->size || o->peer == c->rank) {
      r = rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a transfer to peer %d (self-sends are local copies)", c->rank,
                   o->peer);
      break;
    }
    /* a slot is reused RS_IPC_RING messages later (kernels/rs_ipc.h) */
    if (++x->count[2 * peer + (uint32_t)o->is_recv] > RS_IPC_RING) {
      r = rs_error(RESHARD_ERROR_INTERNAL, "rank %d: more than %u messages with rank %d in one group", c->rank,
                   RS_IPC_RING, o->peer);
      break;
    }
    if (!o->is_recv) {
      const unsigned char *b = o->buf;
      if (o->bytes > RS_IPC_INLINE && (!pool || b < pool || b + o->bytes > pool + x->dev.pool_bytes)) {
        r = rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a send of %llu bytes to rank %d from outside the staging pool",
                     c->rank, (unsigned long long)o->bytes, o->peer);
        break;
      }
      /* the message's place in the group, its slot ring: rs_ipc_at */
      send[ns++] = (rs_ipc_op){
          .slot = (rs_ipc_slot *)(x->win_of[peer].base + rs_ipc_slot_off(x->n, (uint32_t)c->rank, 0)),
          .buf = o->buf,
          .ack = (uint64_t *)(x->win + rs_ipc_ack_off(peer)),
          .peer_abort = (uint64_t *)(x->win_of[peer].base + RS_IPC_ABORT_OFF),
          .seq = x->count[2 * peer],
          .bytes = o->bytes,
          .off = o->bytes > RS_IPC_INLINE ? (uint64_t)(b - pool) : 0,
          .gen = x->dev.pool_gen,
          .count = x->d_count + 2 * peer,
          .peer = o->peer};
    } else {
      recv[nr++] = (rs_ipc_op){
          .slot = (rs_ipc_slot *)(x->win + rs_ipc_slot_off(x->n, peer, 0)),
          .buf = o->buf,
          .pool = x->pool_of[peer].base,
          .ack = (uint64_t *)(x->win_of[peer].base + rs_ipc_ack_off((uint32_t)c->rank)),
          .peer_abort = (uint64_t *)(x->win_of[peer].base + RS_IPC_ABORT_OFF),
          .seq = x->count[2 * peer + 1],
          .bytes = o->bytes,
          .gen = x->pool_of[peer].gen,
          .count = x->d_count + 2 * peer + 1,
          .peer = o->peer};
    }
  }
  /* each peer's last message in each direction moves its count on, by the
   * group's messages with it, once the group no longer reads it
   * (rs_ipc_advance); a refused group enqueues nothing (and poisons the
   * communicator anyway) */
  for (size_t i = 0; !r && i < ns + nr; i++) {
    rs_ipc_op *q = i < ns ? &send[i] : &recv[i - ns];
    uint32_t total = x->count[2 * (uint32_t)q->peer + (i < ns ? 0 : 1)];
    q->last = q->seq == total ? total : 0;
  }
  /* Every send is posted before anything waits (see kernels/rs_ipc.h). */
  rs_ipc_wait w = wait_of(x, deadline, gate);
  cudaStream_t s = (cudaStream_t)stream;
  if (!r) r = launch(c, send, ns, L_POST, w, s);
  if (!r) r = launch(c, recv, nr, L_PULL, w, s);
  if (!r) r = launch(c, recv, nr, L_ACK, w, s);
  if (!r) r = launch(c, send, ns, L_ACKED, w, s);
  return r;
}

/* Every rank's words to every other, then their max: the agreement's
 * verdict in relay plans and the commit's vote (messages of at most 40
 * bytes travel in the mailboxes). Rank r's words land at d_words + r *
 * RS_COMMIT_WORDS; this rank's own slot stays 0. */
static reshard_result_t ipc_reduce_words(reshard_comm_t *c, uint64_t *words, uint32_t nw, void *stream,
                                         int64_t deadline, void *gate) {
  rs_ipc *x = c->impl;
  if (c->size == 1) return RESHARD_SUCCESS;
  if (nw < 1 || nw > RS_COMMIT_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a reduction of %u words", c->rank, nw);
  rs_p2p *ops = x->red;
  size_t k = 0;
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank) continue;
    ops[k++] = (rs_p2p){r, 0, words, 8 * (uint64_t)nw};
    ops[k++] = (rs_p2p){r, 1, x->d_words + (size_t)r * RS_COMMIT_WORDS, 8 * (uint64_t)nw};
  }
  reshard_result_t res = ipc_group(c, ops, k, stream, deadline, gate);
  if (res) return res;
  int e = rs_cuda_ipc_max(x->d_words, x->n, RS_COMMIT_WORDS, nw, words, stream);
  if (e) return rs_cuda_error(e, "CUDA IPC reduction launch", c->rank);
  return RESHARD_SUCCESS;
}

/* Gathers every rank's record over the host communicator (an
 * allreduce-max of RS_AGREE_MAX_WORDS at a time). */
static reshard_result_t exchange(reshard_comm_t *c, const rec *mine, rec *all) {
  rs_ipc *x = c->impl;
  size_t total = (size_t)x->n * REC_WORDS;
  uint64_t *w = calloc(total, 8);
  if (!w) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  memcpy(w + (size_t)c->rank * REC_WORDS, mine, sizeof *mine);
  int64_t deadline = rs_deadline_after_ms(60000);
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t at = 0; at < total && !r; at += RS_AGREE_MAX_WORDS) {
    size_t k = total - at < RS_AGREE_MAX_WORDS ? total - at : RS_AGREE_MAX_WORDS;
    r = x->host->ops->allreduce_max_u64(x->host, w + at, (int)k, deadline);
  }
  if (!r) memcpy(all, w, total * 8);
  free(w);
  return r;
}

/* This rank's record of an allocation (NULL: none). */
static reshard_result_t record(reshard_comm_t *c, void *p, size_t bytes, uint64_t gen, rec *out) {
  rs_ipc *x = c->impl;
  memset(out, 0, sizeof *out);
  out->pid = (uint64_t)getpid();
  out->device = (uint64_t)x->device;
  out->ptr = (uint64_t)(uintptr_t)p;
  out->bytes = bytes;
  out->gen = gen;
  if (!p) return RESHARD_SUCCESS;
  cudaIpcMemHandle_t h;
  RS_CHECK(cu(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle", c->rank));
  memcpy(out->handle, &h, sizeof h);
  return RESHARD_SUCCESS;
}

/* Opens a peer's exported allocation; what: which one, for the message. */
static reshard_result_t ipc_open(reshard_comm_t *c, const uint64_t *handle, void **out, const char *what) {
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof h);
  cudaError_t ce = cudaIpcOpenMemHandle(out, h, cudaIpcMemLazyEnablePeerAccess);
  if (ce)
    return rs_error(RESHARD_ERROR_BACKEND, "rank %d: mapping %s with cudaIpcOpenMemHandle failed: %s (%s); every "
                    "rank must be on this node, see the same GPUs and share the IPC namespace (docker --ipc=host)",
                    c->rank, what, cudaGetErrorName(ce), cudaGetErrorString(ce));
  return RESHARD_SUCCESS;
}

static void unmap(mapping *m) {
  if (m->opened && m->base) cudaIpcCloseMemHandle(m->base);
  memset(m, 0, sizeof *m);
}

/* Maps rank r's allocation described by its record (unless mapped at
 * that generation already). */
static reshard_result_t map(reshard_comm_t *c, int r, const rec *e, mapping *m, const char *what) {
  if (m->base && m->gen == e->gen && m->rptr == e->ptr) return RESHARD_SUCCESS;
  unmap(m);
  if (!e->ptr) return RESHARD_SUCCESS;
  if (e->pid == (uint64_t)getpid()) {
    /* a rank of this process (threads): its address is valid here */
    m->base = (unsigned char *)(uintptr_t)e->ptr;
  } else {
    char desc[160];
    snprintf(desc, sizeof desc, "rank %d's %s (its device %llu, process %llu)", r, what,
             (unsigned long long)e->device, (unsigned long long)e->pid);
    void *p = NULL;
    RS_CHECK(ipc_open(c, e->handle, &p, desc));
    m->base = p;
    m->opened = 1;
  }
  m->gen = e->gen;
  m->rptr = e->ptr;
  return RESHARD_SUCCESS;
}

/* Exchanges the staging pools (collective: every rank calls it at every
 * plan creation) and maps those that changed. A rank that failed still
 * takes part, so that nobody waits for it. */
static reshard_result_t exchange_pools(reshard_comm_t *c) {
  rs_ipc *x = c->impl;
  rec mine, *all = calloc(x->n, sizeof *all);
  if (!all) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  reshard_result_t r = record(c, x->dev.pool, x->dev.pool_bytes, x->dev.pool_gen, &mine);
  if (r) memset(&mine, 0, sizeof mine);
  mine.kept = (uint64_t)x->dev.pool_captured;
  reshard_result_t rx = exchange(c, &mine, all);
  if (!r) r = rx;
  int changed = 0;
  for (uint32_t k = 0; !r && k < x->n; k++)
    changed |= k != (uint32_t)c->rank && (x->pool_of[k].gen != all[k].gen || x->pool_of[k].rptr != all[k].ptr);
  /* nothing of this rank's may still read a pool being unmapped */
  if (!r && changed) r = rs_dev_comm_drain(c);
  for (uint32_t k = 0; !r && k < x->n; k++) {
    if (k == (uint32_t)c->rank) {
      x->pool_of[k] = (mapping){x->dev.pool, (uint64_t)(uintptr_t)x->dev.pool, x->dev.pool_gen, 0};
      continue;
    }
    mapping *m = &x->pool_of[k];
    if (all[k].kept && m->base && (m->gen != all[k].gen || m->rptr != all[k].ptr)) {
      /* a graph captured there (and here: captures are collective) pulls
       * from the pool as it was mapped then; its owner keeps it until the
       * communicator goes, and so does this mapping (closed first, at
       * destroy) */
      mapping *kept = realloc(x->kept, (x->nkept + 1) * sizeof *kept);
      if (!kept) {
        r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
        break;
      }
      x->kept = kept;
      x->kept[x->nkept++] = *m;
      memset(m, 0, sizeof *m);
    }
    r = map(c, (int)k, &all[k], m, "staging pool");
  }
  free(all);
  /* every rank remapped (or failed): the pools replaced before can go,
   * unless a failure here means a peer may still read one */
  uint64_t bad = r != RESHARD_SUCCESS;
  reshard_result_t rb = x->host->ops->allreduce_max_u64(x->host, &bad, 1, rs_deadline_after_ms(60000));
  uint64_t abort_word = 1;
  if (!r && !rb && !bad && !x->poisoned &&
      cudaMemcpy(&abort_word, x->win + RS_IPC_ABORT_OFF, 8, cudaMemcpyDeviceToHost) == cudaSuccess && !abort_word) {
    for (size_t i = 0; i < x->ndeferred; i++) cudaFree(x->deferred[i]);
    x->ndeferred = 0;
  }
  if (!r) r = rb;
  return r;
}

/* stream_ops->connect: every peer's staging pool mapped at plan creation. */
static reshard_result_t ipc_connect(reshard_comm_t *c) {
  reshard_result_t r = exchange_pools(c);
  if (r) rs_error_prefix("plan_create rank %d (mapping the peers' staging): ", c->rank);
  return r;
}

static reshard_result_t ipc_pool_alloc(reshard_comm_t *c, size_t bytes, void **out) {
  cudaError_t ce = cudaMalloc(out, bytes);
  if (ce == cudaErrorMemoryAllocation)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: cudaMalloc of %zu bytes of staging failed", c->rank, bytes);
  return cu(ce, "cudaMalloc(staging)", c->rank);
}

/* A replaced or released pool may still be mapped by the peers (they
 * remap at the next exchange, and after a failure a peer may even still
 * pull from it: a wait that gave up ended the execute early), and
 * freeing exported memory before its importers close it is undefined:
 * it is freed after the next exchange's barrier (every peer remapped),
 * or at destroy (after every rank got there). */
static void ipc_pool_free(reshard_comm_t *c, void *p) {
  rs_ipc *x = c->impl;
  void **d = realloc(x->deferred, (x->ndeferred + 1) * sizeof *d);
  if (!d) return; /* leaked rather than freed under a peer's reads */
  x->deferred = d;
  x->deferred[x->ndeferred++] = p;
}

static reshard_result_t ipc_allreduce(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline) {
  rs_ipc *x = c->impl;
  return x->host->ops->allreduce_max_u64(x->host, vals, n, deadline);
}

/* Closes every mapping of the peers' memory this rank holds (windows,
 * pools, kept pools, the registrations of plans the caller leaked). */
static void ipc_unmap_all(rs_ipc *x) {
  /* poison copies may still be writing into the peers' windows */
  if (x->ctl) cudaStreamSynchronize(x->ctl);
  for (uint32_t r = 0; x->pool_of && r < x->n; r++) unmap(&x->pool_of[r]);
  for (uint32_t r = 0; x->win_of && r < x->n; r++) unmap(&x->win_of[r]);
  for (size_t i = 0; i < x->nkept; i++) unmap(&x->kept[i]);
  free(x->kept);
  x->kept = NULL;
  x->nkept = 0;
  for (region *g = x->regions, *nx; g; g = nx) {
    nx = g->next;
    cudaIpcCloseMemHandle(g->base);
    free(g);
  }
  x->regions = NULL;
}

static void ipc_release(reshard_comm_t *c, rs_ipc *x);

/* The end of a communicator every rank reaches together (destroy, a
 * failed creation): no rank frees memory another still has mapped
 * (undefined in CUDA), so every mapping is closed everywhere first. */
static void ipc_teardown(reshard_comm_t *c, rs_ipc *x) {
  uint64_t here = 0;
  ipc_unmap_all(x);
  x->host->ops->allreduce_max_u64(x->host, &here, 1, rs_deadline_after_ms(10000));
  ipc_release(c, x);
}

static void ipc_release(reshard_comm_t *c, rs_ipc *x) {
  ipc_unmap_all(x);
  rs_dev_comm_fini(c);
  for (size_t i = 0; i < x->ndeferred; i++) cudaFree(x->deferred[i]);
  free(x->deferred);
  if (x->ctl) cudaStreamDestroy(x->ctl);
  if (x->h_abort) cudaFreeHost(x->h_abort);
  if (x->d_words) cudaFree(x->d_words);
  if (x->win) cudaFree(x->win);
  free(x->win_of);
  free(x->pool_of);
  if (x->d_count) cudaFree(x->d_count);
  free(x->count);
  free(x->ops);
  free(x->red);
}

static void ipc_destroy(reshard_comm_t *c) {
  rs_ipc *x = c->impl;
  if (!x) return;
  /* This rank's last execute may still use the windows: wait for it
   * until its deadline, poisoned or not (past it, poison: the waits give
   * up, and the work ends soon after). */
  if (x->dev.have_last) {
    int64_t deadline = rs_dev_comm_busy_until(c);
    for (unsigned spin = 0; rs_cuda_query(NULL, x->dev.last_end) == cudaErrorNotReady; spin++) {
      if (rs_now_ns() > deadline) {
        if (x->poisoned) break;
        ipc_poison(c);
        deadline = rs_deadline_after_ms(1000);
      }
      rs_nap(spin);
    }
  }
  /* A peer's failed call may still post into this window: no rank frees
   * its window before every rank got here (collective, with a deadline:
   * a rank that died does not hold the others). */
  uint64_t here = 0;
  x->host->ops->allreduce_max_u64(x->host, &here, 1, rs_deadline_after_ms(10000));
  ipc_teardown(c, x);
  free(x);
  c->impl = NULL;
}

/* ------------------------------------------------------ registration */

/* What a rank says of one registered buffer. */
typedef struct bufrec {
  uint64_t present, pid, offset, ptr;
  uint64_t handle[H_WORDS];
} bufrec;

typedef struct mapset {
  region **r;
  size_t n;
} mapset;

static void region_drop(rs_ipc *x, region *g) {
  if (--g->refs > 0) return;
  for (region **q = &x->regions; *q; q = &(*q)->next)
    if (*q == g) {
      *q = g->next;
      break;
    }
  cudaIpcCloseMemHandle(g->base);
  free(g);
}

static void ipc_unshare(reshard_comm_t *c, void *ms) {
  rs_ipc *x = c->impl;
  mapset *m = ms;
  if (!m) return;
  for (size_t i = 0; i < m->n; i++) region_drop(x, m->r[i]);
  free(m->r);
  free(m);
}

/* Maps the allocation of one record (once per allocation and process). */
static reshard_result_t region_map(reshard_comm_t *c, mapset *m, int peer, size_t b, const bufrec *e, void **out) {
  rs_ipc *x = c->impl;
  region *g = x->regions;
  while (g && !(g->pid == e->pid && !memcmp(g->handle, e->handle, sizeof g->handle))) g = g->next;
  if (!g) {
    char desc[96];
    snprintf(desc, sizeof desc, "buffer %zu of rank %d (register_buffers)", b, peer);
    void *p = NULL;
    RS_CHECK(ipc_open(c, e->handle, &p, desc));
    g = calloc(1, sizeof *g);
    if (!g) {
      cudaIpcCloseMemHandle(p);
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
    }
    g->pid = e->pid;
    memcpy(g->handle, e->handle, sizeof g->handle);
    g->base = p;
    g->next = x->regions;
    x->regions = g;
  }
  region **r = realloc(m->r, (m->n + 1) * sizeof *r);
  if (!r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  m->r = r;
  m->r[m->n++] = g;
  g->refs++;
  *out = g->base + e->offset;
  return RESHARD_SUCCESS;
}

/* This rank's records: each buffer's allocation, exported, and its
 * offset in it. */
static reshard_result_t records(reshard_comm_t *c, void *const *bufs, size_t n, bufrec *out) {
  for (size_t b = 0; b < n; b++) {
    memset(&out[b], 0, sizeof out[b]);
    out[b].pid = (uint64_t)getpid();
    if (!bufs[b]) continue;
    void *base = NULL;
    size_t size = 0;
    int e = rs_cuda_mem_range(bufs[b], &base, &size);
    cudaIpcMemHandle_t h;
    cudaError_t ce = e ? (cudaError_t)e : cudaIpcGetMemHandle(&h, base);
    if (ce)
      return rs_error(RESHARD_ERROR_BACKEND, "register_buffers rank %d: buffer %zu (%p) cannot be exported for CUDA "
                      "IPC: %s (%s); it must come from cudaMalloc (PyTorch: not with expandable_segments)", c->rank,
                      b, bufs[b], cudaGetErrorName(ce), cudaGetErrorString(ce));
    out[b].present = 1;
    out[b].ptr = (uint64_t)(uintptr_t)bufs[b];
    out[b].offset = (uint64_t)((unsigned char *)bufs[b] - (unsigned char *)base);
    memcpy(out[b].handle, &h, sizeof h);
  }
  return RESHARD_SUCCESS;
}

/* Waits for every request of reqs[0, n) (NULL entries skipped) until the
 * deadline; the ones left are cancelled. */
static reshard_result_t wait_all(reshard_comm_t *h, rs_request **reqs, size_t n, int64_t deadline) {
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t i = 0; i < n; i++) {
    if (!reqs[i]) continue;
    reshard_result_t w = r ? RESHARD_ERROR_TIMEOUT : h->ops->wait(h, reqs[i], deadline);
    if (w) {
      h->ops->cancel(h, reqs[i]);
      if (!r) r = w;
    }
    reqs[i] = NULL;
  }
  return r;
}

#define SHARE_TAG 0x52534950ull << 32 /* "RSIP": the host communicator carries nothing else of ours */

static reshard_result_t ipc_share(reshard_comm_t *c, void *const *bufs, size_t nbufs, rs_share *sh, size_t nsh,
                                  void **out) {
  rs_ipc *x = c->impl;
  reshard_comm_t *h = x->host;
  *out = NULL;
  mapset *m = calloc(1, sizeof *m);
  bufrec *mine = calloc(nbufs + 1, sizeof *mine);
  uint64_t (*hdr_in)[2] = calloc(nsh + 1, sizeof *hdr_in), (*hdr_out)[2] = calloc(nsh + 1, sizeof *hdr_out);
  bufrec **theirs = calloc(nsh + 1, sizeof *theirs);
  rs_request **req = calloc(4 * nsh + 1, sizeof *req);
  reshard_result_t r = RESHARD_SUCCESS;
  if (!m || !mine || !hdr_in || !hdr_out || !theirs || !req)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", c->rank);
  /* a rank that cannot export still exchanges (no buffers), so that its
   * partners do not wait for it; the agreement after says who failed */
  reshard_result_t local = r ? r : records(c, bufs, nbufs, mine);
  size_t nmine = local ? 0 : nbufs;
  int64_t deadline = rs_deadline_after_ms(60000);
  /* headers: how many records, how many bytes */
  for (size_t i = 0; !r && i < nsh; i++) {
    hdr_out[i][0] = nmine;
    hdr_out[i][1] = sh[i].out_bytes;
    r = h->ops->irecv(h, sh[i].peer, SHARE_TAG, hdr_in[i], sizeof hdr_in[i], &req[2 * i]);
    if (!r) r = h->ops->isend(h, sh[i].peer, SHARE_TAG, hdr_out[i], sizeof hdr_out[i], &req[2 * i + 1]);
  }
  reshard_result_t w = wait_all(h, req, 2 * nsh, deadline);
  if (!r) r = w;
  for (size_t i = 0; !r && i < nsh; i++) {
    theirs[i] = calloc(hdr_in[i][0] + 1, sizeof **theirs);
    sh[i].in = malloc(hdr_in[i][1] + 1);
    sh[i].in_bytes = hdr_in[i][1];
    if (!theirs[i] || !sh[i].in) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", c->rank);
      break;
    }
    int p = sh[i].peer;
    rs_request **q = &req[4 * i];
    if (hdr_in[i][0]) r = h->ops->irecv(h, p, SHARE_TAG | 1, theirs[i], hdr_in[i][0] * sizeof(bufrec), &q[0]);
    if (!r && hdr_in[i][1]) r = h->ops->irecv(h, p, SHARE_TAG | 2, sh[i].in, hdr_in[i][1], &q[1]);
    if (!r && nmine) r = h->ops->isend(h, p, SHARE_TAG | 1, mine, nmine * sizeof(bufrec), &q[2]);
    if (!r && sh[i].out_bytes) r = h->ops->isend(h, p, SHARE_TAG | 2, sh[i].out, sh[i].out_bytes, &q[3]);
  }
  w = wait_all(h, req, 4 * nsh, deadline);
  if (!r) r = w;
  for (size_t i = 0; !r && i < nsh; i++) {
    sh[i].nbufs = hdr_in[i][0];
    sh[i].bufs = calloc(sh[i].nbufs + 1, sizeof *sh[i].bufs);
    if (!sh[i].bufs) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", c->rank);
    for (size_t b = 0; !r && b < sh[i].nbufs; b++) {
      const bufrec *e = &theirs[i][b];
      if (!e->present) continue;
      if (e->pid == (uint64_t)getpid()) { /* a rank of this process: its address */
        sh[i].bufs[b] = (void *)(uintptr_t)e->ptr;
        continue;
      }
      r = region_map(c, m, sh[i].peer, b, e, &sh[i].bufs[b]);
    }
  }
  for (size_t i = 0; theirs && i < nsh; i++) free(theirs[i]);
  free(theirs);
  free(mine);
  free(hdr_in);
  free(hdr_out);
  free(req);
  if (!r) r = local;
  if (r) {
    ipc_unshare(c, m);
    return r;
  }
  *out = m;
  return RESHARD_SUCCESS;
}

static const rs_dev_comm_hooks rs_ipc_hooks = {
    .name = "CUDA IPC",
    .health = ipc_health,
    .poison = ipc_poison,
    .pool_alloc = ipc_pool_alloc,
    .pool_free = ipc_pool_free,
    .free_exported = ipc_pool_free, /* (the same deferral) */
};

static const rs_stream_ops rs_ipc_stream_ops = {
    .connect = ipc_connect,
    .group = ipc_group,
    .reduce_words = ipc_reduce_words,
    .check = ipc_check,
    .poison = ipc_poison,
    .share = ipc_share,
    .unshare = ipc_unshare,
    .graphs = 1,
};

static const rs_transport_ops rs_ipc_ops = {
    .name = "cuda_ipc",
    .allreduce_max_u64 = ipc_allreduce,
    .destroy = ipc_destroy,
    .stream_ops = &rs_ipc_stream_ops,
};

/* This rank's part of creation (local failures only). */
static reshard_result_t setup(reshard_comm_t *c, rs_ipc *x) {
  RS_CHECK(cu(cudaGetDevice(&x->device), "cudaGetDevice", c->rank));
  x->win_of = calloc(x->n, sizeof *x->win_of);
  x->pool_of = calloc(x->n, sizeof *x->pool_of);
  x->count = calloc(2 * (size_t)x->n, sizeof *x->count);
  x->red = calloc(2 * (size_t)x->n, sizeof *x->red);
  if (!x->win_of || !x->pool_of || !x->count || !x->red)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  RS_CHECK(rs_dev_comm_init(c, &rs_ipc_hooks));
  uint64_t wb = rs_ipc_window_bytes(x->n);
  cudaError_t ce = cudaMalloc((void **)&x->win, wb);
  if (!ce) ce = cudaMemset(x->win, 0, wb);
  if (!ce) ce = cudaMalloc((void **)&x->d_words, 8 * RS_COMMIT_WORDS * (size_t)x->n);
  if (!ce) ce = cudaMemset(x->d_words, 0, 8 * RS_COMMIT_WORDS * (size_t)x->n);
  if (!ce) ce = cudaMalloc((void **)&x->d_count, 16 * (size_t)x->n);
  if (!ce) ce = cudaMemset(x->d_count, 0, 16 * (size_t)x->n);
  if (!ce) ce = cudaMallocHost((void **)&x->h_abort, 8);
  if (!ce) ce = cudaStreamCreateWithFlags(&x->ctl, cudaStreamNonBlocking);
  if (!ce) ce = cudaDeviceSynchronize(); /* the windows are zero before any peer writes them */
  if (ce) return rs_cuda_error(ce, "comm_create_cuda_ipc: CUDA setup", c->rank);
  *x->h_abort = RS_IPC_ABORTED;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_comm_create_cuda_ipc(reshard_comm_t *host, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_cuda_ipc: out is NULL");
  *out = NULL;
  if (!host || !host->ops) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_cuda_ipc: host is NULL");
  if (host->ops->stream_ops)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_cuda_ipc: host must be a host communicator (MPI, "
                    "in-process), not '%s'", host->ops->name);
  reshard_comm_t *c = calloc(1, sizeof *c);
  rs_ipc *x = calloc(1, sizeof *x);
  if (!c || !x) {
    free(c);
    free(x);
    /* the others must not wait for this rank: it still takes part in
     * both agreements below, and in the failure's barrier */
    for (int stage = 0; stage < 3; stage++) {
      uint64_t v = 1;
      host->ops->allreduce_max_u64(host, &v, 1, rs_deadline_after_ms(stage < 2 ? 60000 : 10000));
    }
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_cuda_ipc: out of memory");
  }
  c->rank = host->rank;
  c->size = host->size;
  c->impl = x;
  x->host = host;
  x->n = (uint32_t)host->size;
  reshard_result_t r = setup(c, x);
  /* Every rank learns whether any failed, before the exchange and after
   * the mapping: either all get a communicator or none does. */
  for (int stage = 0; stage < 2; stage++) {
    if (stage == 1 && !r) {
      /* the exchange runs even when this rank's record failed (zeros), so
       * that every rank makes the same collective calls */
      rec mine, *all = calloc(x->n, sizeof *all);
      r = all ? record(c, x->win, rs_ipc_window_bytes(x->n), 1, &mine)
              : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_cuda_ipc: out of memory");
      if (r) memset(&mine, 0, sizeof mine);
      reshard_result_t rx = all ? exchange(c, &mine, all) : RESHARD_SUCCESS;
      if (!r) r = rx;
      for (uint32_t k = 0; !r && k < x->n; k++) {
        if (k == (uint32_t)c->rank) x->win_of[k] = (mapping){x->win, (uint64_t)(uintptr_t)x->win, 1, 0};
        else r = map(c, (int)k, &all[k], &x->win_of[k], "mailbox window");
      }
      free(all);
    }
    uint64_t bad = r != RESHARD_SUCCESS;
    reshard_result_t ra = host->ops->allreduce_max_u64(host, &bad, 1, rs_deadline_after_ms(60000));
    if (!r && ra) r = ra;
    else if (!r && bad)
      r = rs_error(RESHARD_ERROR_REMOTE, "comm_create_cuda_ipc rank %d: another rank failed to create its "
                   "communicator", c->rank);
  }
  if (r) {
    /* every rank fails here (a window may be mapped before a later
     * rank's failure) */
    ipc_teardown(c, x);
    free(x);
    free(c);
    return r;
  }
  c->ops = &rs_ipc_ops;
  *out = c;
  return RESHARD_SUCCESS;
}
