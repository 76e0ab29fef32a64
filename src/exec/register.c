/* The host executor's registered buffers (register.h): every rank
 * registers the buffers its partners read (sources, and the destinations
 * its relay forwards read) with the transport, exchanges the keys and its
 * send copies with each partner (the transport's rma_share), and composes
 * each of its receive copies with the sender's copy of the same box
 * (exec/direct.c, as the device executor does for CUDA IPC): a
 * registered execute then reads each box from the sender's buffer into
 * its own destination. Apart from execute.c because registration is
 * collective set-up, not a call's work.
 *
 * After a rejoin (reshard_plan_rejoin) the plan's registration is held,
 * not used. The next registration keeps what did not change when every
 * staying rank passes the buffers it registered (agreed first, keep_mode):
 * the staying ranks keep their registrations and their partners' keys,
 * and only pairs with the newcomer trade (the transport's rma_share with
 * the held set, sh[i].skip for the rest); the receive copies from a
 * skipped partner are the held ones. Otherwise every rank registers anew,
 * as at first. */
#include "exec/register.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "common/hash.h"
#include "exec/direct.h"
#include "exec/exec_state.h"
#include "transport/stream.h"
#include "transport/transport.h"

static void reg_free(reshard_comm_t *c, rs_host_reg *g) {
  if (!g) return;
  if (g->set) c->ops->rma_unshare(c, g->set);
  free(g->bufs);
  free(g->copies);
  free(g->spacked);
  free(g->rpacked);
  free(g->rentry);
  free(g->roff);
  free(g->base);
  free(g->replaced);
  free(g);
}

int rs_host_packs(const rs_copy *cps, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    const rs_copy *c = &cps[i];
    if (c->ndim > 0 && c->run_bytes < RS_DIRECT_SHORT_RUN && rs_direct_src_end(c) - c->src_off != rs_copy_bytes(c))
      return 1;
  }
  return 0;
}

/* The length of the send-copies blob at the head of a partner's bytes
 * (rs_direct_blob's format); 0 when malformed. */
static size_t blob_len(const unsigned char *b, size_t n) {
  uint64_t nmsg = 0, nc = 0;
  size_t at = 8;
  if (n < 8) return 0;
  memcpy(&nmsg, b, 8);
  for (uint64_t i = 0; i < nmsg; i++) {
    if (at + 8 > n) return 0;
    memcpy(&nc, b + at, 8);
    if (nc > (n - at - 8) / sizeof(rs_copy)) return 0;
    at += 8 + nc * sizeof(rs_copy);
  }
  return at;
}

/* This rank's bytes for partner `peer`: the send-copies blob, then per
 * message to it whether this rank packs it and where in its staging (the
 * send half of its round). */
static reshard_result_t blob_for(const reshard_plan_t *p, int peer, const unsigned char *spacked, void **out,
                                 size_t *bytes) {
  void *b = NULL;
  size_t n = 0, nmsg = 0;
  RS_CHECK(rs_direct_blob(p, peer, &b, &n));
  for (size_t i = 0; i < p->nsends; i++) nmsg += p->sends[i].peer == peer;
  unsigned char *o = realloc(b, n + 16 * nmsg + 1);
  if (!o) {
    free(b);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", p->rank);
  }
  for (size_t i = 0, at = n; i < p->nsends; i++) {
    const rs_msg *m = &p->sends[i];
    if (m->peer != peer) continue;
    uint64_t w[2] = {spacked[i], (uint64_t)(m->round & 1) * p->send_half + m->staging_off};
    memcpy(o + at, w, 16), at += 16;
  }
  *out = o;
  *bytes = n + 16 * nmsg;
  return RESHARD_SUCCESS;
}

/* The partners' packing words (after their blobs) into g's receive
 * arrays: the k-th message from a partner is its k-th word pair. */
