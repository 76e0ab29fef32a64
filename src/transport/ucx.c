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
 * Replacing a rank (reshard_comm_ucx_rejoin, the newcomer's
 * reshard_comm_create_ucx_joining): the staying ranks keep their worker
 * and endpoints; the replaced rank's endpoint is closed and its leftovers
 * dropped, rank 0 relays the newcomer's address and agreed counters. The
 * collective numbers restart past every rank's and the rejoin count
 * (epoch) is mixed into the data tags' hash, so nothing from before the
 * rejoin pairs with a message after it (see "replacing a rank" below).
 *
 * Threads: one lock per communicator around every UCP call (a worker in
 * UCS_THREAD_MODE_SINGLE), so that plans on one communicator may run on
 * different threads. Waits poll the worker until their deadline. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/params.h"
#include "reshard_ucx.h"
#include "transport/transport.h"

#define RANK_SHIFT 40
#define COLL_BIT (1ull << 39)
#define LOW_MASK (COLL_BIT - 1)
#define MAX_RANKS (1 << 24)
/* (collective numbers below this; the rendezvous' and the rejoin's own
 * tags above) */
#define TAG_ADDRESS (COLL_BIT | (1ull << 38) | 1)
#define TAG_TABLE (COLL_BIT | (1ull << 38) | 2)
/* replacing a rank (reshard_comm_ucx_rejoin): the newcomer's address to
 * rank 0, rank 0's table to the newcomer, the staying ranks' counters to
 * rank 0 and rank 0's answer to them */
#define TAG_JOIN (COLL_BIT | (1ull << 38) | 3)
#define TAG_JOIN_TABLE (COLL_BIT | (1ull << 38) | 4)
#define TAG_REJOIN_IN (COLL_BIT | (1ull << 38) | 5)
#define TAG_REJOIN_OUT (COLL_BIT | (1ull << 38) | 6)
#define AGREE_WORDS (RS_AGREE_MAX_WORDS + 2) /* values, n, ~n */

struct rs_request {
  void *ucx;       /* the UCP request; NULL once completed */
  int done, is_recv, peer;
  ucs_status_t status;
  size_t bytes, got; /* expected, and received (receives) */
};

/* A collective: this rank's message to every other, and a slot for each
 * one's. */
typedef struct ux_coll {
  int n;
  int cut; /* a rank it waited for was replaced (rejoin): it never completes */
  uint64_t *mine;  /* AGREE_WORDS */
  uint64_t *theirs; /* size x AGREE_WORDS */
  rs_request **send, **recv; /* size each (this rank's own: NULL) */
} ux_coll;

typedef struct ux_comm {
  pthread_mutex_t lock;
  int size;
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_ep_h *ep;       /* to every rank (this one's own too) */
  ucp_ep_h boot_ep;   /* rendezvous: to rank 0 (others), NULL on rank 0 */
  ucp_listener_h listener;
  ucp_ep_h *accepted; /* rank 0: the rendezvous connections */
  int naccepted, nconn_req, accepted_cap;
  ucp_conn_request_h *conn_req;
  int *peer_failed;   /* a UCP error on that endpoint */
  int boot_failed;    /* on boot_ep */
  uint64_t coll_seq;
  /* Rejoins completed: salts the data tags, so that a message of the
   * replaced process (or of a plan before the rejoin) never pairs with
   * one of the newcomer's. */
  uint64_t epoch;
  int failed; /* a rejoin failed: every operation refuses (destroy it) */
  struct sockaddr_in rdv; /* the rendezvous, listened on again by rejoin */
  char rdv_name[256];
  /* rank 0: every rank's worker address (a newcomer gets the table) */
  void **addrs;
  size_t *alens;
  /* abandoned collectives (allreduce_late): ticket = index + 1 */
  ux_coll **abandoned;
  int nabandoned;
} ux_comm;

static ucp_tag_t data_tag(const ux_comm *m, int sender, uint64_t tag) {
  return (uint64_t)sender << RANK_SHIFT | (rs_mix64(tag + m->epoch * 0x9E3779B97F4A7C15ull) & LOW_MASK);
}

/* After a failed rejoin the endpoint of the replaced rank is gone. */
static reshard_result_t refuse_failed(const reshard_comm_t *c) {
  return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: this UCX communicator failed in reshard_comm_ucx_rejoin "
                  "(see that call's error); destroy it", c->rank);
}

static ucp_tag_t coll_tag(int sender, uint64_t seq) {
  return (uint64_t)sender << RANK_SHIFT | COLL_BIT | (seq & (LOW_MASK >> 1));
}

static reshard_result_t ux_fail(ucs_status_t s, const char *what, int rank, int peer) {
  return rs_error(RESHARD_ERROR_BACKEND, "rank %d: %s (peer %d) failed: %s", rank, what, peer, ucs_status_string(s));
}

/* ---- completions (under the lock, from ucp_worker_progress) ---- */

static void on_send(void *request, ucs_status_t status, void *user) {
  (void)request;
  rs_request *r = user;
  r->status = status;
  r->done = 1;
}

static void on_recv(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user) {
  (void)request;
  rs_request *r = user;
  r->status = status;
  r->got = status == UCS_OK && info ? info->length : 0;
  r->done = 1;
}

/* A connection failed (the peer died or never listened): its requests
 * complete with an error; the rank is marked. (From progress, under the
 * lock.) */
static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  (void)status;
  ux_comm *m = arg;
  for (int i = 0; i < m->size; i++)
    if (m->ep[i] == ep) m->peer_failed[i] = 1;
  if (ep == m->boot_ep) m->boot_failed = 1;
}

/* ---- point to point ---- */

