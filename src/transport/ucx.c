/* The UCX transport: UCP tagged messages between processes that met
 * through a rendezvous address, no MPI (include/reshard_ucx.h).
 *
 * Tags. A UCP tag is 64 bits and a receive matches any sender, so the
 * sender's rank goes into the tag: bits 40-63 hold the sender, bit 39
 * marks reshard's own collectives, and bits 0-38 hold a hash of reshard's
 * 64-bit tag (plan, call, round, kind; transport.h) or the collective's
 * sequence number. Receives match all 64 bits. UCP keeps messages of one
 * sender and tag in send order, as MPI does.
 *
 * Collectives (allreduce_max_u64) are all-to-all: every rank sends its
 * values to every other, and each computes the max of what it received.
 * They are numbered, the same on every rank since they are called in the
 * same order, and the number is in the tag: a collective a rank abandoned
 * at its deadline never pairs with a later one. It stays pending (its
 * receives posted, its buffers kept) until the communicator goes, so that
 * it can still complete when the late ranks arrive: allreduce_late reads
 * it there (a double-buffered commit in doubt settles from it, as on
 * MPI). Every message carries its count and the count's complement, so a
 * rank pairing two kinds of agreement gets MISMATCH.
 *
 * Threads: one lock per communicator around every UCP call (a worker in
 * UCS_THREAD_MODE_SINGLE), so that plans on one communicator may run on
 * different threads. Waits poll the worker until their deadline.
 *
 * This file: the transport proper (messages, requests, waits, the
 * collectives, teardown). The rendezvous and communicator creation are in
 * ucx_boot.c, replacing a rank in ucx_rejoin.c; what the three share is in
 * ucx_internal.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/vec.h"
#include "pack/copy.h"
#include "transport/transport.h"
#include "transport/ucx_internal.h"

static ucp_tag_t data_tag(const ux_comm *m, int sender, uint64_t tag) {
  return (uint64_t)sender << RANK_SHIFT | (rs_mix64(tag + m->epoch * 0x9E3779B97F4A7C15ull) & LOW_MASK);
}

/* After a failed membership change the endpoints may name no process. */
reshard_result_t rs_ux_refuse_failed(const reshard_comm_t *c) {
  return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: this UCX communicator failed in a membership change "
                  "(reshard_comm_ucx_rejoin or reshard_comm_ucx_resize; see that call's error); destroy it", c->rank);
}

int rs_ux_device_memtype(const reshard_comm_t *c) {
  const ux_comm *m = c->impl;
  ucp_context_attr_t a;
  memset(&a, 0, sizeof a);
  a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(m->ctx, &a) != UCS_OK) return -1;
  return a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA) ? (int)UCS_MEMORY_TYPE_CUDA : -1;
}

int rs_ux_failed(const reshard_comm_t *c) {
  const ux_comm *m = c->impl;
  return m->failed;
}

/* An agreement's tag: its sender, its number and the membership epoch
 * (bits 30-37), so that an agreement a process made before a rejoin or
 * resize never pairs with one of after, even when that process (one that
 * left, unasked for its counters) had numbered further than the staying
 * ranks. Bit 38 stays 0: the rendezvous' and rejoin's own tags have it. */
static ucp_tag_t coll_tag(const ux_comm *m, int sender, uint64_t seq) {
  return (uint64_t)sender << RANK_SHIFT | COLL_BIT | ((seq + (m->epoch << 30)) & (LOW_MASK >> 1));
}

reshard_result_t rs_ux_fail(ucs_status_t s, const char *what, int rank, int peer) {
  return rs_error(RESHARD_ERROR_BACKEND, "rank %d: %s (peer %d) failed: %s", rank, what, peer, ucs_status_string(s));
}

/* ---- completions (under the lock, from ucp_worker_progress) ---- */

void rs_ux_on_send(void *request, ucs_status_t status, void *user) {
  (void)request;
  rs_request *r = user;
  r->status = status;
  r->done = 1;
}

void rs_ux_on_recv(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user) {
  (void)request;
  rs_request *r = user;
  r->status = status;
  r->got = status == UCS_OK && info ? info->length : 0;
  r->done = 1;
}

/* A connection failed (the peer died or never listened): its requests
 * complete with an error; the rank is marked. (From progress, under the
 * lock.) */
