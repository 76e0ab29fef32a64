/* Coalescing and chunking: one message per (stream, round), none larger
 * than chunk_bytes. The cut depends only on the ordered boxes of a stream
 * and their element size, which sender and receiver (and, for relay
 * streams, every forwarding member) share, never on either side's
 * strides, so all cut identically. */
#include <stdlib.h>
#include <string.h>

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

/* A message's stream key, for ordering the messages of one pair and
 * round alike on both sides. */
typedef struct msg_key {
  int32_t group, origin, owner;
} msg_key;

typedef struct chunker {
  reshard_plan_t *plan;
  int is_send;
  size_t cap;
  const rs_seg *stream; /* a segment of the open stream */
  int32_t round;
  uint64_t cur; /* bytes in the open message */
  rs_msg *msgs;
  msg_key *keys; /* per message; cap_msgs entries */
  size_t nmsgs, cap_msgs;
  rs_copy *copies;
  size_t ncopies, cap_copies;
} chunker;

static reshard_result_t open_msg(chunker *ch) {
  size_t cap = ch->cap_msgs;
  if (RS_VEC_GROW(ch->msgs, ch->nmsgs, ch->cap_msgs))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking messages");
  if (ch->cap_msgs != cap || !ch->keys) {
    msg_key *k = realloc(ch->keys, ch->cap_msgs * sizeof *k);
    if (!k) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking messages");
    ch->keys = k;
  }
  const rs_seg *s = ch->stream;
  ch->keys[ch->nmsgs] = (msg_key){s->group, s->origin, s->owner};
  rs_msg *m = &ch->msgs[ch->nmsgs++];
  memset(m, 0, sizeof *m);
  m->peer = s->peer;
  m->fwd = ch->is_send && s->fwd;
  m->round = ch->round++;
  m->first_copy = (uint32_t)ch->ncopies;
  ch->cur = 0;
  return RESHARD_SUCCESS;
}

/* Adds one box of at most cap bytes to the open message (opening a new
 * one when it would overflow). */
