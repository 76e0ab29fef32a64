/* Coalescing and chunking: one message per (peer, round), none larger than
 * chunk_bytes. The cut depends only on the ordered boxes of a stream and
 * their element size, which sender and receiver share, never on either
 * side's strides, so both cut identically. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/vec.h"
#include "plan/plan.h"

reshard_result_t rs_seg_vec_push(rs_seg_vec *vec, const rs_seg *s) {
  if (RS_VEC_GROW(vec->v, vec->n, vec->cap))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory planning segments (%zu)", vec->n + 1);
  vec->v[vec->n++] = *s;
  return RESHARD_SUCCESS;
}

void rs_seg_vec_free(rs_seg_vec *vec) {
  free(vec->v);
  vec->v = NULL;
  vec->n = vec->cap = 0;
}

typedef struct chunker {
  reshard_plan_t *plan;
  int is_send;
  size_t cap;
  int32_t peer;
  int32_t round;
  uint64_t cur; /* bytes in the open message */
  rs_msg *msgs;
  size_t nmsgs, cap_msgs;
  rs_copy *copies;
  size_t ncopies, cap_copies;
  rs_vbox *vboxes; /* verify mode: parallel to copies */
  size_t cap_vboxes;
} chunker;

static reshard_result_t open_msg(chunker *ch) {
  if (RS_VEC_GROW(ch->msgs, ch->nmsgs, ch->cap_msgs))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking messages");
  rs_msg *m = &ch->msgs[ch->nmsgs++];
  memset(m, 0, sizeof *m);
  m->peer = ch->peer;
  m->round = ch->round++;
  m->first_copy = (uint32_t)ch->ncopies;
  ch->cur = 0;
  return RESHARD_SUCCESS;
}

/* Adds one box of at most cap bytes to the open message (opening a new
 * one when it would overflow). */
static reshard_result_t add_box(chunker *ch, const rs_seg *s, uint64_t off,
                                const int64_t *ext, const int64_t *at) {
  int nd = s->ndim;
  uint64_t bytes = s->esize;
  int64_t dense[RESHARD_MAX_DIMS];
  for (int d = nd - 1; d >= 0; d--) {
    dense[d] = (int64_t)(bytes / s->esize);
    bytes *= (uint64_t)ext[d];
  }
  if (ch->nmsgs == 0 || ch->msgs[ch->nmsgs - 1].peer != ch->peer ||
      (ch->cur > 0 && ch->cur + bytes > ch->cap))
    RS_CHECK(open_msg(ch));
  if (ch->plan->opts.flags & RESHARD_FLAG_VERIFY) {
    if (RS_VEC_GROW(ch->vboxes, ch->ncopies, ch->cap_vboxes))
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking copies");
    rs_vbox *v = &ch->vboxes[ch->ncopies];
    memset(v, 0, sizeof *v);
    v->tensor = s->vtensor;
    v->ndim = nd;
    for (int d = 0; d < nd; d++) {
      v->start[d] = s->gstart[d] + at[d];
      v->extent[d] = ext[d];
    }
  }
  if (RS_VEC_GROW(ch->copies, ch->ncopies, ch->cap_copies))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking copies");
  rs_copy *c = &ch->copies[ch->ncopies++];
  if (ch->is_send)
    rs_copy_init(c, nd, ext, s->esize, s->buffer, off, s->strides, RS_BUF_STAGING, ch->cur, dense);
  else
    rs_copy_init(c, nd, ext, s->esize, RS_BUF_STAGING, ch->cur, dense, s->buffer, off, s->strides);
  rs_msg *m = &ch->msgs[ch->nmsgs - 1];
  m->ncopies++;
  m->bytes += bytes;
  ch->cur += bytes;
  return RESHARD_SUCCESS;
}

/* Splits a box into sub-boxes of at most cap bytes: whole slices of the
 * outermost dim when a slice fits, otherwise recursion into the slice.
 * at[] is the sub-box's first element relative to the segment's. */
static reshard_result_t split_box(chunker *ch, const rs_seg *s, int d,
                                  uint64_t off, int64_t *ext, int64_t *at) {
  int nd = s->ndim;
  uint64_t slice = s->esize;
  for (int j = d + 1; j < nd; j++) slice *= (uint64_t)ext[j];
  uint64_t total = d < nd ? slice * (uint64_t)ext[d] : slice;
  if (total <= ch->cap || d >= nd) return add_box(ch, s, off, ext, at);
  int64_t n = ext[d];
  int64_t step = slice <= ch->cap ? (int64_t)(ch->cap / slice) : 1;
  reshard_result_t r = RESHARD_SUCCESS;
  for (int64_t i = 0; i < n && r == RESHARD_SUCCESS; i += step) {
    ext[d] = i + step <= n ? step : n - i;
    at[d] = i;
    uint64_t o = off + (uint64_t)(i * s->strides[d] * (int64_t)s->esize);
    if (step == 1 && slice > ch->cap) r = split_box(ch, s, d + 1, o, ext, at);
    else r = add_box(ch, s, o, ext, at);
  }
  ext[d] = n;
  at[d] = 0;
  return r;
}

