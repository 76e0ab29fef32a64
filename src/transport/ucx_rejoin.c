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
#include "common/hash.h"
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

/* The ranks a rejoin replaces (sorted, distinct), and a hash of them that
 * the staying ranks compare. */
typedef struct rejoin_set {
  int32_t *r;
  int n;
  uint64_t hash;
} rejoin_set;

static int in_set(const rejoin_set *s, int p) {
  for (int i = 0; i < s->n; i++)
    if (s->r[i] == p) return 1;
  return 0;
}

/* Rank 0: every staying rank's counters (the agreed ones: the largest),
 * checked to name the same ranks. */
static reshard_result_t collect_counters(reshard_comm_t *c, const rejoin_set *set, uint64_t *w, int64_t deadline) {
  ux_comm *m = c->impl;
  for (int p = 1; p < c->size; p++) {
    if (in_set(set, p)) continue;
    uint64_t in[JOIN_WORDS + 2] = {0};
    rs_request *q = NULL;
    RS_CHECK(rs_ux_post(c, p, (uint64_t)p << RANK_SHIFT | TAG_REJOIN_IN, in, sizeof in, 1, &q));
    reshard_result_t res = rs_ux_wait(c, q, deadline);
    if (res == RESHARD_ERROR_TIMEOUT) rs_ux_cancel(c, q);
    if (res == RESHARD_ERROR_TIMEOUT)
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d did not call reshard_comm_ucx_rejoin before the deadline "
                      "(it is collective over every rank but the replaced ones)", p);
    RS_CHECK(res);
    if (in[JOIN_WORDS] != (uint64_t)set->n || in[JOIN_WORDS + 1] != set->hash || in[JOIN_EPOCH] != m->epoch)
      return rs_error(RESHARD_ERROR_MISMATCH, "rank %d asks to replace other ranks (%llu of them, after %llu "
                      "rejoins) than rank 0 (%d, first rank %d, after %llu): every staying rank must pass the same "
                      "ranks", p, (unsigned long long)in[JOIN_WORDS], (unsigned long long)in[JOIN_EPOCH], set->n,
                      set->r[0], (unsigned long long)m->epoch);
    for (int i = JOIN_SEQ; i < JOIN_WORDS; i++)
      if (in[i] > w[i]) w[i] = in[i];
  }
  return RESHARD_SUCCESS;
}

/* Rank 0: every newcomer's address (addr[i], alen[i] for set->r[i]),
 * waited for one after another until the deadline. Past a timeout, the
 * addresses of those that did arrive are still taken (20 ms each), so
 * that they can be told. */
static reshard_result_t await_all(reshard_comm_t *c, const rejoin_set *set, int64_t deadline, void **addr,
                                  size_t *alen) {
  ux_comm *m = c->impl;
  RS_CHECK(rs_ux_listen_on(c, "comm_ucx_rejoin"));
  reshard_result_t res = RESHARD_SUCCESS;
  for (int i = 0; i < set->n; i++) {
    if (!res) {
      res = await_newcomer(c, set->r[i], deadline, &addr[i], &alen[i]);
    } else if (res == RESHARD_ERROR_TIMEOUT) {
      char why[512];
      snprintf(why, sizeof why, "%s", reshard_last_error());
      if (await_newcomer(c, set->r[i], rs_now_ns() + 20000000, &addr[i], &alen[i])) addr[i] = NULL;
      res = rs_error(RESHARD_ERROR_TIMEOUT, "%s", why);
    }
  }
  rs_ux_stop_listening(m);
  return res;
}

/* Rank 0 when a newcomer did not come: the ones that did (addr[i] set)
 * are told so (their creation fails with TIMEOUT at once, best effort)
 * and forgotten, every staying rank told (they return TIMEOUT with
 * nothing changed: *retry = 1). */