static reshard_result_t post(reshard_comm_t *c, int peer, ucp_tag_t tag, void *buf, size_t bytes, int is_recv,
                             rs_request **out) {
  ux_comm *m = c->impl;
  if (peer < 0 || peer >= c->size)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: UCX message to rank %d of %d", c->rank, peer, c->size);
  rs_request *r = calloc(1, sizeof *r);
  if (!r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory posting a message", c->rank);
  r->is_recv = is_recv;
  r->peer = peer;
  r->bytes = bytes;
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.user_data = r;
  pthread_mutex_lock(&m->lock);
  ucs_status_ptr_t s;
  if (is_recv) {
    p.cb.recv = on_recv;
    s = ucp_tag_recv_nbx(m->worker, buf, bytes, tag, UINT64_MAX, &p);
  } else {
    p.cb.send = on_send;
    s = ucp_tag_send_nbx(m->ep[peer], buf, bytes, tag, &p);
  }
  pthread_mutex_unlock(&m->lock);
  if (UCS_PTR_IS_ERR(s)) {
    free(r);
    return ux_fail(UCS_PTR_STATUS(s), is_recv ? "ucp_tag_recv_nbx" : "ucp_tag_send_nbx", c->rank, peer);
  }
  r->ucx = s;
  if (s == NULL) r->done = 1, r->status = UCS_OK, r->got = bytes; /* (sends only) */
  *out = r;
  return RESHARD_SUCCESS;
}

static reshard_result_t ux_isend(reshard_comm_t *c, int peer, uint64_t tag, const void *buf, size_t bytes,
                                 rs_request **req) {
  const ux_comm *m = c->impl;
  if (m->failed) return refuse_failed(c);
  return post(c, peer, data_tag(m, c->rank, tag), (void *)buf, bytes, 0, req);
}

static reshard_result_t ux_irecv(reshard_comm_t *c, int peer, uint64_t tag, void *buf, size_t bytes,
                                 rs_request **req) {
  const ux_comm *m = c->impl;
  if (m->failed) return refuse_failed(c);
  return post(c, peer, data_tag(m, peer, tag), buf, bytes, 1, req);
}

/* The result of a completed request; frees it. */
static reshard_result_t finish(reshard_comm_t *c, rs_request *r) {
  ux_comm *m = c->impl;
  if (r->ucx) {
    pthread_mutex_lock(&m->lock);
    ucp_request_free(r->ucx);
    pthread_mutex_unlock(&m->lock);
  }
  const int peer = r->peer, is_recv = r->is_recv;
  const ucs_status_t s = r->status;
  const size_t got = r->got, want = r->bytes;
  free(r);
  if (s == UCS_ERR_MESSAGE_TRUNCATED || (s == UCS_OK && is_recv && got != want))
    return rs_error(RESHARD_ERROR_MISMATCH, "rank %d: a message from rank %d did not have the %zu bytes expected%s",
                    c->rank, peer, want, s == UCS_OK ? "" : " (it was longer)");
  if (s != UCS_OK) return ux_fail(s, is_recv ? "receive" : "send", c->rank, peer);
  return RESHARD_SUCCESS;
}

/* Drives the worker; returns whether r completed (1), or its peer's
 * connection failed (-1: its requests end with an error soon). The
 * callbacks write requests under the lock, so they are read under it. */
static int progress_until(ux_comm *m, const rs_request *r) {
  pthread_mutex_lock(&m->lock);
  for (int k = 0; k < 16 && ucp_worker_progress(m->worker); k++) {
  }
  const int st = !r ? 0 : r->done ? 1 : m->peer_failed[r->peer] ? -1 : 0;
  pthread_mutex_unlock(&m->lock);
  return st;
}

static reshard_result_t ux_test(reshard_comm_t *c, rs_request *r, int *done) {
  *done = progress_until(c->impl, r) == 1;
  return *done ? finish(c, r) : RESHARD_SUCCESS;
}

static void ux_cancel(reshard_comm_t *c, rs_request *r);

static reshard_result_t ux_wait(reshard_comm_t *c, rs_request *r, int64_t deadline) {
  ux_comm *m = c->impl;
  for (unsigned spin = 0;; spin++) {
    const int st = progress_until(m, r);
    if (st == 1) return finish(c, r);
    if (st < 0 && spin > 64) {
      /* (only a TIMEOUT leaves the request to the caller) */
      const int peer = r->peer, is_recv = r->is_recv;
      ux_cancel(c, r);
      return rs_error(RESHARD_ERROR_BACKEND, "rank %d: the UCX connection to rank %d failed (%s it)", c->rank,
                      peer, is_recv ? "receiving from" : "sending to");
    }
    if (spin > 64 && rs_now_ns() > deadline)
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: %s rank %d did not complete before the deadline", c->rank,
                      r->is_recv ? "receive from" : "send to", r->peer);
    rs_nap(spin);
  }
}

/* Abandons a request: UCP cancels a receive not yet matched; a send (or a
 * receive already matched) is released to finish on its own, as on MPI
 * (keep the buffers of a failed call alive until the plan goes). No
 * callback runs after ucp_request_free, so the request is freed here. */
static void ux_cancel(reshard_comm_t *c, rs_request *r) {
  ux_comm *m = c->impl;
  if (r->ucx) {
    pthread_mutex_lock(&m->lock);
    if (!r->done) ucp_request_cancel(m->worker, r->ucx);
    ucp_request_free(r->ucx);
    pthread_mutex_unlock(&m->lock);
  }
  free(r);
}

/* ---- collectives ---- */