void rs_ux_on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  (void)status;
  ux_comm *m = arg;
  for (int i = 0; i < m->size; i++)
    if (m->ep[i] == ep) m->peer_failed[i] = 1;
  if (ep == m->boot_ep) m->boot_failed = 1;
}

/* ---- point to point ---- */

/* A message: buf of `bytes` bytes, or (iov) niov entries of a
 * ucp_dt_iov_t array that the request then owns; memtype: buf's UCS
 * memory type, declared to UCP (-1: UCP finds it). */
static reshard_result_t post_any(reshard_comm_t *c, int peer, ucp_tag_t tag, void *buf, size_t bytes, void *iov,
                                 size_t niov, int is_recv, int memtype, void *memh, rs_request **out) {
  ux_comm *m = c->impl;
  if (peer < 0 || peer >= c->size) {
    free(iov);
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: UCX message to rank %d of %d", c->rank, peer, c->size);
  }
  rs_request *r = calloc(1, sizeof *r);
  if (!r) {
    free(iov);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory posting a message", c->rank);
  }
  if (!is_recv && !m->ep[peer]) {
    /* (a rank a membership change forgot, whose slot no newcomer took: a
     * rejoin or resize that timed out waiting for it) */
    free(iov);
    free(r);
    return rs_error(RESHARD_ERROR_BACKEND, "rank %d: no connection to rank %d (it left, and no newcomer took its "
                    "slot: call reshard_comm_ucx_rejoin or _resize again)", c->rank, peer);
  }
  r->is_recv = is_recv;
  r->peer = peer;
  r->bytes = bytes;
  r->iov = iov;
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.user_data = r;
  void *what = buf;
  size_t count = bytes;
  if (memtype >= 0) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = (ucs_memory_type_t)memtype;
  }
  if (memh) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = (ucp_mem_h)memh;
  }
  if (iov) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    what = iov, count = niov;
  }
  pthread_mutex_lock(&m->lock);
  ucs_status_ptr_t s;
  if (is_recv) {
    p.cb.recv = rs_ux_on_recv;
    s = ucp_tag_recv_nbx(m->worker, what, count, tag, UINT64_MAX, &p);
  } else {
    p.cb.send = rs_ux_on_send;
    s = ucp_tag_send_nbx(m->ep[peer], what, count, tag, &p);
  }
  pthread_mutex_unlock(&m->lock);
  if (UCS_PTR_IS_ERR(s)) {
    free(r->iov);
    free(r);
    return rs_ux_fail(UCS_PTR_STATUS(s), is_recv ? "ucp_tag_recv_nbx" : "ucp_tag_send_nbx", c->rank, peer);
  }
  r->ucx = s;
  if (s == NULL) r->done = 1, r->status = UCS_OK, r->got = bytes; /* (sends only) */
  *out = r;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_ux_post(reshard_comm_t *c, int peer, ucp_tag_t tag, void *buf, size_t bytes, int is_recv,
                            rs_request **out) {
  return post_any(c, peer, tag, buf, bytes, NULL, 0, is_recv, -1, NULL, out);
}

reshard_result_t rs_ux_post_iov(reshard_comm_t *c, int peer, ucp_tag_t tag, void *iov, size_t niov, size_t bytes,
                                int is_recv, rs_request **out) {
  return post_any(c, peer, tag, NULL, bytes, iov, niov, is_recv, -1, NULL, out);
}

reshard_result_t rs_ux_post_mem(reshard_comm_t *c, int peer, uint64_t tag, void *buf, size_t bytes, int is_recv,
                                int memtype, void *memh, rs_request **out) {
  const ux_comm *m = c->impl;
  if (m->failed) return rs_ux_refuse_failed(c);
  return post_any(c, peer, data_tag(m, is_recv ? peer : c->rank, tag), buf, bytes, NULL, 0, is_recv, memtype, memh,
                  out);
}

