/* The UCX transport (ucx.c): replacing a rank.
 *
 * Replacing a rank (reshard_comm_ucx_rejoin, the newcomer's
 * reshard_comm_create_ucx_joining): the staying ranks keep their worker
 * and endpoints; the replaced rank's endpoint is closed and its leftovers
 * dropped, rank 0 relays the newcomer's address and agreed counters. The
 * collective numbers restart past every rank's and the rejoin count
 * (epoch) is mixed into the data tags' hash, so nothing from before the
 * rejoin pairs with a message after it (see "replacing a rank" below).
 *
 * The newcomer's side is a creation (ucx_boot.c) with `joining` set. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/error.h"
#include "reshard_ucx.h"
#include "transport/transport.h"
#include "transport/ucx_internal.h"

/* ---- replacing a rank (reshard_comm_ucx_rejoin) ---- */

/* Forgets the process in slot r: its endpoint, what it sent that nobody
 * received, and the abandoned agreements' messages to or from it (those
 * agreements can never complete now). */
static void forget_rank(reshard_comm_t *c, int r) {
  ux_comm *m = c->impl;
  for (int i = 0; i < m->nabandoned; i++) {
    ux_coll *k = m->abandoned[i];
    if (!k) continue;
    if (k->recv[r]) rs_ux_cancel(c, k->recv[r]), k->recv[r] = NULL, k->cut = 1;
    if (k->send[r]) rs_ux_cancel(c, k->send[r]), k->send[r] = NULL, k->cut = 1;
  }
  pthread_mutex_lock(&m->lock);
  rs_ux_close_ep(m, m->ep[r]);
  m->ep[r] = NULL;
  m->peer_failed[r] = 0;
  rs_ux_drain_unexpected(m, (uint64_t)r << RANK_SHIFT, ~(uint64_t)0 << RANK_SHIFT);
  pthread_mutex_unlock(&m->lock);
}

/* Sends a small message to p under tag (the sender's rank added) and
 * waits for it. */
static reshard_result_t send_wait(reshard_comm_t *c, int p, ucp_tag_t tag, const void *buf, size_t len,
                                  int64_t deadline, const char *what) {
  rs_request *q = NULL;
  RS_CHECK(rs_ux_post(c, p, (uint64_t)c->rank << RANK_SHIFT | tag, (void *)buf, len, 0, &q));
  return rs_ux_boot_wait(c, q, deadline, what);
}

/* Rank 0: waits for the newcomer's address (TAG_JOIN from rank r),
 * accepting its connection; *addr = the address, malloc'd. */