static reshard_result_t no_newcomer(reshard_comm_t *c, const rejoin_set *set, void *const *addr, int *retry) {
  char why[512];
  snprintf(why, sizeof why, "%s", reshard_last_error());
  const uint64_t none = NO_NEWCOMER;
  /* (the staying ranks wait for this answer past their own deadline:
   * reshard_comm_ucx_rejoin) */
  const int64_t grace = rs_now_ns() + 2000000000LL;
  for (int i = 0; i < set->n; i++)
    if (addr[i] && !rs_ux_connect_one(c, set->r[i], addr[i]))
      (void)send_wait(c, set->r[i], TAG_JOIN_TABLE, &none, sizeof none, grace, "'not every newcomer came'");
  for (int i = 0; i < set->n; i++) forget_rank(c, set->r[i]);
  for (int p = 1; p < c->size; p++)
    if (!in_set(set, p) && send_wait(c, p, TAG_REJOIN_OUT, &none, sizeof none, grace, "'no newcomer' to a staying rank"))
      return RESHARD_ERROR_TIMEOUT; /* (that rank gave up: the communicator fails) */
  *retry = 1;
  return rs_error(RESHARD_ERROR_TIMEOUT, "%s", why);
}

/* Rank 0's answer to a staying rank: the agreed counters, then per
 * newcomer its rank, its address' length and the address. */
static uint8_t *answer_of(const ux_comm *m, const rejoin_set *set, const uint64_t *w, size_t *len) {
  size_t n = JOIN_WORDS * 8 + 8;
  for (int i = 0; i < set->n; i++) n += 16 + m->alens[set->r[i]];
  uint8_t *msg = malloc(n);
  if (!msg) return NULL;
  uint64_t count = (uint64_t)set->n;
  memcpy(msg, w, JOIN_WORDS * 8);
  memcpy(msg + JOIN_WORDS * 8, &count, 8);
  size_t at = JOIN_WORDS * 8 + 8;
  for (int i = 0; i < set->n; i++) {
    const size_t alen = m->alens[set->r[i]];
    uint64_t h[2] = {(uint64_t)set->r[i], alen};
    memcpy(msg + at, h, 16);
    memcpy(msg + at + 16, m->addrs[set->r[i]], alen);
    at += 16 + alen;
  }
  *len = n;
  return msg;
}

/* Rank 0's side: the staying ranks' counters, the newcomers' addresses,
 * the agreed counters to every staying rank (with the addresses) and to
 * every newcomer (with the table). w: the counters, agreed on return.
 * When a newcomer did not arrive in time, rank 0 tells every staying rank
 * so (they all return TIMEOUT with nothing changed: *retry = 1, the call
 * may be made again). */
static reshard_result_t rejoin_root(reshard_comm_t *c, const rejoin_set *set, uint64_t *w, int64_t deadline,
                                    int *retry) {
  ux_comm *m = c->impl;
  RS_CHECK(collect_counters(c, set, w, deadline));
  void **addr = calloc((size_t)set->n, sizeof *addr);
  size_t *alen = calloc((size_t)set->n, sizeof *alen);
  if (!addr || !alen) {
    free(addr), free(alen);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory");
  }
  reshard_result_t res = await_all(c, set, deadline, addr, alen);
  if (res == RESHARD_ERROR_TIMEOUT) {
    res = no_newcomer(c, set, addr, retry);
    for (int i = 0; i < set->n; i++) free(addr[i]);
    free(addr), free(alen);
    return res;
  }
  for (int i = 0; !res && i < set->n; i++) {
    free(m->addrs[set->r[i]]);
    m->addrs[set->r[i]] = addr[i], m->alens[set->r[i]] = alen[i];
    addr[i] = NULL;
  }
  for (int i = 0; i < set->n; i++) free(addr[i]);
  free(addr);
  free(alen);
  RS_CHECK(res);
  /* a fresh numbering: no collective of before (abandoned ones, the
   * replaced processes' messages) can pair with a later one */
  w[JOIN_EPOCH] += 1;
  w[JOIN_SEQ] += 1;
  for (int i = 0; i < set->n; i++) RS_CHECK(rs_ux_connect_one(c, set->r[i], m->addrs[set->r[i]]));
  size_t len = 0;
  uint8_t *msg = answer_of(m, set, w, &len);
  if (!msg) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory");
  for (int p = 1; !res && p < c->size; p++)
    if (!in_set(set, p)) res = send_wait(c, p, TAG_REJOIN_OUT, msg, len, deadline, "the newcomers' addresses");
  free(msg);
  RS_CHECK(res);
  uint8_t *table = NULL;
  size_t tlen = 0;
  RS_CHECK(rs_ux_build_table(c, JOIN_WORDS * 8, &table, &tlen));
  memcpy(table, w, JOIN_WORDS * 8);
  for (int i = 0; !res && i < set->n; i++)
    res = send_wait(c, set->r[i], TAG_JOIN_TABLE, table, tlen, deadline, "the address table to a newcomer");
  free(table);
  return res;
}