void *rs_ux_mem_map(reshard_comm_t *c, void *addr, size_t bytes, int memtype) {
  ux_comm *m = c->impl;
  ucp_mem_map_params_t mp;
  memset(&mp, 0, sizeof mp);
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = bytes;
  if (memtype >= 0) {
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = (ucs_memory_type_t)memtype;
  }
  ucp_mem_h h = NULL;
  ucs_status_t s = UCS_ERR_NO_MEMORY;
  pthread_mutex_lock(&m->lock);
  /* room to keep it first: a handle the communicator lost would abort ucp_cleanup */
  if (!RS_VEC_GROW(m->memh, m->nmemh, m->cap_memh)) s = ucp_mem_map(m->ctx, &mp, &h);
  if (s == UCS_OK) m->memh[m->nmemh++] = h;
  pthread_mutex_unlock(&m->lock);
  if (s != UCS_OK) {
    RS_LOG(RS_LOG_WARN, RS_SUBSYS_TRANSPORT, "rank %d: ucp_mem_map of %zu bytes (memory type %d): %s; its messages "
           "register as they go", c->rank, bytes, memtype, ucs_status_string(s));
    return NULL;
  }
  return h;
}

void rs_ux_mem_unmap(reshard_comm_t *c, void *memh) {
  if (!memh) return;
  ux_comm *m = c->impl;
  pthread_mutex_lock(&m->lock);
  for (size_t i = 0; i < m->nmemh; i++)
    if (m->memh[i] == memh) {
      m->memh[i] = m->memh[--m->nmemh];
      ucp_mem_unmap(m->ctx, (ucp_mem_h)memh);
      break;
    }
  pthread_mutex_unlock(&m->lock);
}

static reshard_result_t ux_isend(reshard_comm_t *c, int peer, uint64_t tag, const void *buf, size_t bytes,
                                 rs_request **req) {
  const ux_comm *m = c->impl;
  if (m->failed) return rs_ux_refuse_failed(c);
  return rs_ux_post(c, peer, data_tag(m, c->rank, tag), (void *)buf, bytes, 0, req);
}

static reshard_result_t ux_irecv(reshard_comm_t *c, int peer, uint64_t tag, void *buf, size_t bytes,
                                 rs_request **req) {
  const ux_comm *m = c->impl;
  if (m->failed) return rs_ux_refuse_failed(c);
  return rs_ux_post(c, peer, data_tag(m, peer, tag), buf, bytes, 1, req);
}

/* A message of boxes straight from (to) the buffers, as UCP iov entries,
 * one per contiguous run, in the staging layout's row-major order: no
 * pack or unpack copy (transport.h isend_boxes). UNSUPPORTED (the
 * executor packs) for a cast, which needs the pack, or past
 * RS_UX_MAX_IOV runs. Either end may use it or staging alone: the bytes
 * on the wire are the same. */
#define RS_UX_MAX_IOV 4096
static reshard_result_t ux_boxes(reshard_comm_t *c, int peer, uint64_t tag, const rs_copy *copies, uint32_t n,
                                 void *const *bases, size_t bytes, int is_recv, rs_request **req) {
  const ux_comm *m = c->impl;
  if (m->failed) return rs_ux_refuse_failed(c);
  size_t runs = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (copies[i].cvt_from || copies[i].cvt_to) return RESHARD_ERROR_UNSUPPORTED;
    size_t k = 1;
    for (int d = 0; d < copies[i].ndim && k <= RS_UX_MAX_IOV; d++) k *= (size_t)copies[i].extent[d];
    if ((runs += k) > RS_UX_MAX_IOV) return RESHARD_ERROR_UNSUPPORTED;
  }
  ucp_dt_iov_t *iov = malloc((runs + 1) * sizeof *iov);
  if (!iov) return RESHARD_ERROR_UNSUPPORTED;
  size_t at = 0;
  for (uint32_t i = 0; i < n; i++) {
    const rs_copy *cp = &copies[i];
    unsigned char *base = (unsigned char *)bases[is_recv ? cp->dst_buf : cp->src_buf] + (is_recv ? cp->dst_off : cp->src_off);
    const int64_t *stride = is_recv ? cp->dst_stride : cp->src_stride;
    int64_t idx[RS_COPY_MAX_DIMS] = {0};
    for (;;) {
      unsigned char *p = base;
      for (int d = 0; d < cp->ndim; d++) p += idx[d] * stride[d];
      iov[at++] = (ucp_dt_iov_t){p, cp->run_bytes};
      int d = cp->ndim - 1;
      for (; d >= 0 && ++idx[d] == cp->extent[d]; d--) idx[d] = 0;
      if (d < 0) break;
    }
  }
  const ucp_tag_t t = data_tag(m, is_recv ? peer : c->rank, tag);
  return rs_ux_post_iov(c, peer, t, iov, at, bytes, is_recv, req);
}