static void coll_free(reshard_comm_t *c, ux_coll *k) {
  if (!k) return;
  for (int i = 0; i < c->size; i++) {
    if (k->send && k->send[i]) ux_cancel(c, k->send[i]);
    if (k->recv && k->recv[i]) ux_cancel(c, k->recv[i]);
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
  progress_until(m, NULL);
  int pending = 0;
  for (int i = 0; i < c->size; i++) {
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
      if (finish(c, r) != RESHARD_SUCCESS) return -1;
    }
  }
  return !pending;
}

/* The reduced values of a completed collective. */
static reshard_result_t coll_result(reshard_comm_t *c, const ux_coll *k, uint64_t *vals, int n) {
  for (int i = 0; i < n; i++) vals[i] = k->mine[i];
  for (int p = 0; p < c->size; p++) {
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
        post(c, p, coll_tag(p, seq), k->theirs + (size_t)p * AGREE_WORDS, AGREE_WORDS * 8, 1, &k->recv[p]);
    if (!r) r = post(c, p, coll_tag(c->rank, seq), k->mine, AGREE_WORDS * 8, 0, &k->send[p]);
    if (r) {
      coll_free(c, k);
      return r;
    }
  }
  *out = k;
  return RESHARD_SUCCESS;
}

static reshard_result_t ux_allreduce(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline) {
  ux_comm *m = c->impl;
  if (n < 0 || n > RS_AGREE_MAX_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: an agreement of %d values (at most %d)", c->rank, n,
                    RS_AGREE_MAX_WORDS);
  if (m->failed) return refuse_failed(c);
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

static void close_ep(ux_comm *m, ucp_ep_h ep) {
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
static void drain_unexpected(ux_comm *m, ucp_tag_t tag, ucp_tag_t mask) {
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
  if (m->worker) drain_unexpected(m, 0, 0);
  for (int i = 0; m->ep && i < c->size; i++) close_ep(m, m->ep[i]);
  close_ep(m, m->boot_ep);
  for (int i = 0; i < m->naccepted; i++) close_ep(m, m->accepted[i]);
  for (int i = 0; i < m->nconn_req; i++)
    if (m->conn_req[i]) ucp_listener_reject(m->listener, m->conn_req[i]);
  if (m->listener) ucp_listener_destroy(m->listener);
  if (m->worker) ucp_worker_destroy(m->worker);
  if (m->ctx) ucp_cleanup(m->ctx);
  pthread_mutex_unlock(&m->lock);
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

static const rs_transport_ops rs_ucx_ops = {
    .name = "ucx",
    .isend = ux_isend,
    .irecv = ux_irecv,
    .test = ux_test,
    .wait = ux_wait,
    .cancel = ux_cancel,
    .allreduce_max_u64 = ux_allreduce,
    .allreduce_late = ux_allreduce_late,
    .destroy = ux_destroy,
};

static void on_conn_request(ucp_conn_request_h req, void *arg) {
  ux_comm *m = arg;
  ucp_conn_request_h *grown = realloc(m->conn_req, (size_t)(m->nconn_req + 1) * sizeof *grown);
  if (!grown) return; /* (the client times out) */
  m->conn_req = grown;
  m->conn_req[m->nconn_req++] = req;
}

static ucp_ep_params_t ep_params(ux_comm *m) {
  ucp_ep_params_t p;
  memset(&p, 0, sizeof p);
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_ep_error;
  p.err_handler.arg = m;
  return p;
}

static reshard_result_t resolve(const char *rendezvous, int rank, struct sockaddr_in *sa) {
  char host[256];
  const char *colon = rendezvous ? strrchr(rendezvous, ':') : NULL;
  if (!colon || colon == rendezvous || (size_t)(colon - rendezvous) >= sizeof host || !colon[1])
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "comm_create_ucx rank %d: rendezvous '%s' is not \"host:port\"", rank,
                    rendezvous ? rendezvous : "(null)");
  memcpy(host, rendezvous, (size_t)(colon - rendezvous));
  host[colon - rendezvous] = 0;
  char *end = NULL;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 1 || port > 65535)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx rank %d: rendezvous '%s': port '%s'", rank,
                    rendezvous, colon + 1);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int e = getaddrinfo(host, NULL, &hints, &res);
  if (e || !res)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx rank %d: rendezvous host '%s': %s", rank,
                    host, gai_strerror(e));
  memcpy(sa, res->ai_addr, sizeof *sa);
  freeaddrinfo(res);
  sa->sin_port = htons((uint16_t)port);
  return RESHARD_SUCCESS;
}

/* Waits (polling the worker) for a request of the rendezvous. */
static reshard_result_t boot_wait(reshard_comm_t *c, rs_request *r, int64_t deadline, const char *what) {
  reshard_result_t res = ux_wait(c, r, deadline);
  if (res == RESHARD_ERROR_TIMEOUT) {
    ux_cancel(c, r);
    return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank %d: %s did not complete before the deadline "
                    "(did every rank call reshard_comm_create_ucx with the same rendezvous and size?)",
                    c->rank, what);
  }
  return res;
}

/* Receives a message of unknown length with `tag` (probing), into a
 * malloc'd buffer. */
