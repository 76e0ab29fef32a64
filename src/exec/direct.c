/* Direct copies for registered buffers: see direct.h. Both ends cut a
 * stream into the same boxes in the same order (plan/chunk.c: the cut
 * depends only on the boxes), so the k-th copy of a message on the
 * sender and on the receiver move the same box through the same staging
 * bytes; composing the two skips the staging. */
#include "exec/direct.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "pack/copy.h"

reshard_result_t rs_direct_blob(const reshard_plan_t *p, int peer, void **out, size_t *bytes) {
  size_t n = 8, nmsg = 0;
  for (size_t i = 0; i < p->nsends; i++)
    if (p->sends[i].peer == peer) n += 8 + (size_t)p->sends[i].ncopies * sizeof(rs_copy), nmsg++;
  unsigned char *b = malloc(n), *at = b;
  if (!b) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", p->rank);
  uint64_t v = nmsg;
  memcpy(at, &v, 8), at += 8;
  for (size_t i = 0; i < p->nsends; i++) {
    const rs_msg *m = &p->sends[i];
    if (m->peer != peer) continue;
    v = m->ncopies;
    memcpy(at, &v, 8), at += 8;
    for (uint32_t k = 0; k < m->ncopies; k++) {
      rs_copy c = p->send_copies[m->first_copy + k];
      if (m->fwd && c.src_buf != RS_BUF_STAGING) c.src_buf += p->num_src_buffers;
      /* staging offsets relative to the message: each end places its
       * messages in its own staging */
      c.dst_off -= m->staging_off;
      memcpy(at, &c, sizeof c), at += sizeof c;
    }
  }
  *out = b;
  *bytes = n;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_direct_compose(const reshard_plan_t *p, const rs_share *sh, size_t nsh, const uint32_t *base,
                                   rs_copy *out) {
  for (size_t i = 0; i < nsh; i++) {
    const unsigned char *at = sh[i].in, *end = at + sh[i].in_bytes;
    uint64_t nmsg = 0;
    if (sh[i].in_bytes >= 8) memcpy(&nmsg, at, 8), at += 8;
    size_t got = 0;
    for (size_t j = 0; j < p->nrecvs; j++) {
      const rs_msg *m = &p->recvs[j];
      if (m->peer != sh[i].peer) continue;
      uint64_t nc = 0;
      if (got < nmsg && at + 8 <= end) memcpy(&nc, at, 8), at += 8;
      if (got++ >= nmsg || nc != m->ncopies || at + nc * sizeof(rs_copy) > end)
        return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: rank %d's messages to this rank do not "
                        "match its receives (message %zu); the ranks' plans differ", p->rank, sh[i].peer, got - 1);
      for (uint64_t k = 0; k < nc; k++) {
        rs_copy s, rc = p->recv_copies[m->first_copy + k];
        memcpy(&s, at, sizeof s), at += sizeof s;
        rc.src_off -= m->staging_off;
        rs_copy *o = &out[m->first_copy + k];
        if (s.src_buf < 0 || (size_t)s.src_buf >= sh[i].nbufs || !sh[i].bufs[s.src_buf] ||
            rs_copy_compose(&s, &rc, o))
          return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: rank %d's copy %llu of message %zu "
                          "does not match this rank's receive (or reads a buffer it did not register)", p->rank,
                          sh[i].peer, (unsigned long long)k, got - 1);
        o->src_buf = (int32_t)(base[i] + (uint32_t)s.src_buf);
      }
    }
    if (got != nmsg)
      return rs_error(RESHARD_ERROR_MISMATCH, "register_buffers rank %d: rank %d sends %llu messages, this rank "
                      "receives %zu", p->rank, sh[i].peer, (unsigned long long)nmsg, got);
  }
  return RESHARD_SUCCESS;
}

void *rs_direct_call_buf(const reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst,
                         size_t i) {
  const size_t ns = (size_t)p->num_src_buffers;
  return i < ns ? (src && i < nsrc ? src[i] : NULL) : (dst && i - ns < ndst ? dst[i - ns] : NULL);
}

reshard_result_t rs_direct_check_bufs(const reshard_plan_t *p, void *const *reg, size_t nreg, void *const *src,
                                      size_t nsrc, void *const *dst, size_t ndst) {
  for (size_t i = 0; i < nreg; i++) {
    void *given = rs_direct_call_buf(p, src, nsrc, dst, ndst, i);
    if (given != reg[i])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: %s buffer %zu is %p, not the registered %p: "
                      "a plan with registered buffers executes with exactly those (call "
                      "reshard_plan_register_buffers again after reallocating, or with no buffers to go back to "
                      "staging)", p->rank, i < (size_t)p->num_src_buffers ? "source" : "destination",
                      i < (size_t)p->num_src_buffers ? i : i - p->num_src_buffers, given, reg[i]);
  }
  return RESHARD_SUCCESS;
}

uint64_t rs_direct_src_end(const rs_copy *c) {
  uint64_t end = c->src_off + c->run_bytes;
  for (int d = 0; d < c->ndim; d++)
    if (c->extent[d] > 1 && c->src_stride[d] > 0) end += (uint64_t)(c->extent[d] - 1) * (uint64_t)c->src_stride[d];
  return end;
}