static reshard_result_t add_box(chunker *ch, const rs_seg *s, uint64_t off,
                                const int64_t *ext) {
  int nd = s->ndim;
  uint64_t bytes = s->esize;
  int64_t dense[RESHARD_MAX_DIMS];
  for (int d = nd - 1; d >= 0; d--) {
    dense[d] = (int64_t)(bytes / s->esize);
    bytes *= (uint64_t)ext[d];
  }
  if (ch->nmsgs == 0 || (ch->cur > 0 && ch->cur + bytes > ch->cap))
    RS_CHECK(open_msg(ch));
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
 * outermost dim when a slice fits, otherwise recursion into the slice. */
static reshard_result_t split_box(chunker *ch, const rs_seg *s, int d,
                                  uint64_t off, int64_t *ext) {
  int nd = s->ndim;
  uint64_t slice = s->esize;
  for (int j = d + 1; j < nd; j++) slice *= (uint64_t)ext[j];
  uint64_t total = d < nd ? slice * (uint64_t)ext[d] : slice;
  if (total <= ch->cap || d >= nd) return add_box(ch, s, off, ext);
  int64_t n = ext[d];
  int64_t step = slice <= ch->cap ? (int64_t)(ch->cap / slice) : 1;
  reshard_result_t r = RESHARD_SUCCESS;
  for (int64_t i = 0; i < n && r == RESHARD_SUCCESS; i += step) {
    ext[d] = i + step <= n ? step : n - i;
    uint64_t o = off + (uint64_t)(i * s->strides[d] * (int64_t)s->esize);
    if (step == 1 && slice > ch->cap) r = split_box(ch, s, d + 1, o, ext);
    else r = add_box(ch, s, o, ext);
  }
  ext[d] = n;
  return r;
}

static int cmp_i32(int32_t x, int32_t y) { return (x > y) - (x < y); }
static int cmp_i64(int64_t x, int64_t y) { return (x > y) - (x < y); }

static int cmp_stream(const rs_seg *x, const rs_seg *y) {
  int c = cmp_i32(x->peer, y->peer);
  if (!c) c = cmp_i32(x->group, y->group);
  if (!c) c = cmp_i32(x->origin, y->origin);
  if (!c) c = cmp_i32(x->owner, y->owner);
  return c;
}

typedef struct seg_ref {
  const rs_seg *s;
  size_t index;
} seg_ref;

/* Streams, then the stream's order: push order for direct traffic (both
 * sides push in the receiver's canonical fragment order), the canonical
 * (tensor, fragment box, piece) order for relay streams, whose parties
 * push in different orders. */
static int cmp_seg_ref(const void *a, const void *b) {
  const seg_ref *rx = a, *ry = b;
  const rs_seg *x = rx->s, *y = ry->s;
  int c = cmp_stream(x, y);
  if (!c && x->group >= 0) {
    c = cmp_i32(x->dst_tensor, y->dst_tensor);
    for (int d = 0; !c && d < RESHARD_MAX_DIMS; d++) c = cmp_i64(x->box_start[d], y->box_start[d]);
    for (int d = 0; !c && d < RESHARD_MAX_DIMS; d++) c = cmp_i64(x->box_extent[d], y->box_extent[d]);
    if (!c) c = (x->piece > y->piece) - (x->piece < y->piece);
  }
  if (!c) c = (rx->index > ry->index) - (rx->index < ry->index);
  return c;
}

static int cmp_stream_ptr(const void *a, const void *b) {
  return cmp_stream(*(const rs_seg *const *)a, *(const rs_seg *const *)b);
}

size_t rs_count_streams(const rs_seg_vec *segs) {
  if (segs->n == 0) return 0;
  const rs_seg **v = malloc(segs->n * sizeof *v);
  if (!v) return segs->n; /* an overestimate is safe */
  for (size_t i = 0; i < segs->n; i++) v[i] = &segs->v[i];
  qsort(v, segs->n, sizeof *v, cmp_stream_ptr);
  size_t n = 1;
  for (size_t i = 1; i < segs->n; i++) n += cmp_stream(v[i], v[i - 1]) != 0;
  free(v);
  return n;
}

/* Shifted round robin: at position i every rank sends to rank+i+1 and
 * receives from rank-i-1, so no receiver is hit by all senders at once. */
static uint64_t sched_key(int rank, int size, int peer, int is_send) {
  if (is_send) return (uint64_t)((peer - rank + size) % size);
  return (uint64_t)((rank - peer + size) % size);
}

/* The schedule: by round, then shifted round robin, then stream key (the
 * order in which both sides of a pair post a round's messages). */
typedef struct sched_ref {
  int32_t round;
  uint64_t sched;
  msg_key key;
  size_t index;
} sched_ref;

static int cmp_sched(const void *a, const void *b) {
  const sched_ref *x = a, *y = b;
  int c = cmp_i32(x->round, y->round);
  if (!c) c = (x->sched > y->sched) - (x->sched < y->sched);
  if (!c) c = cmp_i32(x->key.group, y->key.group);
  if (!c) c = cmp_i32(x->key.origin, y->key.origin);
  if (!c) c = cmp_i32(x->key.owner, y->key.owner);
  if (!c) c = (x->index > y->index) - (x->index < y->index);
  return c;
}

/* Reorders ch->msgs by the schedule. */
static reshard_result_t schedule(chunker *ch, int is_send) {
  if (ch->nmsgs < 2) return RESHARD_SUCCESS;
  sched_ref *refs = malloc(ch->nmsgs * sizeof *refs);
  rs_msg *sorted = malloc(ch->nmsgs * sizeof *sorted);
  if (!refs || !sorted) {
    free(refs);
    free(sorted);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory scheduling messages");
  }
  for (size_t i = 0; i < ch->nmsgs; i++)
    refs[i] = (sched_ref){ch->msgs[i].round, sched_key(ch->plan->rank, ch->plan->size, ch->msgs[i].peer, is_send),
                          ch->keys[i], i};
  qsort(refs, ch->nmsgs, sizeof *refs, cmp_sched);
  for (size_t i = 0; i < ch->nmsgs; i++) sorted[i] = ch->msgs[refs[i].index];
  free(refs);
  free(ch->msgs);
  ch->msgs = sorted;
  ch->cap_msgs = ch->nmsgs;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_chunk_streams(reshard_plan_t *plan, rs_seg_vec *segs,
                                  int is_send, size_t chunk_bytes) {
  chunker ch;
  memset(&ch, 0, sizeof ch);
  ch.plan = plan;
  ch.is_send = is_send;
  ch.cap = chunk_bytes;
  reshard_result_t r = RESHARD_SUCCESS;
  seg_ref *refs = malloc((segs->n ? segs->n : 1) * sizeof *refs);
  if (!refs) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking");
  for (size_t i = 0; i < segs->n; i++) refs[i] = (seg_ref){&segs->v[i], i};
  if (segs->n > 1) qsort(refs, segs->n, sizeof *refs, cmp_seg_ref);
  for (size_t i = 0; i < segs->n && r == RESHARD_SUCCESS; i++) {
    const rs_seg *s = refs[i].s;
    if (i == 0 || cmp_stream(s, ch.stream)) {
      ch.stream = s;
      ch.round = s->delay;
      ch.cur = 0;
      r = open_msg(&ch);
      if (r != RESHARD_SUCCESS) break;
    }
    int64_t ext[RESHARD_MAX_DIMS];
    memcpy(ext, s->extent, sizeof ext);
    r = split_box(&ch, s, 0, s->off, ext);
  }
  free(refs);
  if (r == RESHARD_SUCCESS) r = schedule(&ch, is_send);
  free(ch.keys);
  ch.keys = NULL;
  if (r != RESHARD_SUCCESS) goto fail;

  /* Lay each round's messages out in staging, 64-byte aligned for the
   * copy loops. */
  int nrounds = ch.nmsgs ? ch.msgs[ch.nmsgs - 1].round + 1 : 0;
  size_t *starts = calloc((size_t)nrounds + 1, sizeof *starts);
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
    plan->nsend_copies = ch.ncopies;
    plan->send_half = half;
  } else {
    plan->recvs = ch.msgs;
    plan->nrecvs = ch.nmsgs;
    plan->recv_round = starts;
    plan->recv_copies = ch.copies;
    plan->nrecv_copies = ch.ncopies;
    plan->recv_half = half;
  }
  return RESHARD_SUCCESS;
fail:
  free(ch.msgs);
  free(ch.copies);
  return r;
}
