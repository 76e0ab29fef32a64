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
#include <stdio.h>
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
 * received (drain; a resize does not: after its renumbering another rank
 * sends under r's number, maybe before this rank got here, and what the
 * leaving process sent can pair with nothing of after: the epoch salts
 * the data tags and the agreements' tags), and the abandoned
 * agreements' messages to or from it (those agreements can never
 * complete now). */
static void forget_rank(reshard_comm_t *c, int r, int drain) {
  ux_comm *m = c->impl;
  for (int i = 0; i < m->nabandoned; i++) {
    ux_coll *k = m->abandoned[i];
    if (!k || r >= k->size) continue;
    if (k->recv[r]) rs_ux_cancel(c, k->recv[r]), k->recv[r] = NULL, k->cut = 1;
    if (k->send[r]) rs_ux_cancel(c, k->send[r]), k->send[r] = NULL, k->cut = 1;
  }
  pthread_mutex_lock(&m->lock);
  rs_ux_close_ep(m, m->ep[r]);
  m->ep[r] = NULL;
  m->peer_failed[r] = 0;
  if (drain) { /* its data and agreement messages; not the rendezvous' own
                 (TAG_*, bit 38): a newcomer for slot r may have sent its
                 address already (rank 0 listens all along) */
    const uint64_t sender = ~(uint64_t)0 << RANK_SHIFT, rdv_bit = 1ull << 38;
    rs_ux_drain_unexpected(m, (uint64_t)r << RANK_SHIFT, sender | COLL_BIT);
    rs_ux_drain_unexpected(m, (uint64_t)r << RANK_SHIFT | COLL_BIT, sender | COLL_BIT | rdv_bit);
  }
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

/* Rank 0: the newest TAG_JOIN from rank r's slot that arrived by
 * probe_until (older ones dropped: a newcomer that gave up and was
 * started again sent one each time, and only the last process lives). */
static reshard_result_t newest_join(reshard_comm_t *c, int r, int64_t probe_until, int64_t deadline, void **buf,
                                    size_t *len) {
  const ucp_tag_t tag = (uint64_t)r << RANK_SHIFT | TAG_JOIN;
  RS_CHECK(rs_ux_boot_recv_any(c, tag, UINT64_MAX, probe_until, deadline, "the newcomer's address", buf, len, NULL));
  for (;;) {
    void *next = NULL;
    size_t nlen = 0;
    if (rs_ux_boot_recv_any(c, tag, UINT64_MAX, rs_now_ns(), deadline, "the newcomer's address", &next, &nlen, NULL))
      break; /* (none more) */
    free(*buf);
    *buf = next, *len = nlen;
  }
  rs_error_clear();
  return RESHARD_SUCCESS;
}

/* Rank 0: tells the process at `address` that asked for slot r with
 * another size to go (its joining creation fails at once, best effort)
 * and forgets it. */
static void turn_away(reshard_comm_t *c, int r, const void *address) {
  const uint64_t none = NO_NEWCOMER;
  if (!rs_ux_connect_one(c, r, address))
    (void)send_wait(c, r, TAG_JOIN_TABLE, &none, sizeof none, rs_now_ns() + 1000000000LL, "'go' to a newcomer");
  forget_rank(c, r, 1);
  rs_error_clear();
}

/* Rank 0: waits for the newcomer's address (TAG_JOIN from rank r),
 * accepting its connection; *addr = the address, malloc'd. A newcomer
 * may have sent it before this call (rank 0 listens while its
 * communicator lives): the newest one counts. A process that gave up
 * withdrew (its size alone: skipped); one that asked with another size is
 * turned away, and the wait goes on. */
static reshard_result_t await_newcomer(reshard_comm_t *c, int r, int64_t deadline, void **addr, size_t *alen) {
  /* (after a resize's renumbering, c->size is already the new size) */
  ux_comm *m = c->impl;
  uint64_t wrong_size = 0;
  for (;;) {
    rs_ux_accept_pending(m);
    void *buf = NULL;
    size_t len = 0;
    int64_t slice = rs_now_ns() + 2000000;
    reshard_result_t res = newest_join(c, r, slice < deadline ? slice : deadline, deadline, &buf, &len);
    if (res == RESHARD_ERROR_TIMEOUT && rs_now_ns() < deadline) continue;
    if (res == RESHARD_ERROR_TIMEOUT) {
      char also[96] = "";
      if (wrong_size)
        snprintf(also, sizeof also, "; one came with size %llu, not %d, and was turned away",
                 (unsigned long long)wrong_size, c->size);
      return rs_error(RESHARD_ERROR_TIMEOUT, "no process joined as rank %d before the deadline (did one call "
                      "reshard_comm_create_ucx_joining with rank %d, size %d and the same rendezvous %s?%s)", r, r,
                      c->size, m->rdv_name, also);
    }
    if (res) return res;
    uint64_t their_size = 0;
    if (len >= 8) memcpy(&their_size, buf, 8);
    if (len <= 8 || their_size != (uint64_t)c->size) {
      if (len > 8) turn_away(c, r, (uint8_t *)buf + 8), wrong_size = their_size;
      free(buf);
      continue;
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
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d did not call reshard_comm_ucx_rejoin (or _resize) before the "
                      "deadline (it is collective over every staying rank)", p);
    RS_CHECK(res);
    if (in[JOIN_WORDS] != (uint64_t)set->n || in[JOIN_WORDS + 1] != set->hash || in[JOIN_EPOCH] != m->epoch)
      return rs_error(RESHARD_ERROR_MISMATCH, "rank %d asks for another change than rank 0 (%llu newcomers, "
                      "after %llu membership changes; rank 0: %d, after %llu): every staying rank must pass the same "
                      "ranks (and a resize the same count of newcomers)", p, (unsigned long long)in[JOIN_WORDS],
                      (unsigned long long)in[JOIN_EPOCH], set->n, (unsigned long long)m->epoch);
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
  /* (rank 0 listens on the rendezvous for as long as its communicator
   * lives: ucx_boot.c setup_root) */
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
  for (int i = 0; i < set->n; i++) forget_rank(c, set->r[i], 1);
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
    for (int i = 0; i < set->n; i++) forget_rank(c, set->r[i], 1);
    *retry = 1;
    return rs_error(RESHARD_ERROR_TIMEOUT, "not every newcomer joined before rank 0's deadline");
  }
  res = take_answer(c, set, buf, len, w);
  free(buf);
  return res;
}

/* The refusals that change nothing; *set the ranks, sorted. A rejoin
 * (resize 0) names the ranks it replaces (at least one), a resize those
 * that leave (maybe none). */
static reshard_result_t check_ranks(const reshard_comm_t *c, const int *ranks, int n, int resize, rejoin_set *set) {
  const char *fn = resize ? "comm_ucx_resize" : "comm_ucx_rejoin";
  const char *what = resize ? "leaving" : "to replace";
  if ((n > 0 && !ranks) || n < (resize ? 0 : 1) || n >= c->size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s rank %d: %d ranks %s%s, of size %d", fn, c->rank, n, what,
                    ranks ? "" : " (NULL)", c->size);
  set->r = malloc((size_t)(n ? n : 1) * sizeof *set->r);
  if (!set->r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
  set->n = n;
  for (int i = 0; i < n; i++) { /* insertion sort: n is a replica's ranks */
    int v = ranks[i], j = i;
    if (v < 0 || v >= c->size)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s rank %d: rank %d %s, of size %d", fn, c->rank, v, what,
                      c->size);
    if (v == 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s rank %d: rank 0 holds the rendezvous and cannot %s (make "
                      "a new communicator)", fn, c->rank, resize ? "leave" : "be replaced");
    if (v == c->rank)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s rank %d: this rank is one %s; only the staying ranks call "
                      "%s (%s)", fn, c->rank, what, fn,
                      resize ? "a leaving process destroys its communicator" : "a newcomer calls comm_create_ucx_joining");
    for (; j > 0 && set->r[j - 1] > v; j--) set->r[j] = set->r[j - 1];
    set->r[j] = v;
  }
  for (int i = 1; i < n; i++)
    if (set->r[i] == set->r[i - 1])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s rank %d: rank %d is named twice", fn, c->rank, set->r[i]);
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

/* The refusals of a membership change that need no look at its
 * arguments: not a UCX communicator, or one a change failed before. */
static reshard_result_t changeable(const reshard_comm_t *c, const char *fn) {
  if (!c || c->ops != &rs_ux_ops)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: %s", fn, c ? "not a UCX communicator" : "comm is NULL");
  const ux_comm *m = c->impl;
  return m->failed ? rs_ux_refuse_failed(c) : RESHARD_SUCCESS;
}

/* A membership change's protocol on the newcomers' slots set->r of the
 * numbering in place (a rejoin's, or a resize's new one): rank 0's side
 * or another staying rank's, then the agreed counters taken and a first
 * agreement with the newcomers. *retry as rejoin_root's: TIMEOUT with
 * nothing changed. */
static reshard_result_t meet_newcomers(reshard_comm_t *c, const rejoin_set *set, int64_t deadline, int timeout_ms,
                                       int *retry) {
  ux_comm *m = c->impl;
  uint64_t w[JOIN_WORDS] = {m->epoch, m->coll_seq, c->plans_created};
  *retry = 0;
  RS_CHECK(c->rank == 0 ? rejoin_root(c, set, w, deadline, retry)
                        : rejoin_other(c, set, w, deadline, timeout_ms, retry));
  rs_ux_take_counters(c, w);
  uint64_t one = 1;
  return rs_ux_allreduce(c, &one, 1, deadline);
}

reshard_result_t reshard_comm_ucx_rejoin_ranks(reshard_comm_t *c, const int *ranks, int n, int timeout_ms) {
  rs_error_clear();
  RS_CHECK(changeable(c, "comm_ucx_rejoin"));
  ux_comm *m = c->impl;
  rejoin_set set = {NULL, 0, 0};
  reshard_result_t r = check_ranks(c, ranks, n, 0, &set);
  if (r) {
    free(set.r);
    return r;
  }
  const int64_t deadline = rs_ux_deadline_of(timeout_ms);
  for (int i = 0; i < set.n; i++) forget_rank(c, set.r[i], 1);
  int retry = 0;
  r = meet_newcomers(c, &set, deadline, timeout_ms, &retry);
  if (r && retry) {
    rs_error_prefix("comm_ucx_rejoin rank %d (replacing %d rank(s) from rank %d; nothing changed: call it again, "
                    "on every staying rank, to wait for the newcomers longer): ", c->rank, set.n, set.r[0]);
    free(set.r);
    return r;
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

/* ---- resizing (reshard_comm_ucx_resize) ----
 *
 * A resize is a rejoin after a renumbering: every staying rank drops the
 * leaving ranks' slots, the staying ranks close up in their order (rank
 * 0 stays 0) and the newcomers' slots are appended at the end, empty;
 * then the rejoin's protocol above fills those slots, in the new
 * numbering (rank 0 collects the staying ranks' counters and the
 * newcomers' addresses, and answers each). The arrays of before are kept
 * until the change holds, so that a resize whose newcomers did not all
 * come (TIMEOUT, retry) leaves the communicator as it was. */

/* The slot a staying rank p takes: p less the leaving ranks below it. */
static int renumbered(const rejoin_set *gone, int p) {
  int below = 0;
  for (int i = 0; i < gone->n; i++) below += gone->r[i] < p;
  return p - below;
}

/* The communicator's numbering of before a resize (or the new one, made
 * and not yet in place). */
typedef struct numbering {
  int size, rank;
  ucp_ep_h *ep;
  int *peer_failed;
  void **addrs; /* rank 0's address table (NULL elsewhere) */
  size_t *alens;
} numbering;

/* The new numbering's arrays, the staying ranks in their new slots (rank
 * 0: their addresses too), the newcomers' slots empty. Nothing changes
 * yet. */
static reshard_result_t renumber_make(reshard_comm_t *c, const rejoin_set *gone, int size, numbering *nw) {
  ux_comm *m = c->impl;
  nw->size = size;
  nw->rank = renumbered(gone, c->rank);
  nw->ep = calloc((size_t)size, sizeof *nw->ep);
  nw->peer_failed = calloc((size_t)size, sizeof *nw->peer_failed);
  nw->addrs = m->addrs ? calloc((size_t)size, sizeof *nw->addrs) : NULL;
  nw->alens = m->addrs ? calloc((size_t)size, sizeof *nw->alens) : NULL;
  if (!nw->ep || !nw->peer_failed || (m->addrs && (!nw->addrs || !nw->alens))) {
    free(nw->ep), free(nw->peer_failed), free(nw->addrs), free(nw->alens);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_ucx_resize rank %d: out of memory", c->rank);
  }
  for (int p = 0; p < c->size; p++) {
    if (in_set(gone, p)) continue;
    const int q = renumbered(gone, p);
    nw->ep[q] = m->ep[p];
    nw->peer_failed[q] = m->peer_failed[p];
    if (m->addrs) nw->addrs[q] = m->addrs[p], nw->alens[q] = m->alens[p];
  }
  return RESHARD_SUCCESS;
}

/* Puts numbering `in` in place; *out takes the one it replaces. */
static void renumber_swap(reshard_comm_t *c, const numbering *in, numbering *out) {
  ux_comm *m = c->impl;
  pthread_mutex_lock(&m->lock); /* (rs_ux_on_ep_error walks ep under it) */
  *out = (numbering){c->size, c->rank, m->ep, m->peer_failed, m->addrs, m->alens};
  m->ep = in->ep, m->peer_failed = in->peer_failed, m->size = in->size;
  pthread_mutex_unlock(&m->lock);
  m->addrs = in->addrs, m->alens = in->alens;
  c->size = in->size, c->rank = in->rank;
}

/* Frees a numbering put out of place. The endpoints and addresses it
 * shares with the one in place stay; `own` names the slots only it holds
 * (the leaving ranks' in the old one: their endpoints are closed
 * already; the newcomers' in a new one given up: forgotten already). */
static void renumber_free(numbering *o, const rejoin_set *own) {
  for (int i = 0; o->addrs && i < own->n; i++) free(o->addrs[own->r[i]]);
  free(o->ep), free(o->peer_failed), free(o->addrs), free(o->alens);
}

/* After a resize held: every agreement abandoned before it named ranks of
 * the old numbering, and can never complete. */
static void cut_abandoned(reshard_comm_t *c) {
  ux_comm *m = c->impl;
  for (int i = 0; i < m->nabandoned; i++) {
    ux_coll *k = m->abandoned[i];
    for (int p = 0; k && p < k->size; p++) {
      if (k->recv[p]) rs_ux_cancel(c, k->recv[p]), k->recv[p] = NULL;
      if (k->send[p]) rs_ux_cancel(c, k->send[p]), k->send[p] = NULL;
    }
    if (k) k->cut = 1;
  }
}

reshard_result_t reshard_comm_ucx_resize(reshard_comm_t *c, const int *leaving, int nleave, int njoin,
                                         int timeout_ms) {
  rs_error_clear();
  RS_CHECK(changeable(c, "comm_ucx_resize"));
  ux_comm *m = c->impl;
  if (njoin < 0 || (nleave == 0 && njoin == 0) || (int64_t)c->size - nleave + njoin >= MAX_RANKS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_ucx_resize rank %d: %d leaving and %d joining, of size %d "
                    "(nothing to change, a negative count, or over %d ranks)", c->rank, nleave, njoin, c->size,
                    MAX_RANKS - 1);
  rejoin_set gone = {NULL, 0, 0};
  reshard_result_t r = check_ranks(c, leaving, nleave, 1, &gone);
  const int old_size = c->size, size = c->size - nleave + njoin;
  /* the newcomers' slots, and what every staying rank must agree on */
  rejoin_set join = {NULL, njoin, 0};
  if (!r && !(join.r = malloc((size_t)(njoin ? njoin : 1) * sizeof *join.r)))
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_ucx_resize: out of memory");
  for (int i = 0; !r && i < njoin; i++) join.r[i] = old_size - nleave + i;
  join.hash = rs_mix64(gone.hash ^ rs_mix64((uint64_t)(uint32_t)old_size << 32 | (uint32_t)njoin) ^
                       UINT64_C(0x726573697a65)) | 1; /* ("resize": never a rejoin's hash) */
  numbering nw = {0}, old = {0};
  if (!r) r = renumber_make(c, &gone, size, &nw);
  if (r) {
    free(gone.r), free(join.r);
    return r;
  }
  const int64_t deadline = rs_ux_deadline_of(timeout_ms);
  for (int i = 0; i < gone.n; i++) forget_rank(c, gone.r[i], 0);
  renumber_swap(c, &nw, &old);
  int retry = 0;
  r = meet_newcomers(c, &join, deadline, timeout_ms, &retry);
  if (r && retry) { /* the numbering of before back: the call may be made again */
    numbering given_up;
    renumber_swap(c, &old, &given_up);
    renumber_free(&given_up, &join);
    rs_error_prefix("comm_ucx_resize rank %d (%d leaving, %d joining; nothing changed but the leaving ranks' "
                    "connections closed: call it again, on every staying rank, to wait for the newcomers longer): ",
                    c->rank, nleave, njoin);
    free(gone.r), free(join.r);
    return r;
  }
  renumber_free(&old, &gone);
  cut_abandoned(c);
  c->nreplaced = 0;
  c->resizes++;
  if (r) {
    m->failed = 1;
    rs_error_prefix("comm_ucx_resize rank %d (now rank %d of %d; %d leaving, %d joining; the communicator is "
                    "failed now): ", (int)old.rank, c->rank, size, nleave, njoin);
  }
  free(gone.r), free(join.r);
  return r;
}