typedef struct seg_ref {
  int32_t peer;
  size_t index;
} seg_ref;

static int cmp_seg_ref(const void *a, const void *b) {
  const seg_ref *x = a, *y = b;
  if (x->peer != y->peer) return (x->peer > y->peer) - (x->peer < y->peer);
  return (x->index > y->index) - (x->index < y->index);
}

/* Shifted round robin: at position i every rank sends to rank+i+1 and
 * receives from rank-i-1, so no receiver is hit by all senders at once. */
static uint64_t sched_key(int rank, int size, int peer, int is_send) {
  if (is_send) return (uint64_t)((peer - rank + size) % size);
  return (uint64_t)((rank - peer + size) % size);
}

/* Before layout, staging_off holds the schedule key (see below). */
static int cmp_msg(const void *a, const void *b) {
  const rs_msg *x = a, *y = b;
  if (x->round != y->round) return (x->round > y->round) - (x->round < y->round);
  return (x->staging_off > y->staging_off) - (x->staging_off < y->staging_off);
}

reshard_result_t rs_chunk_streams(reshard_plan_t *plan, rs_seg_vec *segs,
                                  int is_send, size_t chunk_bytes) {
  chunker ch;
  memset(&ch, 0, sizeof ch);
  ch.plan = plan;
  ch.is_send = is_send;
  ch.cap = chunk_bytes;
  reshard_result_t r = RESHARD_SUCCESS;
  seg_ref *refs = rs_malloc((segs->n ? segs->n : 1) * sizeof *refs);
  if (!refs) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking");
  for (size_t i = 0; i < segs->n; i++) {
    refs[i].peer = segs->v[i].peer;
    refs[i].index = i;
  }
  qsort(refs, segs->n, sizeof *refs, cmp_seg_ref);
  for (size_t i = 0; i < segs->n && r == RESHARD_SUCCESS; i++) {
    const rs_seg *s = &segs->v[refs[i].index];
    if (i == 0 || s->peer != ch.peer) {
      ch.peer = s->peer;
      ch.round = 0;
      ch.cur = 0;
      r = open_msg(&ch);
      if (r != RESHARD_SUCCESS) break;
    }
    int64_t ext[RESHARD_MAX_DIMS], at[RESHARD_MAX_DIMS] = {0};
    memcpy(ext, s->extent, sizeof ext);
    r = split_box(&ch, s, 0, s->off, ext, at);
  }
  free(refs);
  if (r != RESHARD_SUCCESS) goto fail;

  /* Schedule: by round, then shifted round robin; then lay each round's
   * messages out in staging, 64-byte aligned for the copy loops. */
  for (size_t i = 0; i < ch.nmsgs; i++)
    ch.msgs[i].staging_off = sched_key(plan->rank, plan->size, ch.msgs[i].peer, is_send);
  if (ch.nmsgs > 1) /* ch.msgs is NULL when empty: qsort(NULL, 0) is UB */
    qsort(ch.msgs, ch.nmsgs, sizeof *ch.msgs, cmp_msg);
  int nrounds = ch.nmsgs ? ch.msgs[ch.nmsgs - 1].round + 1 : 0;
  size_t *starts = rs_calloc((size_t)nrounds + 1, sizeof *starts);
  if (!starts) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking");
    goto fail;
  }
  uint64_t half = 0, off = 0;
  int round = -1;
  for (size_t i = 0; i < ch.nmsgs; i++) {
    rs_msg *m = &ch.msgs[i];
    if (m->round != round) {
      for (int k = round + 1; k <= m->round; k++) starts[k] = i;
      round = m->round;
      off = 0;
    }
    m->staging_off = off;
    for (uint32_t k = 0; k < m->ncopies; k++) {
      rs_copy *c = &ch.copies[m->first_copy + k];
      if (is_send) c->dst_off += off;
      else c->src_off += off;
    }
    off += (m->bytes + 63) & ~(uint64_t)63;
    if (off > half) half = off;
  }
  for (int k = round + 1; k <= nrounds; k++) starts[k] = ch.nmsgs;
  for (size_t i = 0; i < ch.nmsgs; i++) {
    rs_msg *m = &ch.msgs[i];
    m->direct = m->ncopies == 1 && ch.copies[m->first_copy].ndim == 0;
  }
  if (is_send) {
    plan->sends = ch.msgs;
    plan->nsends = ch.nmsgs;
    plan->send_round = starts;
    plan->send_copies = ch.copies;
    plan->send_vbox = ch.vboxes;
    plan->nsend_copies = ch.ncopies;
    plan->send_half = half;
  } else {
    plan->recvs = ch.msgs;
    plan->nrecvs = ch.nmsgs;
    plan->recv_round = starts;
    plan->recv_copies = ch.copies;
    plan->recv_vbox = ch.vboxes;
    plan->nrecv_copies = ch.ncopies;
    plan->recv_half = half;
  }
  return RESHARD_SUCCESS;
fail:
  free(ch.msgs);
  free(ch.copies);
  free(ch.vboxes);
  return r;
}