static reshard_result_t take_packing(const reshard_plan_t *p, const rs_share *sh, size_t np, const uint32_t *base,
                                     rs_host_reg *g) {
  for (size_t i = 0; i < np; i++) {
    const unsigned char *in = sh[i].in;
    size_t at = blob_len(in, sh[i].in_bytes);
    for (size_t j = 0; j < p->nrecvs; j++) {
      if (p->recvs[j].peer != sh[i].peer) continue;
      uint64_t w[2];
      if (!at || at + 16 > sh[i].in_bytes)
        return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: rank %d's registration lacks the packing "
                        "of its messages to this rank; the ranks' plans differ", p->rank, sh[i].peer);
      memcpy(w, in + at, 16), at += 16;
      g->rpacked[j] = w[0] != 0;
      g->roff[j] = w[1];
      g->rentry[j] = base[i] + (uint32_t)sh[i].nbufs - 1; /* its staging: the last of its buffers */
      if (w[0] && (!sh[i].lens || w[1] + p->recvs[j].bytes > sh[i].lens[sh[i].nbufs - 1]))
        return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: rank %d packs a message of %llu bytes "
                        "past the staging it registered", p->rank, sh[i].peer, (unsigned long long)p->recvs[j].bytes);
    }
  }
  return RESHARD_SUCCESS;
}

void rs_host_reg_free(reshard_plan_t *p) {
  reg_free(p->comm, p->host_reg);
  reg_free(p->comm, p->host_reg_kept);
  p->host_reg = p->host_reg_kept = NULL;
}

void rs_host_reg_hold(reshard_plan_t *p) {
  reg_free(p->comm, p->host_reg_kept);
  rs_host_reg *k = p->host_reg_kept = p->host_reg;
  p->host_reg = NULL;
  if (!k) return;
  const reshard_comm_t *c = p->comm;
  k->replaced = malloc(((size_t)c->nreplaced + 1) * sizeof *k->replaced);
  if (!k->replaced) { /* (then nothing is kept: the next registration is a fresh one) */
    reg_free(p->comm, k);
    p->host_reg_kept = NULL;
    return;
  }
  for (int32_t i = 0; i < c->nreplaced; i++) k->replaced[i] = c->replaced[i];
  k->nreplaced = c->nreplaced;
}

static int replaced_by(const rs_host_reg *k, int rank) {
  for (int32_t i = 0; i < k->nreplaced; i++)
    if (k->replaced[i] == rank) return 1;
  return 0;
}

/* Whether this registration keeps the held one (collective: one
 * agreement, run whatever failed before). Each rank says whether it
 * forces a fresh registration (a staying rank that holds none, or
 * registers other buffers; a rank that failed) and, a staying rank, which
 * ranks its held registration's rejoin replaced (a hash; a newcomer of
 * that rejoin says nothing); the held one is kept when no rank forces and
 * the staying ranks name the same ranks. *keep: the held registration to
 * keep (its replaced ranks the partners to trade with), or NULL (also on
 * a newcomer, which holds none and trades with every partner). */
static reshard_result_t keep_mode(reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst,
                                  reshard_result_t r, const rs_host_reg **keep) {
  const reshard_comm_t *c = p->comm;
  const rs_host_reg *k = p->host_reg_kept;
  const size_t nb = (size_t)p->num_src_buffers + (size_t)p->num_dst_buffers;
  int same = k && k->nbufs == nb;
  for (size_t i = 0; same && i < nb; i++) same = k->bufs[i] == rs_direct_call_buf(p, src, nsrc, dst, ndst, i);
  const int newcomer = !k && !p->host_reg && c->joined && c->joined == c->rejoins + 1;
  const uint64_t h = same ? rs_hash_ranks(k->replaced, k->nreplaced) : 0;
  /* (the largest of h and of ~h: all staying ranks' h equal when the
   * first is the complement of the second) */
  uint64_t w[3] = {r || (!same && !newcomer), h, same ? ~h : 0};
  reshard_result_t ra = c->ops->allreduce_max_u64((reshard_comm_t *)c, w, 3, rs_deadline_after_ms(p->opts.timeout_ms));
  const int keeps = !ra && !w[0] && w[1] && w[1] == ~w[2];
  *keep = keeps && same ? k : NULL;
  return ra;
}