static reshard_result_t boot_recv_any(reshard_comm_t *c, ucp_tag_t tag, ucp_tag_t mask, int64_t probe_until,
                                      int64_t deadline, const char *what, void **buf, size_t *len,
                                      ucp_tag_t *sender) {
  ux_comm *m = c->impl;
  for (unsigned spin = 0;; spin++) {
    ucp_tag_recv_info_t info;
    pthread_mutex_lock(&m->lock);
    ucp_worker_progress(m->worker);
    ucp_tag_message_h msg = ucp_tag_probe_nb(m->worker, tag, mask, 1, &info);
    pthread_mutex_unlock(&m->lock);
    if (msg) {
      *buf = malloc(info.length ? info.length : 1);
      if (!*buf) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
      rs_request *r = calloc(1, sizeof *r);
      if (!r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
      r->is_recv = 1, r->bytes = info.length, r->peer = 0;
      ucp_request_param_t p;
      memset(&p, 0, sizeof p);
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.user_data = r;
      p.cb.recv = on_recv;
      pthread_mutex_lock(&m->lock);
      ucs_status_ptr_t s = ucp_tag_msg_recv_nbx(m->worker, *buf, info.length, msg, &p);
      pthread_mutex_unlock(&m->lock);
      if (UCS_PTR_IS_ERR(s)) {
        free(r);
        return ux_fail(UCS_PTR_STATUS(s), "ucp_tag_msg_recv_nbx", c->rank, -1);
      }
      r->ucx = s;
      *len = info.length;
      if (sender) *sender = info.sender_tag;
      return boot_wait(c, r, deadline, what);
    }
    if (spin > 64 && rs_now_ns() > probe_until)
      return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank %d: %s did not arrive before the deadline (did "
                      "every rank call reshard_comm_create_ucx with the same rendezvous and size?)",
                      c->rank, what);
    rs_nap(spin);
  }
}

/* Rank 0: turns the connection requests that arrived into endpoints.
 * (Under the lock.) */
static void accept_pending(ux_comm *m) {
  for (int i = 0; i < m->nconn_req; i++) {
    if (!m->conn_req[i]) continue;
    ucp_ep_params_t p = ep_params(m);
    p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = m->conn_req[i];
    m->conn_req[i] = NULL;
    ucp_ep_h ep = NULL;
    if (m->naccepted == m->accepted_cap) {
      int cap = m->accepted_cap ? 2 * m->accepted_cap : 16;
      ucp_ep_h *grown = realloc(m->accepted, (size_t)cap * sizeof *grown);
      if (!grown) {
        ucp_listener_reject(m->listener, p.conn_request);
        continue;
      }
      m->accepted = grown;
      m->accepted_cap = cap;
    }
    if (ucp_ep_create(m->worker, &p, &ep) == UCS_OK) m->accepted[m->naccepted++] = ep;
  }
}

/* Rank 0: listens on the rendezvous (at creation, and again while a rank
 * is replaced). */
static reshard_result_t listen_on(reshard_comm_t *c, const char *who) {
  ux_comm *m = c->impl;
  ucp_listener_params_t lp;
  memset(&lp, 0, sizeof lp);
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = (const struct sockaddr *)&m->rdv;
  lp.sockaddr.addrlen = sizeof m->rdv;
  lp.conn_handler.cb = on_conn_request;
  lp.conn_handler.arg = m;
  pthread_mutex_lock(&m->lock);
  ucs_status_t s = ucp_listener_create(m->worker, &lp, &m->listener);
  pthread_mutex_unlock(&m->lock);
  if (s != UCS_OK)
    return rs_error(RESHARD_ERROR_BACKEND, "%s rank 0: cannot listen on %s: %s", who, m->rdv_name,
                    s == UCS_ERR_BUSY ? "the address is in use (another process listens there?)"
                                      : ucs_status_string(s));
  return RESHARD_SUCCESS;
}

/* Rank 0: the listener's work is done, the port is free again;
 * connections not accepted yet are refused. */
static void stop_listening(ux_comm *m) {
  pthread_mutex_lock(&m->lock);
  for (int i = 0; i < m->nconn_req; i++)
    if (m->conn_req[i] && m->listener) ucp_listener_reject(m->listener, m->conn_req[i]);
  m->nconn_req = 0;
  if (m->listener) ucp_listener_destroy(m->listener);
  m->listener = NULL;
  pthread_mutex_unlock(&m->lock);
}

/* Rank 0: accepts the others' connections and collects their worker
 * addresses; addr[p] = {size, address} as each sent it. */
static reshard_result_t boot_collect(reshard_comm_t *c, void **addr, size_t *alen, int64_t deadline) {
  ux_comm *m = c->impl;
  int have = 1;
  while (have < c->size) {
    pthread_mutex_lock(&m->lock);
    ucp_worker_progress(m->worker);
    accept_pending(m);
    pthread_mutex_unlock(&m->lock);
    void *buf = NULL;
    size_t len = 0;
    ucp_tag_t sender = 0;
    /* one address at a time, 2 ms each, until the deadline */
    int64_t slice = rs_now_ns() + 2000000;
    reshard_result_t r = boot_recv_any(c, TAG_ADDRESS, LOW_MASK | COLL_BIT, slice < deadline ? slice : deadline,
                                       deadline, "a rank's address", &buf, &len, &sender);
    if (r == RESHARD_ERROR_TIMEOUT) {
      if (rs_now_ns() < deadline) continue;
      return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank 0: %d of %d ranks arrived before the deadline "
                      "(did every rank call reshard_comm_create_ucx with the same rendezvous and size?)",
                      have, c->size);
    }
    if (r) return r;
    const uint64_t from = sender >> RANK_SHIFT;
    if (from < 1 || from >= (uint64_t)c->size || addr[from] || len < 8) {
      free(buf);
      return rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx rank 0: a rank %llu arrived (size %d, or twice): "
                      "every process must pass its own rank and the same size", (unsigned long long)from, c->size);
    }
    uint64_t their_size;
    memcpy(&their_size, buf, 8);
    if (their_size != (uint64_t)c->size) {
      free(buf);
      return rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx rank 0: rank %llu passed size %llu, this rank %d",
                      (unsigned long long)from, (unsigned long long)their_size, c->size);
    }
    addr[from] = buf;
    alen[from] = len;
    have++;
  }
  return RESHARD_SUCCESS;
}