static reshard_result_t ux_isend_boxes(reshard_comm_t *c, int peer, uint64_t tag, const rs_copy *copies, uint32_t n,
                                       void *const *bases, size_t bytes, rs_request **req) {
  return ux_boxes(c, peer, tag, copies, n, bases, bytes, 0, req);
}

static reshard_result_t ux_irecv_boxes(reshard_comm_t *c, int peer, uint64_t tag, const rs_copy *copies, uint32_t n,
                                       void *const *bases, size_t bytes, rs_request **req) {
  return ux_boxes(c, peer, tag, copies, n, bases, bytes, 1, req);
}

/* The result of a completed request; frees it. */
/* Frees a completed request (UCP's and ours). */
static void request_free(ux_comm *m, rs_request *r) {
  if (r->ucx) {
    pthread_mutex_lock(&m->lock);
    ucp_request_free(r->ucx);
    pthread_mutex_unlock(&m->lock);
  }
  free(r->iov);
  free(r);
}

reshard_result_t rs_ux_finish(reshard_comm_t *c, rs_request *r) {
  const int peer = r->peer, is_recv = r->is_recv;
  const ucs_status_t s = r->status;
  const size_t got = r->got, want = r->bytes;
  request_free(c->impl, r);
  if (s == UCS_ERR_MESSAGE_TRUNCATED || (s == UCS_OK && is_recv && got != want))
    return rs_error(RESHARD_ERROR_MISMATCH, "rank %d: a message from rank %d did not have the %zu bytes expected%s",
                    c->rank, peer, want, s == UCS_OK ? "" : " (it was longer)");
  if (s != UCS_OK) return rs_ux_fail(s, is_recv ? "receive" : "send", c->rank, peer);
  return RESHARD_SUCCESS;
}

/* Drives the worker; returns whether r completed (1), or its peer's
 * connection failed (-1: its requests end with an error soon); *moved
 * (may be NULL): whether the worker made progress. The callbacks write
 * requests under the lock, so they are read under it. */
static int progress_until(ux_comm *m, const rs_request *r, int *moved) {
  pthread_mutex_lock(&m->lock);
  int any = 0;
  for (int k = 0; k < 16 && ucp_worker_progress(m->worker); k++) any = 1;
  const int st = !r ? 0 : r->done ? 1 : m->peer_failed[r->peer] ? -1 : 0;
  pthread_mutex_unlock(&m->lock);
  if (moved) *moved = any;
  return st;
}

static reshard_result_t ux_test(reshard_comm_t *c, rs_request *r, int *done) {
  *done = progress_until(c->impl, r, NULL) == 1;
  return *done ? rs_ux_finish(c, r) : RESHARD_SUCCESS;
}

/* No nap while the worker makes progress: a peer's one-sided reads of
 * this rank's memory over shared memory (ucx_rma.c) may be served by
 * this rank's progress, fragment by fragment, while it waits here (for
 * their "done" token). */
reshard_result_t rs_ux_wait(reshard_comm_t *c, rs_request *r, int64_t deadline) {
  ux_comm *m = c->impl;
  for (unsigned spin = 0, idle = 0;; spin++) {
    int moved = 0;
    const int st = progress_until(m, r, &moved);
    idle = moved ? 0 : idle + 1;
    if (st == 1) return rs_ux_finish(c, r);
    if (st < 0 && spin > 64) {
      /* (only a TIMEOUT leaves the request to the caller) */
      const int peer = r->peer, is_recv = r->is_recv;
      rs_ux_cancel(c, r);
      return rs_error(RESHARD_ERROR_BACKEND, "rank %d: the UCX connection to rank %d failed (%s it)", c->rank,
                      peer, is_recv ? "receiving from" : "sending to");
    }
    if (spin > 64 && rs_now_ns() > deadline)
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: %s rank %d did not complete before the deadline", c->rank,
                      r->is_recv ? "receive from" : "send to", r->peer);
    rs_nap(idle);
  }
}

/* Abandons a request: UCP cancels a receive not yet matched; a send (or a
 * receive already matched) is released to finish on its own, as on MPI
 * (keep the buffers of a failed call alive until the plan goes). No
 * callback runs after ucp_request_free, so the request is freed here. */