/* The receive side of partners this rank skipped: their copies, packing
 * and staging entries as the held registration had them (its table
 * entries shifted to where the new table has the partner's). */
static void take_kept(const reshard_plan_t *p, const rs_share *sh, const uint32_t *base, const rs_host_reg *k,
                      rs_host_reg *g) {
  for (size_t i = 0; i < p->npeers; i++) {
    if (!sh[i].skip) continue;
    const int64_t shift = (int64_t)base[i] - (int64_t)k->base[i];
    for (size_t j = 0; j < p->nrecvs; j++) {
      const rs_msg *m = &p->recvs[j];
      if (m->peer != sh[i].peer) continue;
      g->rpacked[j] = k->rpacked[j];
      g->roff[j] = k->roff[j];
      g->rentry[j] = (uint32_t)((int64_t)k->rentry[j] + shift);
      for (uint32_t q = 0; q < m->ncopies; q++) {
        g->copies[m->first_copy + q] = k->copies[m->first_copy + q];
        g->copies[m->first_copy + q].src_buf = (int32_t)(k->copies[m->first_copy + q].src_buf + shift);
      }
    }
  }
}

/* The bytes of each of this rank's buffers (sources, then destinations)
 * that its partners read: the furthest byte of the send copies reading
 * it (a relay forward's read a destination buffer); 0: none. */
static void read_extents(const reshard_plan_t *p, uint64_t *bytes) {
  for (size_t i = 0; i < p->nsends; i++) {
    const rs_msg *m = &p->sends[i];
    for (uint32_t k = 0; k < m->ncopies; k++) {
      const rs_copy *c = &p->send_copies[m->first_copy + k];
      if (c->src_buf < 0) continue;
      size_t b = (size_t)c->src_buf + (m->fwd ? (size_t)p->num_src_buffers : 0);
      uint64_t end = rs_direct_src_end(c);
      if (end > bytes[b]) bytes[b] = end;
    }
  }
}

/* What this rank cannot read one-sidedly: a cast (the read moves bytes
 * as they are), and reads past what the sender registered; of the
 * messages from the partners sh[0..np) (those traded with). */
static reshard_result_t check_composed(const reshard_plan_t *p, const rs_share *sh, size_t np, const uint32_t *base,
                                       const rs_host_reg *g) {
  const rs_copy *hc = g->copies;
  for (size_t j = 0; j < np; j++) {
    for (size_t i = 0; i < p->nrecvs; i++) {
      const rs_msg *m = &p->recvs[i];
      if (m->peer != sh[j].peer) continue;
      for (uint32_t k = 0; k < m->ncopies; k++) {
        const rs_copy *c = &hc[m->first_copy + k];
        if (c->cvt_from || c->cvt_to)
          return rs_error(RESHARD_ERROR_UNSUPPORTED, "register_buffers rank %d: the plan converts dtypes on a box "
                          "from rank %d, which a one-sided read cannot (it moves bytes as they are); execute "
                          "without registering", p->rank, m->peer);
        const size_t b = (size_t)c->src_buf - base[j];
        if ((uint32_t)c->src_buf < base[j] || b >= sh[j].nbufs || !sh[j].lens || rs_direct_src_end(c) > sh[j].lens[b])
          return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: a box of rank %d's buffer %zu lies "
                          "past the bytes that rank registered; the ranks' plans differ", p->rank, m->peer, b);
      }
    }
  }
  return RESHARD_SUCCESS;
}

/* The partners traded with (not skipped) and their first table entries,
 * compacted into sh2 and base2 (shallow copies); their number. */
static size_t traded(const rs_share *sh, const uint32_t *base, size_t np, rs_share *sh2, uint32_t *base2) {
  size_t n = 0;
  for (size_t i = 0; i < np; i++)
    if (!sh[i].skip) sh2[n] = sh[i], base2[n++] = base[i];
  return n;
}