/* An endpoint to rank p's worker address. */
static reshard_result_t connect_one(reshard_comm_t *c, int p, const void *address) {
  ux_comm *m = c->impl;
  ucp_ep_params_t ep = ep_params(m);
  /* UCP's peer-failure mode leaves out the transports that cannot
   * report a dead peer: in UCX 1.13, shared memory, so every byte
   * between processes of a node would cross the loopback TCP stack
   * (2.8 x MPI's time with 4 processes on 2 cores; 0.98 x without).
   * Off by default: a dead peer then costs the deadline, as on MPI. */
  int64_t peer_errors = 0;
  rs_param_get(RS_PARAM_UCX_PEER_ERRORS, &peer_errors);
  if (!peer_errors) ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = (const ucp_address_t *)address;
  pthread_mutex_lock(&m->lock);
  ucs_status_t s = ucp_ep_create(m->worker, &ep, &m->ep[p]);
  m->peer_failed[p] = 0;
  pthread_mutex_unlock(&m->lock);
  if (s != UCS_OK) {
    m->ep[p] = NULL;
    return ux_fail(s, "ucp_ep_create", c->rank, p);
  }
  return RESHARD_SUCCESS;
}

/* table: {address length, address} per rank. */
static reshard_result_t connect_all(reshard_comm_t *c, const uint8_t *table, size_t len) {
  ux_comm *m = c->impl;
  size_t at = 0;
  for (int p = 0; p < c->size; p++) {
    uint64_t n = 0;
    if (at + 8 > len) break;
    memcpy(&n, table + at, 8);
    at += 8;
    if (n > len - at) break;
    RS_CHECK(connect_one(c, p, table + at));
    at += n;
  }
  for (int p = 0; p < c->size; p++)
    if (!m->ep[p])
      return rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx rank %d: the address table from rank 0 is short",
                      c->rank);
  return RESHARD_SUCCESS;
}

/* Rank 0: the table of m->addrs after `head` bytes of header (zeroed),
 * malloc'd. */
static reshard_result_t build_table(reshard_comm_t *c, size_t head, uint8_t **out, size_t *len) {
  ux_comm *m = c->impl;
  size_t n = head;
  for (int p = 0; p < c->size; p++) n += 8 + m->alens[p];
  uint8_t *t = calloc(1, n);
  if (!t) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank 0: out of memory for the address table");
  size_t at = head;
  for (int p = 0; p < c->size; p++) {
    uint64_t a = m->alens[p];
    memcpy(t + at, &a, 8);
    memcpy(t + at + 8, m->addrs[p], a);
    at += 8 + a;
  }
  *out = t;
  *len = n;
  return RESHARD_SUCCESS;
}

/* A rank other than 0: connects to the rendezvous and sends its worker
 * address (with its size) under `tag` (TAG_ADDRESS, or TAG_JOIN for a
 * newcomer). Rank 0 may not listen yet: a refused connection is retried
 * on a new endpoint every 20 ms until the deadline. */
static reshard_result_t boot_send_address(reshard_comm_t *c, const struct sockaddr_in *sa, const void *msg,
                                          size_t len, ucp_tag_t tag, int64_t deadline) {
  ux_comm *m = c->impl;
  for (;;) {
    ucp_ep_params_t ep = ep_params(m);
    ep.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = (const struct sockaddr *)sa;
    ep.sockaddr.addrlen = sizeof *sa;
    rs_request *q = calloc(1, sizeof *q);
    if (!q) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
    q->bytes = len;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.user_data = q;
    p.cb.send = on_send;
    pthread_mutex_lock(&m->lock);
    m->boot_failed = 0;
    ucs_status_t s = ucp_ep_create(m->worker, &ep, &m->boot_ep);
    ucs_status_ptr_t sp = NULL;
    if (s == UCS_OK) sp = ucp_tag_send_nbx(m->boot_ep, msg, len, (uint64_t)c->rank << RANK_SHIFT | tag, &p);
    pthread_mutex_unlock(&m->lock);
    if (s != UCS_OK) {
      m->boot_ep = NULL;
      free(q);
      return ux_fail(s, "ucp_ep_create (to the rendezvous)", c->rank, 0);
    }
    if (UCS_PTR_IS_ERR(sp)) {
      free(q);
      return ux_fail(UCS_PTR_STATUS(sp), "sending this rank's address", c->rank, 0);
    }
    q->ucx = sp;
    int st = 0;
    for (unsigned spin = 0; !st; spin++) {
      pthread_mutex_lock(&m->lock);
      ucp_worker_progress(m->worker);
      st = q->done ? (q->status == UCS_OK ? 1 : -1) : m->boot_failed ? -1 : 0;
      pthread_mutex_unlock(&m->lock);
      if (!st && rs_now_ns() > deadline) break;
      if (!st) rs_nap(spin);
    }
    if (st == 1) return finish(c, q);
    ux_cancel(c, q);
    pthread_mutex_lock(&m->lock);
    close_ep(m, m->boot_ep);
    m->boot_ep = NULL;
    pthread_mutex_unlock(&m->lock);
    if (rs_now_ns() > deadline)
      return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank %d: rank 0 did not accept this rank's connection "
                      "before the deadline (is it listening on the rendezvous address%s?)", c->rank,
                      tag == TAG_JOIN ? ", inside reshard_comm_ucx_rejoin" : "");
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
}

/* The counters a newcomer takes from rank 0 (the header of its table, and
 * of the staying ranks' answer): they must equal the staying ranks'. */
enum { JOIN_EPOCH, JOIN_SEQ, JOIN_PLANS, JOIN_WORDS };

static void take_counters(reshard_comm_t *c, const uint64_t *w) {
  ux_comm *m = c->impl;
  m->epoch = w[JOIN_EPOCH];
  m->coll_seq = w[JOIN_SEQ];
  c->plans_created = (uint32_t)w[JOIN_PLANS];
}