void rs_ux_cancel(reshard_comm_t *c, rs_request *r) {
  ux_comm *m = c->impl;
  if (r->ucx) {
    pthread_mutex_lock(&m->lock);
    const int pending = !r->done;
    if (pending) ucp_request_cancel(m->worker, r->ucx);
    ucp_request_free(r->ucx);
    /* a released request UCP may still run reads its iov: kept until
     * the worker goes (dropped, not freed, if there is no room) */
    void **o = pending && r->iov ? realloc(m->orphans, (m->norphans + 1) * sizeof *o) : NULL;
    if (o) m->orphans = o, o[m->norphans++] = r->iov, r->iov = NULL;
    else if (pending) r->iov = NULL;
    pthread_mutex_unlock(&m->lock);
  }
  free(r->iov);
  free(r);
}

void rs_ux_progress(reshard_comm_t *c) {
  progress_until(c->impl, NULL, NULL);
}

int rs_ux_settle(reshard_comm_t *c, rs_request *r, int64_t deadline) {
  ux_comm *m = c->impl;
  if (r->ucx) {
    pthread_mutex_lock(&m->lock);
    if (!r->done) ucp_request_cancel(m->worker, r->ucx);
    pthread_mutex_unlock(&m->lock);
  }
  for (unsigned spin = 0;; spin++) {
    int moved = 0;
    if (progress_until(m, r, &moved) == 1) {
      /* freed without its result, which does not matter any more (a
       * cancelled receive's would replace the caller's error message) */
      request_free(m, r);
      return 1;
    }
    if (rs_now_ns() > deadline) break;
    rs_nap(moved ? 0 : spin);
  }
  rs_ux_cancel(c, r);
  return 0;
}

/* ---- collectives ---- */

static void coll_free(reshard_comm_t *c, ux_coll *k) {
  if (!k) return;
  for (int i = 0; i < k->size; i++) {
    if (k->send && k->send[i]) rs_ux_cancel(c, k->send[i]);
    if (k->recv && k->recv[i]) rs_ux_cancel(c, k->recv[i]);
  }
  free(k->send);
  free(k->recv);
  free(k->mine);
  free(k->theirs);
  free(k);
}

/* Progress of k: 1 when every message of it completed (their requests
 * freed and set NULL), 0 while some is pending, -1 on a failed one (the
 * error set). */
static int coll_poll(reshard_comm_t *c, ux_coll *k) {
  ux_comm *m = c->impl;
  progress_until(m, NULL, NULL);
  int pending = 0;
  for (int i = 0; i < k->size; i++) {
    rs_request **sides[2] = {&k->send[i], &k->recv[i]};
    for (int s = 0; s < 2; s++) {
      rs_request *r = *sides[s];
      if (!r) continue;
      pthread_mutex_lock(&m->lock);
      const int done = r->done;
      pthread_mutex_unlock(&m->lock);
      if (!done) {
        pending = 1;
        continue;
      }
      *sides[s] = NULL;
      if (rs_ux_finish(c, r) != RESHARD_SUCCESS) return -1;
    }
  }
  return !pending;
}

