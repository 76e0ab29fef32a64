/* One-sided reads over UCX: the transport's rma_* operations
 * (transport.h), which the host executor's registered buffers use
 * (reshard_plan_register_buffers on a UCX communicator, exec/register.c).
 *
 * rma_share registers this rank's buffers with ucp_mem_map, packs their
 * remote keys and exchanges, with every partner, one message of
 *
 *   u64 nbufs, then per buffer u64 address, bytes, key length,
 *   then the keys, then the caller's bytes (sh[i].out)
 *
 * preceded by its length (so that no receive of unknown size is needed).
 * Each partner's keys are unpacked on the endpoint to it. rma_get is
 * ucp_get_nbx from a partner's registered buffer into local memory; the
 * set counts the reads in flight (their callbacks run in worker progress,
 * under the communicator's lock), and rma_flush progresses the worker
 * until none is left. A read is a get, not a put: the reader knows when
 * its own destination may be written (its call's agreement passed), and
 * the writer's side only needs "my data is ready" and "you are done",
 * the two tokens per round the executor sends anyway (as on CUDA IPC).
 *
 * A set made with a kept one (rma_share's keep: a registration held over
 * a rejoin, exec/register.c) borrows from it what did not change: this
 * rank's registrations of the same buffers (no ucp_mem_map again) and the
 * table entries of the partners it skips (no exchange); rma_adopt makes
 * the new set their owner. Each borrowed item records where in the kept
 * set it came from, so that the hand-over is one pass. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/error.h"
#include "transport/stream.h"
#include "transport/transport.h"
#include "transport/ucx_internal.h"

typedef struct ux_rbuf {
  int peer;
  uint64_t addr, len;
  ucp_rkey_h rkey; /* NULL: the partner registered nothing there */
  int64_t from;    /* borrowed from the kept set's entry `from`; -1: own */
} ux_rbuf;

typedef struct ux_rma_set {
  size_t nmem;
  ucp_mem_h *mem; /* this rank's registrations (NULL entries: none) */
  uint64_t *maddr, *mlen; /* what each registers */
  unsigned char *mborrowed; /* mem[b] is the kept set's mem[b] */
  size_t nrb;
  ux_rbuf *rb;    /* the table: every partner's buffers, in sh order */
  /* reads in flight, and the first failure among them (under the lock) */
  uint64_t pending;
  ucs_status_t failed;
  int failed_peer;
} ux_rma_set;

typedef struct ux_get {
  ux_rma_set *set;
  int peer;
} ux_get;

static void free_set(ux_comm *m, ux_rma_set *s) {
  if (!s) return;
  pthread_mutex_lock(&m->lock);
  for (size_t i = 0; i < s->nrb; i++)
    if (s->rb[i].rkey && s->rb[i].from < 0) ucp_rkey_destroy(s->rb[i].rkey);
  for (size_t i = 0; s->mem && i < s->nmem; i++)
    if (s->mem[i] && !(s->mborrowed && s->mborrowed[i])) ucp_mem_unmap(m->ctx, s->mem[i]);
  pthread_mutex_unlock(&m->lock);
  free(s->rb);
  free(s->mem);
  free(s->maddr);
  free(s->mlen);
  free(s->mborrowed);
  free(s);
}

/* Buffer b's registration: the kept set's when it registered the same
 * bytes at the same address, else a new one. */
static ucs_status_t map_one(ux_comm *m, ux_rma_set *s, const ux_rma_set *keep, size_t b, void *buf, uint64_t bytes) {
  s->maddr[b] = (uint64_t)(uintptr_t)buf, s->mlen[b] = bytes;
  if (keep && b < keep->nmem && keep->mem[b] && keep->maddr[b] == s->maddr[b] && keep->mlen[b] == bytes) {
    s->mem[b] = keep->mem[b], s->mborrowed[b] = 1;
    return UCS_OK;
  }
  ucp_mem_map_params_t mp;
  memset(&mp, 0, sizeof mp);
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = buf;
  mp.length = bytes;
  return ucp_mem_map(m->ctx, &mp, &s->mem[b]);
}

/* This rank's message to every partner (minus the caller's bytes): the
 * registrations and their packed keys. */