static reshard_result_t await_newcomer(reshard_comm_t *c, int r, int64_t deadline, void **addr, size_t *alen) {
  ux_comm *m = c->impl;
  for (;;) {
    rs_ux_accept_pending(m);
    void *buf = NULL;
    size_t len = 0;
    int64_t slice = rs_now_ns() + 2000000;
    reshard_result_t res = rs_ux_boot_recv_any(c, (uint64_t)r << RANK_SHIFT | TAG_JOIN, UINT64_MAX,
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

/* Rank 0's answer to the staying ranks when no newcomer came: one word,
 * shorter than any real answer (the counters and an address). */
#define NO_NEWCOMER UINT64_C(0x6e6f6e65)

/* Rank 0's side: the staying ranks' counters, the newcomer's address, the
 * agreed counters to every staying rank (with the address) and to the
 * newcomer (with the table). w: the counters, agreed on return. When no
 * newcomer arrived in time, rank 0 tells every staying rank so (they all
 * return TIMEOUT with nothing changed: *retry = 1, the call may be made
 * again). */
static reshard_result_t rejoin_root(reshard_comm_t *c, int r, uint64_t *w, int64_t deadline, int *retry) {
  ux_comm *m = c->impl;
  for (int p = 1; p < c->size; p++) {
    if (p == r) continue;
    uint64_t in[JOIN_WORDS + 1] = {0};
    rs_request *q = NULL;
    RS_CHECK(rs_ux_post(c, p, (uint64_t)p << RANK_SHIFT | TAG_REJOIN_IN, in, sizeof in, 1, &q));
    reshard_result_t res = rs_ux_wait(c, q, deadline);
    if (res == RESHARD_ERROR_TIMEOUT) rs_ux_cancel(c, q);
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
  RS_CHECK(rs_ux_listen_on(c, "comm_ucx_rejoin"));
  void *addr = NULL;
  size_t alen = 0;
  reshard_result_t res = await_newcomer(c, r, deadline, &addr, &alen);
  rs_ux_stop_listening(m);
  if (res == RESHARD_ERROR_TIMEOUT) {
    char why[512];
    snprintf(why, sizeof why, "%s", reshard_last_error());
    const uint64_t none = NO_NEWCOMER;
    /* (the staying ranks wait for this answer past their own deadline:
     * reshard_comm_ucx_rejoin) */
    const int64_t grace = rs_now_ns() + 2000000000LL;
    for (int p = 1; p < c->size; p++)
      if (p != r && send_wait(c, p, TAG_REJOIN_OUT, &none, sizeof none, grace, "'no newcomer' to a staying rank"))
        return RESHARD_ERROR_TIMEOUT; /* (that rank gave up: the communicator fails) */
    *retry = 1;
    return rs_error(RESHARD_ERROR_TIMEOUT, "%s", why);
  }
  RS_CHECK(res);
  free(m->addrs[r]);
  m->addrs[r] = addr;
  m->alens[r] = alen;
  /* a fresh numbering: no collective of before (abandoned ones, the
   * replaced process' messages) can pair with a later one */
  w[JOIN_EPOCH] += 1;
  w[JOIN_SEQ] += 1;
  RS_CHECK(rs_ux_connect_one(c, r, addr));
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
  RS_CHECK(rs_ux_build_table(c, JOIN_WORDS * 8, &table, &tlen));
  memcpy(table, w, JOIN_WORDS * 8);
  res = send_wait(c, r, TAG_JOIN_TABLE, table, tlen, deadline, "the address table to the newcomer");
  free(table);
  return res;
}

/* Another staying rank's side: its counters to rank 0, the agreed ones
 * and the newcomer's address back, or rank 0's "no newcomer" (*retry =
 * 1: TIMEOUT, nothing changed). Rank 0 answers within its own deadline,
 * which began when it called, maybe later than this rank: its answer is
 * awaited for as long again past this rank's deadline. */
static reshard_result_t rejoin_other(reshard_comm_t *c, int r, uint64_t *w, int64_t deadline, int timeout_ms,
                                     int *retry) {
  uint64_t out[JOIN_WORDS + 1];
  memcpy(out, w, JOIN_WORDS * 8);
  out[JOIN_WORDS] = (uint64_t)r;
  RS_CHECK(send_wait(c, 0, TAG_REJOIN_IN, out, sizeof out, deadline, "this rank's counters to rank 0"));
  void *buf = NULL;
  size_t len = 0;
  const int64_t answer_by = deadline + (rs_ux_deadline_of(timeout_ms) - rs_now_ns());
  reshard_result_t res = rs_ux_boot_recv_any(c, TAG_REJOIN_OUT, UINT64_MAX, answer_by, answer_by,
                                             "the newcomer's address from rank 0", &buf, &len, NULL);
  if (res == RESHARD_ERROR_TIMEOUT)
    return rs_error(RESHARD_ERROR_TIMEOUT, "rank 0 sent no newcomer's address for rank %d before the deadline", r);
  RS_CHECK(res);
  uint64_t first = 0;
  if (len == sizeof first) memcpy(&first, buf, sizeof first);
  if (len == sizeof first && first == NO_NEWCOMER) {
    free(buf);
    *retry = 1;
    return rs_error(RESHARD_ERROR_TIMEOUT, "no process joined as rank %d before rank 0's deadline", r);
  }
  if (len <= JOIN_WORDS * 8) res = rs_error(RESHARD_ERROR_MISMATCH, "rank 0's answer is short (%zu bytes)", len);
  if (!res) memcpy(w, buf, JOIN_WORDS * 8);
  if (!res) res = rs_ux_connect_one(c, r, (uint8_t *)buf + JOIN_WORDS * 8);
  free(buf);
  return res;
}

reshard_result_t reshard_comm_ucx_rejoin(reshard_comm_t *c, int rank, int timeout_ms) {
  rs_error_clear();
  if (!c || c->ops != &rs_ux_ops)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin: %s", c ? "not a UCX communicator" : "comm is NULL");
  ux_comm *m = c->impl;
  if (m->failed) return rs_ux_refuse_failed(c);
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
  const int64_t deadline = rs_ux_deadline_of(timeout_ms);
  forget_rank(c, rank);
  uint64_t w[JOIN_WORDS] = {m->epoch, m->coll_seq, c->plans_created};
  int retry = 0;
  reshard_result_t r = c->rank == 0 ? rejoin_root(c, rank, w, deadline, &retry)
                                    : rejoin_other(c, rank, w, deadline, timeout_ms, &retry);
  if (r && retry) {
    rs_error_prefix("comm_ucx_rejoin rank %d (replacing rank %d; nothing changed: call it again, on every staying "
                    "rank, to wait for a newcomer longer): ", c->rank, rank);
    return r;
  }
  if (!r) {
    rs_ux_take_counters(c, w);
    /* with the newcomer: a first agreement */
    uint64_t one = 1;
    r = rs_ux_allreduce(c, &one, 1, deadline);
  }
  if (r) {
    m->failed = 1;
    rs_error_prefix("comm_ucx_rejoin rank %d (replacing rank %d; the communicator is failed now): ", c->rank, rank);
  } else {
    c->last_replaced = rank;
  }
  return r;
}