/* The reduced values of a completed collective. */
static reshard_result_t coll_result(reshard_comm_t *c, const ux_coll *k, uint64_t *vals, int n) {
  for (int i = 0; i < n; i++) vals[i] = k->mine[i];
  for (int p = 0; p < k->size; p++) {
    if (p == c->rank) continue;
    const uint64_t *w = k->theirs + (size_t)p * AGREE_WORDS;
    if (w[RS_AGREE_MAX_WORDS] != (uint64_t)n || ~w[RS_AGREE_MAX_WORDS + 1] != (uint64_t)n)
      return rs_error(RESHARD_ERROR_MISMATCH,
                      "rank %d: this agreement (%d values) was paired with another kind on rank %d (%llu values): "
                      "the ranks are out of step, e.g. a rank skipped a plan creation or execute",
                      c->rank, n, p, (unsigned long long)w[RS_AGREE_MAX_WORDS]);
    for (int i = 0; i < n; i++)
      if (w[i] > vals[i]) vals[i] = w[i];
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t coll_start(reshard_comm_t *c, uint64_t seq, const uint64_t *vals, int n, ux_coll **out) {
  ux_coll *k = calloc(1, sizeof *k);
  if (k) {
    k->n = n;
    k->size = c->size;
    k->mine = calloc(AGREE_WORDS, sizeof *k->mine);
    k->theirs = calloc((size_t)c->size * AGREE_WORDS, sizeof *k->theirs);
    k->send = calloc((size_t)c->size, sizeof *k->send);
    k->recv = calloc((size_t)c->size, sizeof *k->recv);
  }
  if (!k || !k->mine || !k->theirs || !k->send || !k->recv) {
    coll_free(c, k);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory for an agreement", c->rank);
  }
  memcpy(k->mine, vals, (size_t)n * sizeof *vals);
  k->mine[RS_AGREE_MAX_WORDS] = (uint64_t)n;
  k->mine[RS_AGREE_MAX_WORDS + 1] = ~(uint64_t)n;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    reshard_result_t r =
        rs_ux_post(c, p, coll_tag(c->impl, p, seq), k->theirs + (size_t)p * AGREE_WORDS, AGREE_WORDS * 8, 1, &k->recv[p]);
    if (!r) r = rs_ux_post(c, p, coll_tag(c->impl, c->rank, seq), k->mine, AGREE_WORDS * 8, 0, &k->send[p]);
    if (r) {
      coll_free(c, k);
      return r;
    }
  }
  *out = k;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_ux_allreduce(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline) {
  ux_comm *m = c->impl;
  if (n < 0 || n > RS_AGREE_MAX_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: an agreement of %d values (at most %d)", c->rank, n,
                    RS_AGREE_MAX_WORDS);
  if (m->failed) return rs_ux_refuse_failed(c);
  const uint64_t seq = ++m->coll_seq;
  ux_coll *k = NULL;
  RS_CHECK(coll_start(c, seq, vals, n, &k));
  for (unsigned spin = 0;; spin++) {
    const int st = coll_poll(c, k);
    if (st < 0) {
      coll_free(c, k);
      rs_error_prefix("agreement %llu: ", (unsigned long long)seq);
      return RESHARD_ERROR_BACKEND;
    }
    if (st > 0) {
      reshard_result_t r = coll_result(c, k, vals, n);
      coll_free(c, k);
      return r;
    }
    if (spin > 64 && rs_now_ns() > deadline) break;
    rs_nap(spin);
  }
  /* Kept pending (allreduce_late): its values may still reach the late
   * ranks, and theirs this one. */
  ux_coll **grown = realloc(m->abandoned, (size_t)(m->nabandoned + 1) * sizeof *grown);
  if (grown) {
    m->abandoned = grown;
    m->abandoned[m->nabandoned++] = k;
  } else {
    coll_free(c, k);
  }
  int missing = -1;
  for (int p = 0; p < c->size && missing < 0; p++)
    if (k && grown && k->recv[p]) missing = p;
  return rs_error(RESHARD_ERROR_TIMEOUT,
                  "rank %d: agreement %llu over UCX did not complete before the deadline (no values yet from rank "
                  "%d)",
                  c->rank, (unsigned long long)seq, missing);
}

static reshard_result_t ux_allreduce_late(reshard_comm_t *c, uint64_t *ticket, uint64_t *vals, int n,
                                          int64_t deadline, int *done) {
  ux_comm *m = c->impl;
  *done = 0;
  if (*ticket == 0) *ticket = (uint64_t)m->nabandoned;
  if (*ticket == 0 || *ticket > (uint64_t)m->nabandoned)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: no abandoned agreement %llu", c->rank,
                    (unsigned long long)*ticket);
  ux_coll *k = m->abandoned[*ticket - 1];
  if (k->cut)
    return rs_error(RESHARD_ERROR_BACKEND, "rank %d: agreement %llu waited for a rank that was replaced since "
                    "(reshard_comm_ucx_rejoin): it can never complete", c->rank, (unsigned long long)*ticket);
  if (k->n != n)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: agreement %llu had %d values, not %d", c->rank,
                    (unsigned long long)*ticket, k->n, n);
  for (unsigned spin = 0;; spin++) {
    const int st = coll_poll(c, k);
    if (st < 0) return RESHARD_ERROR_BACKEND;
    if (st > 0) {
      *done = 1;
      return coll_result(c, k, vals, n);
    }
    if (spin > 64 && rs_now_ns() > deadline) return RESHARD_SUCCESS;
    rs_nap(spin);
  }
}