static reshard_result_t map_mine(reshard_comm_t *c, ux_rma_set *s, const ux_rma_set *keep, void *const *bufs,
                                 const uint64_t *bytes, size_t nb, unsigned char **out, size_t *out_len) {
  ux_comm *m = c->impl;
  void **keys = calloc(nb + 1, sizeof *keys);
  size_t *klen = calloc(nb + 1, sizeof *klen);
  s->mem = calloc(nb + 1, sizeof *s->mem);
  s->maddr = calloc(nb + 1, sizeof *s->maddr), s->mlen = calloc(nb + 1, sizeof *s->mlen);
  s->mborrowed = calloc(nb + 1, 1);
  s->nmem = nb;
  reshard_result_t r = keys && klen && s->mem && s->maddr && s->mlen && s->mborrowed
                           ? RESHARD_SUCCESS
                           : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  size_t total = 8 + nb * 24;
  for (size_t b = 0; !r && b < nb; b++) {
    if (!bufs[b] || !bytes[b]) continue;
    pthread_mutex_lock(&m->lock);
    ucs_status_t st = map_one(m, s, keep, b, bufs[b], bytes[b]);
    if (st == UCS_OK) st = ucp_rkey_pack(m->ctx, s->mem[b], &keys[b], &klen[b]);
    pthread_mutex_unlock(&m->lock);
    if (st != UCS_OK) {
      r = rs_error(RESHARD_ERROR_BACKEND, "register_buffers rank %d: buffer %zu (%p, %llu bytes) cannot be "
                   "registered with UCX: %s", c->rank, b, bufs[b], (unsigned long long)bytes[b],
                   ucs_status_string(st));
      break;
    }
    total += klen[b];
  }
  unsigned char *msg = r ? NULL : malloc(total);
  if (!r && !msg) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  if (!r) {
    uint64_t v = nb;
    unsigned char *at = msg + 8 + nb * 24;
    memcpy(msg, &v, 8);
    for (size_t b = 0; b < nb; b++) {
      uint64_t w[3] = {(uint64_t)(uintptr_t)bufs[b], keys[b] ? bytes[b] : 0, keys[b] ? klen[b] : 0};
      memcpy(msg + 8 + b * 24, w, sizeof w);
      if (keys[b]) memcpy(at, keys[b], klen[b]), at += klen[b];
    }
    *out = msg;
    *out_len = total;
  }
  for (size_t b = 0; keys && b < nb; b++)
    if (keys[b]) ucp_rkey_buffer_release(keys[b]);
  free(keys);
  free(klen);
  return r;
}

/* Room for nb more table entries of partner sh, and sh's nb buffers. */
static reshard_result_t make_room(reshard_comm_t *c, ux_rma_set *s, rs_share *sh, size_t nb) {
  sh->bufs = calloc(nb + 1, sizeof *sh->bufs);
  sh->lens = calloc(nb + 1, sizeof *sh->lens);
  ux_rbuf *rb = realloc(s->rb, (s->nrb + nb + 1) * sizeof *rb);
  if (rb) s->rb = rb;
  if (!sh->bufs || !sh->lens || !rb) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  sh->nbufs = nb;
  return RESHARD_SUCCESS;
}

/* Partner sh's message: its table entries (keys unpacked on the endpoint
 * to it), and the caller's bytes into sh->in. */
static reshard_result_t take_theirs(reshard_comm_t *c, ux_rma_set *s, rs_share *sh, const unsigned char *msg,
                                    size_t len) {
  ux_comm *m = c->impl;
  uint64_t nb = 0;
  if (len >= 8) memcpy(&nb, msg, 8);
  if (len < 8 || nb > (len - 8) / 24)
    return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: rank %d's registration message is "
                    "malformed (%zu bytes)", c->rank, sh->peer, len);
  const unsigned char *keys = msg + 8 + nb * 24, *end = msg + len;
  RS_CHECK(make_room(c, s, sh, nb));
  for (uint64_t b = 0; b < nb; b++) {
    uint64_t w[3];
    memcpy(w, msg + 8 + b * 24, sizeof w);
    ux_rbuf *e = &s->rb[s->nrb++];
    *e = (ux_rbuf){sh->peer, w[0], w[1], NULL, -1};
    if (!w[2]) continue;
    if (w[2] > (uint64_t)(end - keys))
      return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: rank %d's registration message is "
                      "malformed (key %llu)", c->rank, sh->peer, (unsigned long long)b);
    pthread_mutex_lock(&m->lock);
    ucs_status_t st = ucp_ep_rkey_unpack(m->ep[sh->peer], keys, &e->rkey);
    pthread_mutex_unlock(&m->lock);
    if (st != UCS_OK) {
      e->rkey = NULL;
      return rs_error(RESHARD_ERROR_BACKEND, "register_buffers rank %d: rank %d's key for its buffer %llu: %s",
                      c->rank, sh->peer, (unsigned long long)b, ucs_status_string(st));
    }
    keys += w[2];
    sh->bufs[b] = (void *)(uintptr_t)w[0];
    sh->lens[b] = w[1];
  }
  sh->in_bytes = (size_t)(end - keys);
  sh->in = malloc(sh->in_bytes + 1);
  if (!sh->in) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  memcpy(sh->in, keys, sh->in_bytes);
  return RESHARD_SUCCESS;
}

/* A skipped partner's table entries, keys included, borrowed from the
 * kept set (its entries are contiguous there, as every set's). */