/* Rank 0 at creation: listens, collects every address, keeps them (a
 * newcomer gets the table later), hands the table out. */
static reshard_result_t setup_root(reshard_comm_t *c, const uint8_t *mine, size_t mylen, int64_t deadline) {
  ux_comm *m = c->impl;
  void **addr = calloc((size_t)c->size, sizeof *addr);
  size_t *alen = calloc((size_t)c->size, sizeof *alen);
  if (!addr || !alen) {
    free(addr);
    free(alen);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx: out of memory");
  }
  m->addrs = addr;
  m->alens = alen;
  reshard_result_t r = listen_on(c, "comm_create_ucx");
  if (!r) r = boot_collect(c, addr, alen, deadline);
  stop_listening(m);
  /* addr[p] held {size, address}: the address alone is kept */
  for (int p = 1; !r && p < c->size; p++) {
    memmove(addr[p], (uint8_t *)addr[p] + 8, alen[p] - 8);
    alen[p] -= 8;
  }
  if (!r && !(addr[0] = malloc(mylen ? mylen : 1))) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx: out of memory");
  if (!r) memcpy(addr[0], mine, mylen), alen[0] = mylen;
  uint8_t *table = NULL;
  size_t tlen = 0;
  if (!r) r = build_table(c, 0, &table, &tlen);
  if (!r) r = connect_all(c, table, tlen);
  for (int p = 1; !r && p < c->size; p++) {
    rs_request *q = NULL;
    r = post(c, p, (uint64_t)0 << RANK_SHIFT | TAG_TABLE, table, tlen, 0, &q);
    if (!r) r = boot_wait(c, q, deadline, "sending the address table");
  }
  free(table);
  return r;
}

/* Every rank (a newcomer too, `joining`): UCP, its worker, the rendezvous,
 * the endpoints to every rank, a first agreement. */
static reshard_result_t setup(reshard_comm_t *c, const char *rendezvous, int joining, int64_t deadline) {
  ux_comm *m = c->impl;
  RS_CHECK(resolve(rendezvous, c->rank, &m->rdv));
  snprintf(m->rdv_name, sizeof m->rdv_name, "%s", rendezvous);
  ucp_config_t *cfg = NULL;
  ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
  if (s != UCS_OK) return ux_fail(s, "ucp_config_read", c->rank, -1);
  /* The rendezvous port is listened on again by the next communicator
   * (or after a failed creation, or by a rejoin) while the last one's
   * connections are in TIME_WAIT: SO_REUSEADDR, unless the caller set
   * UCX_CM_REUSEADDR. */
  if (!getenv("UCX_CM_REUSEADDR")) (void)ucp_config_modify(cfg, "CM_REUSEADDR", "y");
  ucp_params_t pp;
  memset(&pp, 0, sizeof pp);
  pp.field_mask = UCP_PARAM_FIELD_FEATURES;
  pp.features = UCP_FEATURE_TAG;
  s = ucp_init(&pp, cfg, &m->ctx);
  ucp_config_release(cfg);
  if (s != UCS_OK) return ux_fail(s, "ucp_init", c->rank, -1);
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof wp);
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if ((s = ucp_worker_create(m->ctx, &wp, &m->worker)) != UCS_OK) return ux_fail(s, "ucp_worker_create", c->rank, -1);
  ucp_address_t *my = NULL;
  size_t mylen = 0;
  if ((s = ucp_worker_get_address(m->worker, &my, &mylen)) != UCS_OK)
    return ux_fail(s, "ucp_worker_get_address", c->rank, -1);
  uint8_t *mine = malloc(8 + mylen);
  if (!mine) {
    ucp_worker_release_address(m->worker, my);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
  }
  uint64_t n64 = (uint64_t)c->size;
  memcpy(mine, &n64, 8);
  memcpy(mine + 8, my, mylen);
  ucp_worker_release_address(m->worker, my);
  reshard_result_t r = RESHARD_SUCCESS;
  if (c->rank == 0) {
    r = setup_root(c, mine + 8, mylen, deadline);
  } else {
    void *table = NULL;
    size_t tlen = 0, head = joining ? JOIN_WORDS * 8 : 0;
    r = boot_send_address(c, &m->rdv, mine, 8 + mylen, joining ? TAG_JOIN : TAG_ADDRESS, deadline);
    if (!r)
      r = boot_recv_any(c, joining ? TAG_JOIN_TABLE : TAG_TABLE, UINT64_MAX, deadline, deadline,
                        "the address table from rank 0", &table, &tlen, NULL);
    if (!r && tlen < head)
      r = rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx_joining rank %d: rank 0's answer is short", c->rank);
    if (!r && joining) {
      uint64_t w[JOIN_WORDS];
      memcpy(w, table, sizeof w);
      take_counters(c, w);
    }
    if (!r) r = connect_all(c, (uint8_t *)table + head, tlen - head);
    free(table);
  }
  free(mine);
  if (r) return r;
  /* every rank connected to every other: a first agreement */
  uint64_t one = 1;
  r = ux_allreduce(c, &one, 1, deadline);
  if (r) rs_error_prefix("comm_create_ucx rank %d: the first agreement: ", c->rank);
  return r;
}

static int64_t deadline_of(int timeout_ms) {
  int64_t ms = timeout_ms;
  if (ms < 1) {
    ms = 60000;
    int64_t v = 0;
    if (rs_param_get(RS_PARAM_TIMEOUT_MS, &v) && v >= 1) ms = v;
  }
  return rs_deadline_after_ms(ms);
}