/* ---- setup and teardown ---- */

void rs_ux_close_ep(ux_comm *m, ucp_ep_h ep) {
  if (!ep) return;
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t s = ucp_ep_close_nbx(ep, &p);
  if (!UCS_PTR_IS_PTR(s)) return;
  /* a forced close ends without the peer; a second at most */
  for (int64_t until = rs_now_ns() + 1000000000LL; rs_now_ns() < until;) {
    ucp_worker_progress(m->worker);
    if (ucp_request_check_status(s) != UCS_INPROGRESS) break;
  }
  ucp_request_free(s);
}

/* Messages no receive matched (a failed call's, sent after its
 * partners gave up) are taken off the worker before it goes, quietly:
 * UCX warns about each one left. */
void rs_ux_drain_unexpected(ux_comm *m, ucp_tag_t tag, ucp_tag_t mask) {
  for (int k = 0; k < 100000; k++) {
    ucp_tag_recv_info_t info;
    ucp_worker_progress(m->worker);
    ucp_tag_message_h msg = ucp_tag_probe_nb(m->worker, tag, mask, 1, &info);
    if (!msg) return;
    void *buf = malloc(info.length ? info.length : 1);
    if (!buf) return;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    ucs_status_ptr_t s = ucp_tag_msg_recv_nbx(m->worker, buf, info.length, msg, &p);
    int owned = 1;
    if (UCS_PTR_IS_PTR(s)) {
      for (int64_t until = rs_now_ns() + 100000000LL;
           ucp_request_check_status(s) == UCS_INPROGRESS && rs_now_ns() < until;)
        ucp_worker_progress(m->worker);
      if (ucp_request_check_status(s) == UCS_INPROGRESS) {
        /* (a large message from a peer that is gone: UCX may still
         * write buf, which is left to it) */
        ucp_request_cancel(m->worker, s);
        owned = 0;
      }
      ucp_request_free(s);
    }
    if (owned) free(buf);
  }
}

static void ux_release(reshard_comm_t *c, ux_comm *m) {
  for (int i = 0; i < m->nabandoned; i++) coll_free(c, m->abandoned[i]);
  free(m->abandoned);
  pthread_mutex_lock(&m->lock);
  if (m->worker) {
    rs_ux_drain_unexpected(m, 0, 0);
    rs_ux_stop_listening(m);
  }
  for (int i = 0; m->ep && i < c->size; i++) rs_ux_close_ep(m, m->ep[i]);
  rs_ux_close_ep(m, m->boot_ep);
  for (int i = 0; i < m->naccepted; i++) rs_ux_close_ep(m, m->accepted[i]);
  if (m->worker) ucp_worker_destroy(m->worker);
  for (size_t i = 0; i < m->nmemh; i++) ucp_mem_unmap(m->ctx, (ucp_mem_h)m->memh[i]);
  free(m->memh);
  if (m->ctx) ucp_cleanup(m->ctx);
  pthread_mutex_unlock(&m->lock);
  for (size_t i = 0; i < m->norphans; i++) free(m->orphans[i]);
  free(m->orphans);
  pthread_mutex_destroy(&m->lock);
  free(m->ep);
  free(m->accepted);
  free(m->conn_req);
  free(m->peer_failed);
  for (int i = 0; m->addrs && i < c->size; i++) free(m->addrs[i]);
  free(m->addrs);
  free(m->alens);
  free(m);
}

static void ux_destroy(reshard_comm_t *c) {
  if (c->impl) ux_release(c, c->impl);
  c->impl = NULL;
}

const rs_transport_ops rs_ux_ops = {
    .name = "ucx",
    .replaces_ranks = 1,
    .isend = ux_isend,
    .irecv = ux_irecv,
    .test = ux_test,
    .wait = rs_ux_wait,
    .cancel = rs_ux_cancel,
    .allreduce_max_u64 = rs_ux_allreduce,
    .allreduce_late = ux_allreduce_late,
    .destroy = ux_destroy,
    .isend_boxes = ux_isend_boxes,
    .irecv_boxes = ux_irecv_boxes,
    .rma_share = rs_ux_rma_share,
    .rma_get = rs_ux_rma_get,
    .rma_flush = rs_ux_rma_flush,
    .rma_adopt = rs_ux_rma_adopt,
    .rma_unshare = rs_ux_rma_unshare,
};