/* This rank's part: share, compose, check; *out the new registration.
 * With keep (keep_mode), the partners other than the replaced ranks are
 * skipped. */
static reshard_result_t build(reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst,
                              reshard_result_t r, const rs_host_reg *keep, rs_host_reg **out) {
  reshard_comm_t *c = p->comm;
  const size_t np = p->npeers, nb = nsrc + ndst;
  rs_share *sh = calloc(np + 1, sizeof *sh);
  uint32_t *base = calloc(np + 1, sizeof *base), *base2 = calloc(np + 1, sizeof *base2);
  rs_share *sh2 = calloc(np + 1, sizeof *sh2);
  /* the buffers partners read: this rank's (sources, destinations) and
   * its send staging, where it packs the messages rs_host_packs names */
  uint64_t *bytes = calloc(nb + 2, sizeof *bytes);
  void **shared = calloc(nb + 2, sizeof *shared);
  rs_host_reg *g = calloc(1, sizeof *g);
  if (g) {
    g->bufs = calloc(nb + 1, sizeof *g->bufs), g->copies = malloc((p->nrecv_copies + 1) * sizeof *g->copies);
    g->spacked = calloc(p->nsends + 1, 1), g->rpacked = calloc(p->nrecvs + 1, 1);
    g->rentry = calloc(p->nrecvs + 1, sizeof *g->rentry), g->roff = calloc(p->nrecvs + 1, sizeof *g->roff);
  }
  if (!r && (!sh || !base || !base2 || !sh2 || !bytes || !shared || !g || !g->bufs || !g->copies || !g->spacked ||
             !g->rpacked || !g->rentry || !g->roff))
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", p->rank);
  for (size_t i = 0; !r && i < nb; i++) shared[i] = g->bufs[i] = rs_direct_call_buf(p, src, nsrc, dst, ndst, i);
  if (!r) g->nbufs = nb, read_extents(p, bytes);
  int packs = 0;
  for (size_t i = 0; !r && i < p->nsends; i++)
    packs |= g->spacked[i] = (unsigned char)rs_host_packs(&p->send_copies[p->sends[i].first_copy], p->sends[i].ncopies);
  if (!r && packs) {
    shared[nb] = rs_host_staging(p), bytes[nb] = 2 * p->send_half;
    if (!shared[nb])
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: cannot allocate %zu bytes of staging",
                   p->rank, rs_staging_bytes(p));
  }
  for (size_t i = 0; sh && i < np; i++) {
    sh[i].peer = p->peers[i].peer;
    sh[i].skip = keep && !replaced_by(keep, sh[i].peer);
    if (!r && !sh[i].skip) r = blob_for(p, sh[i].peer, g->spacked, (void **)&sh[i].out, &sh[i].out_bytes);
  }
  /* the exchange runs whatever failed here, so that no partner waits */
  if (sh) {
    const uint64_t tag = p->tag_base | RS_TAG_CONTROL | RS_CTL_REGISTER;
    void *set = NULL;
    reshard_result_t rs = c->ops->rma_share(c, tag, r ? NULL : shared, bytes, r ? 0 : nb + 1, sh, np,
                                            rs_deadline_after_ms(p->opts.timeout_ms), keep ? keep->set : NULL, &set);
    if (g) g->set = set;
    else if (set) c->ops->rma_unshare(c, set);
    if (!r) r = rs;
  }
  uint32_t ntab = 0;
  for (size_t i = 0; !r && i < np; i++) base[i] = ntab, ntab += (uint32_t)sh[i].nbufs;
  /* a partner that failed before the exchange sent no buffers at all */
  for (size_t i = 0; !r && i < np; i++)
    if (!sh[i].skip && !sh[i].nbufs)
      r = rs_error(RESHARD_ERROR_REMOTE, "register_buffers rank %d: rank %d failed to register its buffers (see its "
                   "error); the previous registration stays", p->rank, sh[i].peer);
  const size_t n2 = r ? 0 : traded(sh, base, np, sh2, base2);
  if (g) g->traded = n2;
  if (!r) r = rs_direct_compose(p, sh2, n2, base2, g->copies);
  if (!r) r = take_packing(p, sh2, n2, base2, g);
  if (!r) r = check_composed(p, sh2, n2, base2, g);
  if (!r && keep) take_kept(p, sh, base, keep, g);
  if (!r) g->base = base, base = NULL;
  for (size_t i = 0; sh && i < np; i++) {
    free((void *)sh[i].out);
    free(sh[i].in);
    free(sh[i].bufs);
    free(sh[i].lens);
  }
  free(sh);
  free(sh2);
  free(base);
  free(base2);
  free(bytes);
  free(shared);
  if (r) {
    reg_free(c, g);
    return r;
  }
  *out = g;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_host_register(reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst) {
  reshard_comm_t *c = p->comm;
  if (!c->ops->rma_share) return rs_register_unsupported(p);
  const int unregister = !src && !dst && !nsrc && !ndst;
  reshard_result_t r = rs_plan_refuse_if_failed(p, "register_buffers");
  if (!r && (p->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER))
    r = rs_error(RESHARD_ERROR_UNSUPPORTED, "register_buffers rank %d: not with RESHARD_FLAG_DOUBLE_BUFFER (yet)",
                 p->rank);
  else if (!r && !unregister && (nsrc != (size_t)p->num_src_buffers || ndst != (size_t)p->num_dst_buffers))
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "register_buffers rank %d: %zu source and %zu destination buffers "
                 "given, the layouts have %d and %d", p->rank, nsrc, ndst, p->num_src_buffers, p->num_dst_buffers);
  rs_host_reg *g = NULL;
  const rs_host_reg *keep = NULL;
  /* (unregistering is collective too, but exchanges nothing: every rank
   * passes no buffers) */
  if (!unregister) {
    reshard_result_t rk = keep_mode(p, src, nsrc, dst, ndst, r, &keep);
    if (!r) r = rk;
    r = build(p, src, nsrc, dst, ndst, r, keep, &g);
  }
  /* every rank succeeded, or none keeps the new registration */
  uint64_t bad = r != RESHARD_SUCCESS;
  reshard_result_t ra = c->ops->allreduce_max_u64(c, &bad, 1, rs_deadline_after_ms(p->opts.timeout_ms));
  if (!r && ra) r = ra;
  else if (!r && bad)
    r = rs_error(RESHARD_ERROR_REMOTE, "register_buffers rank %d: another rank failed to register its buffers; "
                 "the previous registration stays", p->rank);
  if (r) {
    reg_free(c, g);
    return r;
  }
  if (g && keep) { /* the new set owns what it kept */
    c->ops->rma_adopt(c, g->set, keep->set);
    p->host_reg_kept->set = NULL;
  }
  rs_host_reg_free(p);
  p->host_reg = g;
  uint64_t runs = 0, bytes = 0;
  for (size_t i = 0; g && i < p->nrecv_copies; i++) {
    uint64_t n = 1;
    for (int d = 0; d < g->copies[i].ndim; d++) n *= (uint64_t)g->copies[i].extent[d];
    runs += n, bytes += rs_copy_bytes(&g->copies[i]);
  }
  RS_LOG(RS_LOG_INFO, RS_SUBSYS_EXEC, "register_buffers rank %d: %s (%s): %zu receive boxes, %llu runs, %llu bytes "
         "read one-sided; %s: keys traded with %zu of %zu partners", p->rank, g ? "registered" : "unregistered",
         c->ops->name, g ? p->nrecv_copies : (size_t)0, (unsigned long long)runs, (unsigned long long)bytes,
         keep ? "kept over the rejoin" : "anew", g ? g->traded : (size_t)0, p->npeers);
  return RESHARD_SUCCESS;
}