static reshard_result_t borrow_theirs(reshard_comm_t *c, ux_rma_set *s, const ux_rma_set *keep, rs_share *sh) {
  size_t at = 0, nb = 0;
  while (keep && at < keep->nrb && keep->rb[at].peer != sh->peer) at++;
  while (keep && at + nb < keep->nrb && keep->rb[at + nb].peer == sh->peer) nb++;
  if (!nb)
    return rs_error(RESHARD_ERROR_INTERNAL, "register_buffers rank %d: the kept registration has nothing of rank "
                    "%d to keep", c->rank, sh->peer);
  RS_CHECK(make_room(c, s, sh, nb));
  for (size_t b = 0; b < nb; b++) {
    const ux_rbuf *k = &keep->rb[at + b];
    s->rb[s->nrb++] = (ux_rbuf){k->peer, k->addr, k->len, k->rkey, (int64_t)(at + b)};
    sh->bufs[b] = k->rkey ? (void *)(uintptr_t)k->addr : NULL;
    sh->lens[b] = k->rkey ? k->len : 0;
  }
  return RESHARD_SUCCESS;
}

/* Waits for every request of reqs[0..n) (NULL: none); the first failure
 * is the result, the rest are cancelled. */
static reshard_result_t wait_all(reshard_comm_t *c, rs_request **reqs, size_t n, int64_t deadline) {
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t i = 0; i < n; i++) {
    if (!reqs[i]) continue;
    if (r) {
      rs_ux_cancel(c, reqs[i]);
    } else {
      reshard_result_t w = rs_ux_wait(c, reqs[i], deadline);
      if (w == RESHARD_ERROR_TIMEOUT) rs_ux_cancel(c, reqs[i]);
      r = w;
    }
    reqs[i] = NULL;
  }
  return r;
}

reshard_result_t rs_ux_rma_share(reshard_comm_t *c, uint64_t tag, void *const *bufs, const uint64_t *bytes,
                                 size_t nbufs, rs_share *sh, size_t n, int64_t deadline, void *keep_set, void **set) {
  ux_comm *m = c->impl;
  const ux_rma_set *keep = keep_set;
  *set = NULL;
  if (m->failed) return rs_ux_refuse_failed(c);
  static const uint64_t none = 0; /* the message of a rank that failed: no buffers */
  ux_rma_set *s = calloc(1, sizeof *s);
  unsigned char *mine = NULL, **in = calloc(n + 1, sizeof *in), **out = calloc(n + 1, sizeof *out);
  uint64_t *len = calloc(2 * n + 1, sizeof *len);
  rs_request **req = calloc(2 * n + 1, sizeof *req);
  size_t mine_len = 0;
  if (!s || !in || !out || !len || !req) {
    free(s), free(in), free(out), free(len), free(req);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", c->rank);
  }
  /* (no buffers: the caller failed already and keeps its own message) */
  reshard_result_t r = bufs ? map_mine(c, s, keep, bufs, bytes, nbufs, &mine, &mine_len) : RESHARD_ERROR_INVALID_ARGUMENT;
  /* Every partner gets a message whatever failed here (none, 8 bytes),
   * so that no partner waits for this rank. */
  for (size_t i = 0; i < n; i++) {
    if (!r) out[i] = malloc(mine_len + sh[i].out_bytes + 1);
    if (!r && !out[i]) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", c->rank);
  }
  for (size_t i = 0; i < n; i++) {
    if (r) {
      free(out[i]);
      out[i] = NULL;
      len[n + i] = 8;
      continue;
    }
    memcpy(out[i], mine, mine_len);
    if (sh[i].out_bytes) memcpy(out[i] + mine_len, sh[i].out, sh[i].out_bytes);
    len[n + i] = mine_len + sh[i].out_bytes;
  }
  /* The lengths first (tag | 1), then the messages (tag); none with a
   * skipped partner. */
  for (size_t i = 0; i < n; i++) {
    if (sh[i].skip) continue;
    reshard_result_t q = c->ops->irecv(c, sh[i].peer, tag | 1, &len[i], 8, &req[i]);
    if (!q) q = c->ops->isend(c, sh[i].peer, tag | 1, &len[n + i], 8, &req[n + i]);
    if (q && !r) r = q;
  }
  reshard_result_t w = wait_all(c, req, 2 * n, deadline);
  if (!r) r = w;
  for (size_t i = 0; !w && i < n; i++) {
    if (sh[i].skip) continue;
    in[i] = malloc(len[i] + 1);
    reshard_result_t q = in[i] ? c->ops->irecv(c, sh[i].peer, tag, in[i], len[i], &req[i])
                               : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", c->rank);
    if (!q) q = c->ops->isend(c, sh[i].peer, tag, out[i] ? (const void *)out[i] : (const void *)&none, len[n + i],
                              &req[n + i]);
    if (q && !r) r = q;
  }
  if (!w) w = wait_all(c, req, 2 * n, deadline);
  if (!r) r = w;
  for (size_t i = 0; !r && i < n; i++)
    r = sh[i].skip ? borrow_theirs(c, s, keep, &sh[i]) : take_theirs(c, s, &sh[i], in[i], len[i]);
  for (size_t i = 0; i < n; i++) free(in[i]), free(out[i]);
  free(in), free(out), free(len), free(req), free(mine);
  if (r) {
    free_set(m, s);
    return r;
  }
  *set = s;
  return RESHARD_SUCCESS;
}