/* A staying rank: rank 0's answer (answer_of) taken: the counters into w,
 * a connection to every newcomer. */
static reshard_result_t take_answer(reshard_comm_t *c, const rejoin_set *set, const uint8_t *buf, size_t len,
                                    uint64_t *w) {
  uint64_t count = 0;
  if (len >= JOIN_WORDS * 8 + 8) memcpy(&count, buf + JOIN_WORDS * 8, 8);
  if (len < JOIN_WORDS * 8 + 8 || count != (uint64_t)set->n)
    return rs_error(RESHARD_ERROR_MISMATCH, "rank 0's answer is short or names %llu newcomers, not %d (%zu bytes)",
                    (unsigned long long)count, set->n, len);
  memcpy(w, buf, JOIN_WORDS * 8);
  size_t at = JOIN_WORDS * 8 + 8;
  for (int i = 0; i < set->n; i++) {
    uint64_t h[2] = {0, 0};
    if (at + 16 <= len) memcpy(h, buf + at, 16);
    if (at + 16 > len || h[0] != (uint64_t)set->r[i] || h[1] > len - at - 16)
      return rs_error(RESHARD_ERROR_MISMATCH, "rank 0's answer is malformed at newcomer %d (rank %d)", i, set->r[i]);
    RS_CHECK(rs_ux_connect_one(c, set->r[i], buf + at + 16));
    at += 16 + h[1];
  }
  return RESHARD_SUCCESS;
}

/* Another staying rank's side: its counters to rank 0, the agreed ones
 * and the newcomers' addresses back, or rank 0's "no newcomer" (*retry =
 * 1: TIMEOUT, nothing changed). Rank 0 answers within its own deadline,
 * which began when it called, maybe later than this rank: its answer is
 * awaited for as long again past this rank's deadline. */
static reshard_result_t rejoin_other(reshard_comm_t *c, const rejoin_set *set, uint64_t *w, int64_t deadline,
                                     int timeout_ms, int *retry) {
  uint64_t out[JOIN_WORDS + 2];
  memcpy(out, w, JOIN_WORDS * 8);
  out[JOIN_WORDS] = (uint64_t)set->n;
  out[JOIN_WORDS + 1] = set->hash;
  RS_CHECK(send_wait(c, 0, TAG_REJOIN_IN, out, sizeof out, deadline, "this rank's counters to rank 0"));
  void *buf = NULL;
  size_t len = 0;
  const int64_t answer_by = deadline + (rs_ux_deadline_of(timeout_ms) - rs_now_ns());
  reshard_result_t res = rs_ux_boot_recv_any(c, TAG_REJOIN_OUT, UINT64_MAX, answer_by, answer_by,
                                             "the newcomers' addresses from rank 0", &buf, &len, NULL);
  if (res == RESHARD_ERROR_TIMEOUT)
    return rs_error(RESHARD_ERROR_TIMEOUT, "rank 0 sent no newcomers' addresses before the deadline");
  RS_CHECK(res);
  uint64_t first = 0;
  if (len == sizeof first) memcpy(&first, buf, sizeof first);
  if (len == sizeof first && first == NO_NEWCOMER) {
    free(buf);
    for (int i = 0; i < set->n; i++) forget_rank(c, set->r[i]);
    *retry = 1;
    return rs_error(RESHARD_ERROR_TIMEOUT, "not every newcomer joined before rank 0's deadline");
  }
  res = take_answer(c, set, buf, len, w);
  free(buf);
  return res;
}