static reshard_result_t create(const char *rendezvous, int rank, int size, int timeout_ms, int joining,
                               reshard_comm_t **out) {
  const char *fn = joining ? "comm_create_ucx_joining" : "comm_create_ucx";
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (size < 1 || size >= MAX_RANKS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: size %d (1 to %d)", fn, size, MAX_RANKS - 1);
  if (rank < 0 || rank >= size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: rank %d of size %d", fn, rank, size);
  if (joining && rank == 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: rank 0 holds the rendezvous and cannot be replaced; a "
                    "newcomer takes the slot of a rank 1 .. size-1", fn);
  const int64_t deadline = deadline_of(timeout_ms);
  reshard_comm_t *c = calloc(1, sizeof *c);
  ux_comm *m = calloc(1, sizeof *m);
  if (m) {
    m->ep = calloc((size_t)size, sizeof *m->ep);
    m->peer_failed = calloc((size_t)size, sizeof *m->peer_failed);
  }
  if (!c || !m || !m->ep || !m->peer_failed) {
    if (m) free(m->ep), free(m->peer_failed);
    free(c);
    free(m);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  pthread_mutex_init(&m->lock, NULL);
  m->size = size;
  c->rank = rank;
  c->size = size;
  c->ops = &rs_ucx_ops;
  c->impl = m;
  reshard_result_t r = setup(c, rendezvous, joining, deadline);
  if (r) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s%s", joining ? "(joining) " : "", reshard_last_error());
    reshard_comm_destroy(c);
    return rs_error(r, "%s", msg);
  }
  *out = c;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_comm_create_ucx(const char *rendezvous, int rank, int size, int timeout_ms,
                                         reshard_comm_t **out) {
  return create(rendezvous, rank, size, timeout_ms, 0, out);
}

reshard_result_t reshard_comm_create_ucx_joining(const char *rendezvous, int rank, int size, int timeout_ms,
                                                 reshard_comm_t **out) {
  return create(rendezvous, rank, size, timeout_ms, 1, out);
}

/* ---- replacing a rank (reshard_comm_ucx_rejoin) ---- */

/* Forgets the process in slot r: its endpoint, what it sent that nobody
 * received, and the abandoned agreements' messages to or from it (those
 * agreements can never complete now). */
static void forget_rank(reshard_comm_t *c, int r) {
  ux_comm *m = c->impl;
  for (int i = 0; i < m->nabandoned; i++) {
    ux_coll *k = m->abandoned[i];
    if (!k) continue;
    if (k->recv[r]) ux_cancel(c, k->recv[r]), k->recv[r] = NULL, k->cut = 1;
    if (k->send[r]) ux_cancel(c, k->send[r]), k->send[r] = NULL, k->cut = 1;
  }
  pthread_mutex_lock(&m->lock);
  close_ep(m, m->ep[r]);
  m->ep[r] = NULL;
  m->peer_failed[r] = 0;
  drain_unexpected(m, (uint64_t)r << RANK_SHIFT, ~(uint64_t)0 << RANK_SHIFT);
  pthread_mutex_unlock(&m->lock);
}

/* Sends a small message to p under tag (the sender's rank added) and
 * waits for it. */
static reshard_result_t send_wait(reshard_comm_t *c, int p, ucp_tag_t tag, const void *buf, size_t len,
                                  int64_t deadline, const char *what) {
  rs_request *q = NULL;
  RS_CHECK(post(c, p, (uint64_t)c->rank << RANK_SHIFT | tag, (void *)buf, len, 0, &q));
  return boot_wait(c, q, deadline, what);
}

/* Rank 0: waits for the newcomer's address (TAG_JOIN from rank r),
 * accepting its connection; *addr = the address, malloc'd. */
static reshard_result_t await_newcomer(reshard_comm_t *c, int r, int64_t deadline, void **addr, size_t *alen) {
  ux_comm *m = c->impl;
  for (;;) {
    pthread_mutex_lock(&m->lock);
    ucp_worker_progress(m->worker);
    accept_pending(m);
    pthread_mutex_unlock(&m->lock);
    void *buf = NULL;
    size_t len = 0;
    int64_t slice = rs_now_ns() + 2000000;
    reshard_result_t res = boot_recv_any(c, (uint64_t)r << RANK_SHIFT | TAG_JOIN, UINT64_MAX,
                                         slice < deadline ? slice : deadline, deadline, "the newcomer's address",
                                         &buf, &len, NULL);
    if (res == RESHARD_ERROR_TIMEOUT && rs_now_ns() < deadline) continue;
    if (res == RESHARD_ERROR_TIMEOUT)
      return rs_error(RESHARD_ERROR_TIMEOUT, "no process joined as rank %d before the deadline (did one call "
                      "reshard_comm_create_ucx_joining with rank %d and the same rendezvous %s?)", r, r, m->rdv_name);
    if (res) return res;
    uint64_t their_size = 0;
    if (len >= 8) memcpy(&their_size, buf, 8);
    if (len < 8 || their_size != (uint64_t)c->size) {
      free(buf);
      return rs_error(RESHARD_ERROR_MISMATCH, "the newcomer as rank %d passed size %llu, this communicator has %d",
                      r, (unsigned long long)their_size, c->size);
    }
    memmove(buf, (uint8_t *)buf + 8, len - 8);
    *addr = buf;
    *alen = len - 8;
    return RESHARD_SUCCESS;
  }
}

/* Rank 0's side: the staying ranks' counters, the newcomer's address, the
 * agreed counters to every staying rank (with the address) and to the
 * newcomer (with the table). w: the counters, agreed on return. */
static reshard_result_t rejoin_root(reshard_comm_t *c, int r, uint64_t *w, int64_t deadline) {
  ux_comm *m = c->impl;
  for (int p = 1; p < c->size; p++) {
    if (p == r) continue;
    uint64_t in[JOIN_WORDS + 1] = {0};
    rs_request *q = NULL;
    RS_CHECK(post(c, p, (uint64_t)p << RANK_SHIFT | TAG_REJOIN_IN, in, sizeof in, 1, &q));
    reshard_result_t res = ux_wait(c, q, deadline);
    if (res == RESHARD_ERROR_TIMEOUT) ux_cancel(c, q);
    if (res == RESHARD_ERROR_TIMEOUT)
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d did not call reshard_comm_ucx_rejoin before the deadline "
                      "(it is collective over every rank but the replaced one)", p);
    RS_CHECK(res);
    if (in[JOIN_WORDS] != (uint64_t)r || in[JOIN_EPOCH] != m->epoch)
      return rs_error(RESHARD_ERROR_MISMATCH, "rank %d asks to replace rank %llu (after %llu rejoins), rank 0 "
                      "rank %d (after %llu): every staying rank must pass the same rank", p,
                      (unsigned long long)in[JOIN_WORDS], (unsigned long long)in[JOIN_EPOCH], r,
                      (unsigned long long)m->epoch);
    for (int i = JOIN_SEQ; i < JOIN_WORDS; i++)
      if (in[i] > w[i]) w[i] = in[i];
  }
  RS_CHECK(listen_on(c, "comm_ucx_rejoin"));
  void *addr = NULL;
  size_t alen = 0;
  reshard_result_t res = await_newcomer(c, r, deadline, &addr, &alen);
  stop_listening(m);
  RS_CHECK(res);
  free(m->addrs[r]);
  m->addrs[r] = addr;
  m->alens[r] = alen;
  /* a fresh numbering: no collective of before (abandoned ones, the
   * replaced process' messages) can pair with a later one */
  w[JOIN_EPOCH] += 1;
  w[JOIN_SEQ] += 1;
  RS_CHECK(connect_one(c, r, addr));
  uint8_t *msg = malloc(JOIN_WORDS * 8 + alen);
  if (!msg) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory");
  memcpy(msg, w, JOIN_WORDS * 8);
  memcpy(msg + JOIN_WORDS * 8, addr, alen);
  for (int p = 1; !res && p < c->size; p++)
    if (p != r) res = send_wait(c, p, TAG_REJOIN_OUT, msg, JOIN_WORDS * 8 + alen, deadline, "the newcomer's address");
  free(msg);
  RS_CHECK(res);
  uint8_t *table = NULL;
  size_t tlen = 0;
  RS_CHECK(build_table(c, JOIN_WORDS * 8, &table, &tlen));
  memcpy(table, w, JOIN_WORDS * 8);
  res = send_wait(c, r, TAG_JOIN_TABLE, table, tlen, deadline, "the address table to the newcomer");
  free(table);
  return res;
}

/* Another staying rank's side: its counters to rank 0, the agreed ones
 * and the newcomer's address back. */
static reshard_result_t rejoin_other(reshard_comm_t *c, int r, uint64_t *w, int64_t deadline) {
  uint64_t out[JOIN_WORDS + 1];
  memcpy(out, w, JOIN_WORDS * 8);
  out[JOIN_WORDS] = (uint64_t)r;
  RS_CHECK(send_wait(c, 0, TAG_REJOIN_IN, out, sizeof out, deadline, "this rank's counters to rank 0"));
  void *buf = NULL;
  size_t len = 0;
  reshard_result_t res = boot_recv_any(c, TAG_REJOIN_OUT, UINT64_MAX, deadline, deadline,
                                       "the newcomer's address from rank 0", &buf, &len, NULL);
  if (res == RESHARD_ERROR_TIMEOUT)
    return rs_error(RESHARD_ERROR_TIMEOUT, "rank 0 sent no newcomer's address for rank %d before the deadline", r);
  RS_CHECK(res);
  if (len <= JOIN_WORDS * 8) res = rs_error(RESHARD_ERROR_MISMATCH, "rank 0's answer is short (%zu bytes)", len);
  if (!res) memcpy(w, buf, JOIN_WORDS * 8);
  if (!res) res = connect_one(c, r, (uint8_t *)buf + JOIN_WORDS * 8);
  free(buf);
  return res;
}

reshard_result_t reshard_comm_ucx_rejoin(reshard_comm_t *c, int rank, int timeout_ms) {
  rs_error_clear();
  if (!c || c->ops != &rs_ucx_ops)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin: %s", c ? "not a UCX communicator" : "comm is NULL");
  ux_comm *m = c->impl;
  if (m->failed) return refuse_failed(c);
  if (rank < 0 || rank >= c->size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: rank %d to replace, of size %d",
                    c->rank, rank, c->size);
  if (rank == 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: rank 0 holds the rendezvous and "
                    "cannot be replaced (make a new communicator)", c->rank);
  if (rank == c->rank)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: this rank is the one to replace; "
                    "only the staying ranks call comm_ucx_rejoin (the newcomer calls comm_create_ucx_joining)",
                    c->rank);
  const int64_t deadline = deadline_of(timeout_ms);
  forget_rank(c, rank);
  uint64_t w[JOIN_WORDS] = {m->epoch, m->coll_seq, c->plans_created};
  reshard_result_t r = c->rank == 0 ? rejoin_root(c, rank, w, deadline) : rejoin_other(c, rank, w, deadline);
  if (!r) {
    take_counters(c, w);
    /* with the newcomer: a first agreement */
    uint64_t one = 1;
    r = ux_allreduce(c, &one, 1, deadline);
  }
  if (r) {
    m->failed = 1;
    rs_error_prefix("comm_ucx_rejoin rank %d (replacing rank %d; the communicator is failed now): ", c->rank, rank);
  }
  return r;
}