static void on_get(void *request, ucs_status_t status, void *user) {
  ux_get *g = user;
  if (status != UCS_OK && g->set->failed == UCS_OK) g->set->failed = status, g->set->failed_peer = g->peer;
  g->set->pending--;
  free(g);
  ucp_request_free(request);
}

reshard_result_t rs_ux_rma_get(reshard_comm_t *c, void *set, size_t t, uint64_t off, void *to, size_t bytes) {
  ux_comm *m = c->impl;
  ux_rma_set *s = set;
  if (!bytes) return RESHARD_SUCCESS;
  if (t >= s->nrb || !s->rb[t].rkey || off > s->rb[t].len || bytes > s->rb[t].len - off)
    return rs_error(RESHARD_ERROR_MISMATCH, "rank %d: a read of %zu bytes at %llu of table entry %zu (rank %d's) "
                    "is outside what that rank registered", c->rank, bytes, (unsigned long long)off, t,
                    t < s->nrb ? s->rb[t].peer : -1);
  ux_get *g = malloc(sizeof *g);
  if (!g) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  g->set = s;
  g->peer = s->rb[t].peer;
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = on_get;
  p.user_data = g;
  pthread_mutex_lock(&m->lock);
  ucs_status_ptr_t sp = ucp_get_nbx(m->ep[g->peer], to, bytes, s->rb[t].addr + off, s->rb[t].rkey, &p);
  if (sp != NULL && !UCS_PTR_IS_ERR(sp)) s->pending++;
  pthread_mutex_unlock(&m->lock);
  if (sp == NULL || UCS_PTR_IS_ERR(sp)) free(g);
  if (UCS_PTR_IS_ERR(sp)) return rs_ux_fail(UCS_PTR_STATUS(sp), "ucp_get_nbx", c->rank, s->rb[t].peer);
  return RESHARD_SUCCESS;
}

reshard_result_t rs_ux_rma_flush(reshard_comm_t *c, void *set, int64_t deadline) {
  ux_comm *m = c->impl;
  ux_rma_set *s = set;
  for (unsigned spin = 0, idle = 0;; spin++) {
    pthread_mutex_lock(&m->lock);
    /* A large read moves in fragments, each issued from progress: no nap
     * while the worker makes progress (a nap between bursts throttled a
     * 64 MiB read over shared memory to a third of the tagged path's
     * speed). */
    int moved = 0;
    for (int k = 0; k < 64 && s->pending && ucp_worker_progress(m->worker); k++) moved = 1;
    idle = moved ? 0 : idle + 1;
    const uint64_t left = s->pending;
    const ucs_status_t f = s->failed;
    const int fp = s->failed_peer;
    pthread_mutex_unlock(&m->lock);
    if (!left && f == UCS_OK) return RESHARD_SUCCESS;
    if (!left) return rs_ux_fail(f, "a one-sided read (ucp_get_nbx)", c->rank, fp);
    if (spin > 64 && rs_now_ns() > deadline)
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: %llu one-sided read(s) did not complete before the deadline",
                      c->rank, (unsigned long long)left);
    rs_nap(idle);
  }
}

void rs_ux_rma_adopt(reshard_comm_t *c, void *set, void *keep_set) {
  ux_rma_set *s = set, *keep = keep_set;
  if (!keep) return;
  for (size_t b = 0; b < s->nmem; b++)
    if (s->mborrowed[b]) keep->mem[b] = NULL, s->mborrowed[b] = 0;
  for (size_t i = 0; i < s->nrb; i++)
    if (s->rb[i].from >= 0) keep->rb[s->rb[i].from].rkey = NULL, s->rb[i].from = -1;
  rs_ux_rma_unshare(c, keep);
}

/* Reads still in flight (a call that failed past its deadline) keep the
 * set: it is leaked rather than freed under their callbacks. */
void rs_ux_rma_unshare(reshard_comm_t *c, void *set) {
  ux_comm *m = c->impl;
  ux_rma_set *s = set;
  if (!s) return;
  if (rs_ux_rma_flush(c, s, rs_now_ns() + 1000000000) == RESHARD_ERROR_TIMEOUT) return;
  free_set(m, s);
}