/* The refusals that change nothing; *set the ranks, sorted. */
static reshard_result_t check_ranks(const reshard_comm_t *c, const int *ranks, int n, rejoin_set *set) {
  if (!ranks || n < 1 || n >= c->size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: %d ranks to replace%s, of size %d",
                    c->rank, n, ranks ? "" : " (NULL)", c->size);
  set->r = malloc((size_t)n * sizeof *set->r);
  if (!set->r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_ucx_rejoin: out of memory");
  set->n = n;
  for (int i = 0; i < n; i++) { /* insertion sort: n is a replica's ranks */
    int v = ranks[i], j = i;
    if (v < 0 || v >= c->size)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: rank %d to replace, of size %d",
                      c->rank, v, c->size);
    if (v == 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: rank 0 holds the rendezvous and "
                      "cannot be replaced (make a new communicator)", c->rank);
    if (v == c->rank)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: this rank is one to replace; "
                      "only the staying ranks call comm_ucx_rejoin (a newcomer calls comm_create_ucx_joining)",
                      c->rank);
    for (; j > 0 && set->r[j - 1] > v; j--) set->r[j] = set->r[j - 1];
    set->r[j] = v;
  }
  for (int i = 1; i < n; i++)
    if (set->r[i] == set->r[i - 1])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin rank %d: rank %d is named twice", c->rank,
                      set->r[i]);
  set->hash = rs_hash_ranks(set->r, n);
  return RESHARD_SUCCESS;
}

/* The communicator's record of the latest rejoin's ranks (transport.h). */
static reshard_result_t record_replaced(reshard_comm_t *c, const rejoin_set *set) {
  int32_t *r = realloc(c->replaced, (size_t)set->n * sizeof *r);
  if (!r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_ucx_rejoin: out of memory");
  for (int i = 0; i < set->n; i++) r[i] = set->r[i];
  c->replaced = r;
  c->nreplaced = set->n;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_comm_ucx_rejoin_ranks(reshard_comm_t *c, const int *ranks, int n, int timeout_ms) {
  rs_error_clear();
  if (!c || c->ops != &rs_ux_ops)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_rejoin: %s", c ? "not a UCX communicator" : "comm is NULL");
  ux_comm *m = c->impl;
  if (m->failed) return rs_ux_refuse_failed(c);
  rejoin_set set = {NULL, 0, 0};
  reshard_result_t r = check_ranks(c, ranks, n, &set);
  if (r) {
    free(set.r);
    return r;
  }
  const int64_t deadline = rs_ux_deadline_of(timeout_ms);
  for (int i = 0; i < set.n; i++) forget_rank(c, set.r[i]);
  uint64_t w[JOIN_WORDS] = {m->epoch, m->coll_seq, c->plans_created};
  int retry = 0;
  r = c->rank == 0 ? rejoin_root(c, &set, w, deadline, &retry)
                   : rejoin_other(c, &set, w, deadline, timeout_ms, &retry);
  if (r && retry) {
    rs_error_prefix("comm_ucx_rejoin rank %d (replacing %d rank(s) from rank %d; nothing changed: call it again, "
                    "on every staying rank, to wait for the newcomers longer): ", c->rank, set.n, set.r[0]);
    free(set.r);
    return r;
  }
  if (!r) {
    rs_ux_take_counters(c, w);
    /* with the newcomers: a first agreement */
    uint64_t one = 1;
    r = rs_ux_allreduce(c, &one, 1, deadline);
  }
  if (!r) r = record_replaced(c, &set);
  if (r) {
    m->failed = 1;
    rs_error_prefix("comm_ucx_rejoin rank %d (replacing %d rank(s) from rank %d; the communicator is failed now): ",
                    c->rank, set.n, set.r[0]);
  }
  free(set.r);
  return r;
}

reshard_result_t reshard_comm_ucx_rejoin(reshard_comm_t *c, int rank, int timeout_ms) {
  return reshard_comm_ucx_rejoin_ranks(c, &rank, 1, timeout_ms);
}
