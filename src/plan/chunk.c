/* Coalescing and chunking: one message per (stream, round), none larger
 * than chunk_bytes. The cut depends only on the ordered boxes of a stream,
 * their element size and the rounds their data becomes ready, which every
 * party of the stream shares, never on anyone's strides, so all cut
 * identically.
 *
 * A stream's messages go in consecutive rounds from its first box's ready
 * round; a box that becomes ready later (a relay forward, whose data the
 * sender receives in an earlier stream) starts a message no earlier than
 * that round. What waits on data is ready the round after the message
 * that brought it (the executors unpack round k-1 before they pack and
 * post round k's forwards: exec/schedule.h). Relay segments record which of their
 * bytes arrived in which round (their spans), and a forward is cut along
 * them: each run of its bytes travels the round after its own arrival,
 * not after its whole part's, so a large part streams through its
 * forwarders instead of waiting for its last message (a 1 -> 16 fan-out
 * otherwise costs the source's time plus the forwards' whole time).
 * Source -> owner relay streams are cut into at least
 * RS_RELAY_PIPELINE_ROUNDS messages for the same reason, and a forward
 * stream's segments go in the order their data lands (ready_order), not
 * in box order, so that none waits behind a box that lands late. Streams are cut
 * in level order, so the segments a stream waits on have arrived,
 * possibly in virtual streams: those of other pairs that this rank cuts
 * only to learn their rounds. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/vec.h"
#include "plan/plan.h"
#include "plan/relay.h"

void rs_seg_vec_changed(rs_seg_vec *vec) {
  free(vec->sorted);
  vec->sorted = NULL;
}

reshard_result_t rs_seg_vec_push(rs_seg_vec *vec, const rs_seg *s) {
  if (vec->sorted) rs_seg_vec_changed(vec);
  if (RS_VEC_GROW(vec->v, vec->n, vec->cap))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory planning segments (%zu)", vec->n + 1);
  vec->v[vec->n++] = *s;
  return RESHARD_SUCCESS;
}

void rs_seg_init(rs_seg *s, int dir, int32_t from, int32_t to,
                 const rs_frag *f, const rs_piece *p,
                 reshard_dtype_t bdtype, reshard_dtype_t wdtype) {
  const size_t es = reshard_dtype_size(wdtype), bes = reshard_dtype_size(bdtype);
  memset(s, 0, sizeof *s);
  s->dir = dir;
  s->from = from;
  s->to = to;
  s->peer = dir == RS_SEG_SEND ? to : from;
  s->origin = -1;
  s->dep = -1;
  s->buffer = f->buffer;
  s->ndim = f->ndim;
  s->tensor = f->tensor;
  s->esize = (uint32_t)es;
  s->besize = (uint32_t)bes;
  s->bdtype = bdtype;
  s->wdtype = wdtype;
  s->off = rs_frag_offset_of(f, p->start, bes);
  s->bytes = es;
  s->group = -1;
  s->vtensor = f->tensor; /* a source fragment's callers set the destination id */
  for (int d = 0; d < f->ndim; d++) {
    s->extent[d] = p->extent[d];
    s->gstart[d] = p->start[d];
    s->strides[d] = f->strides[d];
    s->bytes *= (uint64_t)p->extent[d];
  }
}

void rs_seg_vec_free(rs_seg_vec *vec) {
  rs_seg_vec_changed(vec);
  free(vec->v);
  vec->v = NULL;
  vec->n = vec->cap = 0;
}

/* A message's stream key, for ordering the messages of one pair and
 * round alike on both sides. */
typedef struct msg_key {
  int32_t group, origin;
} msg_key;

/* A forward between relay members (relay.h: origin -1 in a group), what
 * rs_msg.fwd says at both ends of its messages. */
static int is_forward(msg_key k) { return k.group >= 0 && k.origin < 0; }

/* Which bytes of a segment arrived in which round: its bytes up to end
 * (from the segment's first) came in messages of rounds up to round. */
typedef struct rs_span {
  uint64_t end;
  int32_t round;
} rs_span;

typedef struct rs_span_vec {
  rs_span *v;
  size_t n, cap;
} rs_span_vec;

typedef struct chunker {
  reshard_plan_t *plan;
  int is_send;
  int dry; /* virtual streams: the cut only, no messages */
  int measure; /* rs_chunk_staging: messages and their bytes, no copies */
  size_t cap;
  const rs_seg *stream; /* a segment of the open stream */
  int open;             /* a message of the stream is open */
  int32_t round;        /* the open message's round */
  int32_t ready;        /* the box being added may not travel earlier */
  int32_t phase;        /* the open stream's phase (plan->phases > 1; -1: wide) */
  uint64_t cur;         /* bytes in the open message */
  /* Relay segments: the open segment's spans go to rec from rec_first on
   * (NULL: not recorded). A forward: its readiness runs (end: bytes from
   * the segment's first, round: when those bytes may travel), run_at the
   * first that the next sub-box meets; nruns 0: ready as a whole. */
  rs_span_vec *rec;
  size_t rec_first;
  uint64_t rec_bytes;
  const rs_span *runs;
  size_t nruns, run_at;
  rs_msg *msgs;
  msg_key *keys; /* per message; cap_msgs entries */
  size_t nmsgs, cap_msgs;
  rs_copy *copies;
  size_t ncopies, cap_copies;
  rs_vbox *vboxes; /* verify mode: parallel to copies */
  size_t cap_vboxes;
} chunker;

static reshard_result_t open_msg(chunker *ch, int32_t round) {
  ch->open = 1;
  ch->round = round;
  ch->cur = 0;
  if (ch->dry) return RESHARD_SUCCESS;
  size_t cap = ch->cap_msgs;
  if (RS_VEC_GROW(ch->msgs, ch->nmsgs, ch->cap_msgs))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking messages");
  if (ch->cap_msgs != cap || !ch->keys) {
    msg_key *k = rs_realloc(ch->keys, ch->cap_msgs * sizeof *k);
    if (!k) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking messages");
    ch->keys = k;
  }
  const rs_seg *s = ch->stream;
  ch->keys[ch->nmsgs] = (msg_key){s->group, s->origin};
  if (ch->is_send && (s->fwd != 0) != is_forward(ch->keys[ch->nmsgs])) /* (what the receiver goes by) */
    return rs_error(RESHARD_ERROR_INTERNAL, "chunking: a send %d -> %d (group %d, origin %d) is%s a forward", s->from,
                    s->to, s->group, s->origin, s->fwd ? "" : " not");
  rs_msg *m = &ch->msgs[ch->nmsgs++];
  memset(m, 0, sizeof *m);
  m->peer = s->peer;
  m->fwd = is_forward(ch->keys[ch->nmsgs - 1]);
  m->round = round;
  m->first_copy = (uint32_t)ch->ncopies;
  return RESHARD_SUCCESS;
}

/* The first round at or after `round` in the open stream's phase. */
static int32_t in_phase(const chunker *ch, int32_t round) {
  int32_t n = ch->plan->phases;
  if (n <= 1 || ch->phase < 0) return round;
  return round + ((ch->phase - round % n) % n + n) % n;
}

/* Adds one box of at most cap bytes to the open message (opening a new
 * one when it would overflow, or when the box is not ready in its
 * round). */
static reshard_result_t add_box(chunker *ch, const rs_seg *s, uint64_t off,
                                const int64_t *ext, const int64_t *at) {
  int nd = s->ndim;
  uint64_t bytes = s->esize;
  int64_t dense[RESHARD_MAX_DIMS];
  for (int d = nd - 1; d >= 0; d--) {
    dense[d] = (int64_t)(bytes / s->esize);
    bytes *= (uint64_t)ext[d];
  }
  if (!ch->open) {
    RS_CHECK(open_msg(ch, in_phase(ch, ch->ready)));
  } else if (ch->cur > 0 && (ch->cur + bytes > ch->cap || ch->round < ch->ready)) {
    RS_CHECK(open_msg(ch, in_phase(ch, ch->round + 1 > ch->ready ? ch->round + 1 : ch->ready)));
  } else if (ch->round < ch->ready) { /* still empty: it just goes later */
    ch->round = in_phase(ch, ch->ready);
    if (!ch->dry) ch->msgs[ch->nmsgs - 1].round = ch->round;
  }
  ch->cur += bytes;
  if (ch->rec) { /* the segment's bytes so far arrive by this round */
    ch->rec_bytes += bytes;
    rs_span_vec *sv = ch->rec;
    if (sv->n > ch->rec_first && sv->v[sv->n - 1].round == ch->round) {
      sv->v[sv->n - 1].end = ch->rec_bytes;
    } else {
      if (RS_VEC_GROW(sv->v, sv->n, sv->cap)) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking (spans)");
      sv->v[sv->n++] = (rs_span){ch->rec_bytes, ch->round};
    }
  }
  if (ch->dry) return RESHARD_SUCCESS;
  if (ch->measure) {
    ch->msgs[ch->nmsgs - 1].bytes += bytes;
    return RESHARD_SUCCESS;
  }
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
  uint64_t soff = ch->cur - bytes;
  /* the buffer's dtype on its side, the wire's in staging (a cast where
   * they differ) */
  if (ch->is_send)
    rs_copy_init_cvt(c, nd, ext, s->bdtype, s->buffer, off, s->strides, s->wdtype, RS_BUF_STAGING, soff, dense);
  else
    rs_copy_init_cvt(c, nd, ext, s->wdtype, RS_BUF_STAGING, soff, dense, s->bdtype, s->buffer, off, s->strides);
  rs_msg *m = &ch->msgs[ch->nmsgs - 1];
  m->ncopies++;
  m->bytes += bytes;
  return RESHARD_SUCCESS;
}

/* Whether the open message, already holding data and ready in its round,
 * has room for at least one slice. */
static int room_for(const chunker *ch, uint64_t slice) {
  return ch->open && ch->cur > 0 && ch->round >= ch->ready && ch->cap - ch->cur >= slice;
}

/* A forward's readiness runs: the end of the run holding byte a, and
 * the round bytes [a, b) may travel in (the latest of their runs). The
 * sub-boxes come in increasing byte order, so run_at only moves on. */
static uint64_t run_end(chunker *ch, uint64_t a) {
  while (ch->run_at + 1 < ch->nruns && ch->runs[ch->run_at].end <= a) ch->run_at++;
  return ch->runs[ch->run_at].end;
}

static int32_t runs_ready(chunker *ch, uint64_t a, uint64_t b) {
  run_end(ch, a);
  int32_t r = ch->runs[ch->run_at].round;
  for (size_t k = ch->run_at + 1; k < ch->nruns && ch->runs[k - 1].end < b; k++)
    if (ch->runs[k].round > r) r = ch->runs[k].round;
  return r;
}

/* Bytes before element at[] of segment s, in its row-major order. */
static uint64_t seg_pos(const rs_seg *s, const int64_t *at) {
  uint64_t pos = 0, dense = s->esize;
  for (int d = s->ndim - 1; d >= 0; d--) {
    pos += (uint64_t)at[d] * dense;
    dense *= (uint64_t)s->extent[d];
  }
  return pos;
}

/* Splits a box into sub-boxes of at most cap bytes: whole slices of the
 * outermost dim when a slice fits, otherwise recursion into the slice.
 * at[] is the sub-box's first element relative to the segment's. A
 * forward's sub-boxes also end where its readiness runs do, where a whole
 * slice allows (a run that ends inside a slice: recursion into it), each
 * ready with its own bytes. */
static reshard_result_t split_box(chunker *ch, const rs_seg *s, int d,
                                  uint64_t off, int64_t *ext, int64_t *at) {
  int nd = s->ndim;
  uint64_t slice = s->esize;
  for (int j = d + 1; j < nd; j++) slice *= (uint64_t)ext[j];
  uint64_t total = d < nd ? slice * (uint64_t)ext[d] : slice;
  /* A dim of extent 1 has one slice, the whole box: its slabs are the
   * next dim's. Without this, a stacked-expert box ([1, rows, cols])
   * under the cap that did not fit the open message went whole to the
   * next one instead of topping it up with rows: DeepSeek-V3's 64-row
   * expert slices left 18% of every message empty. */
  if (d + 1 < nd && ext[d] == 1) return split_box(ch, s, d + 1, off, ext, at);
  const uint64_t pos = ch->nruns ? seg_pos(s, at) : 0;
  /* A box within the cap goes whole, unless it does not fit the open
   * message but a slice does: it then tops the message up with whole
   * slices and goes on in the next, instead of leaving the room empty
   * (boxes a little under the cap would take a message each, half full). */
  if (d >= nd || (total <= ch->cap && !(ch->cur + total > ch->cap && room_for(ch, slice)) &&
                  (!ch->nruns || run_end(ch, pos) >= pos + total))) {
    if (ch->nruns) ch->ready = runs_ready(ch, pos, pos + total);
    return add_box(ch, s, off, ext, at);
  }
  int64_t n = ext[d];
  int64_t step = slice <= ch->cap ? (int64_t)(ch->cap / slice) : 1;
  reshard_result_t r = RESHARD_SUCCESS;
  for (int64_t i = 0, len = step; i < n && r == RESHARD_SUCCESS; i += len) {
    /* The first slab tops up the open message when it can (the previous
     * box left room), so that messages stay full and few. So does every
     * slab of a forward, whose slabs end where its readiness runs do:
     * otherwise a message held one run at most, and forwards whose data
     * landed in messages smaller than their cap (a backlog of runs, all
     * ready) went a run a round however large their cap. */
    len = step;
    uint64_t at_pos = pos + (uint64_t)i * slice;
    if (ch->nruns) ch->ready = runs_ready(ch, at_pos, at_pos + slice);
    if ((i == 0 || ch->nruns) && slice <= ch->cap && room_for(ch, slice))
      len = (int64_t)((ch->cap - ch->cur) / slice);
    int inner = len == 1 && slice > ch->cap;
    if (ch->nruns) { /* not past the end of this run, where a slice allows */
      uint64_t rows = (run_end(ch, at_pos) - at_pos) / slice;
      if (rows < (uint64_t)len) len = rows ? (int64_t)rows : 1;
      if (!rows && d + 1 < nd) inner = 1;
    }
    ext[d] = i + len <= n ? len : n - i;
    at[d] = i;
    uint64_t o = off + (uint64_t)(i * s->strides[d] * (int64_t)s->besize);
    if (inner) {
      r = split_box(ch, s, d + 1, o, ext, at);
    } else {
      if (ch->nruns) ch->ready = runs_ready(ch, at_pos, at_pos + (uint64_t)ext[d] * slice);
      r = add_box(ch, s, o, ext, at);
    }
  }
  ext[d] = n;
  at[d] = 0;
  return r;
}

static int cmp_i32(int32_t x, int32_t y) { return (x > y) - (x < y); }
/* A segment's sort key, compact so that sorting stays cheap. */
typedef struct seg_ref {
  int32_t level, from, to, group, origin, box;
  uint32_t piece;
  int32_t dir;
  /* index: where the segment is in the vector; orig: its push order (the
   * order within a direct stream, and what dep counts in). The same
   * unless rs_seg_vec_set_order laid the vector out in stream order. */
  uint32_t index, orig;
  uint64_t bytes; /* the segment's, so that summing a stream stays in the refs */
} seg_ref;

static seg_ref ref_of(const rs_seg *s, size_t i) {
  return (seg_ref){s->level, s->from, s->to, s->group, s->origin, s->box, s->piece, s->dir, (uint32_t)i, (uint32_t)i,
                   s->bytes};
}

static int cmp_ref_stream(const seg_ref *x, const seg_ref *y) {
  int c = cmp_i32(x->from, y->from);
  if (!c) c = cmp_i32(x->to, y->to);
  if (!c) c = cmp_i32(x->group, y->group);
  if (!c) c = cmp_i32(x->origin, y->origin);
  return c;
}

/* Levels, streams, then the stream's order: push order for direct
 * traffic (both sides push in the receiver's canonical fragment order),
 * the canonical (fragment box, piece) order for relay streams, whose
 * parties push in different orders. */
static int cmp_seg_ref(const void *a, const void *b) {
  const seg_ref *x = a, *y = b;
  int c = cmp_i32(x->level, y->level);
  if (!c) c = cmp_ref_stream(x, y);
  if (!c && x->group >= 0) {
    c = cmp_i32(x->box, y->box);
    if (!c) c = (x->piece > y->piece) - (x->piece < y->piece);
  }
  if (!c) c = (x->orig > y->orig) - (x->orig < y->orig);
  return c;
}

static int cmp_ref_level_stream(const void *a, const void *b) {
  const seg_ref *x = a, *y = b;
  int c = cmp_i32(x->level, y->level);
  return c ? c : cmp_ref_stream(x, y);
}

int rs_seg_vec_order(const rs_seg_vec *vec, uint32_t *index_of, uint32_t *orig_of) {
  const seg_ref *refs = vec->sorted;
  if (!refs) return -1;
  for (size_t k = 0; k < vec->n; k++) {
    index_of[k] = refs[k].index;
    orig_of[k] = refs[k].orig;
  }
  return 0;
}

reshard_result_t rs_seg_vec_lay_out_begin(rs_seg_vec *vec, size_t n) {
  rs_seg_vec_changed(vec);
  if (n > UINT32_MAX || n > vec->cap) return rs_error(RESHARD_ERROR_INVALID_USAGE, "segment order: %zu segments", n);
  vec->sorted = rs_malloc((n + 1) * sizeof(seg_ref));
  if (!vec->sorted) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory ordering %zu segments", n);
  return RESHARD_SUCCESS;
}

void rs_seg_vec_lay_out_put(rs_seg_vec *vec, size_t k, uint32_t orig) {
  seg_ref *refs = vec->sorted;
  refs[k] = ref_of(&vec->v[k], k);
  refs[k].orig = orig;
}

reshard_result_t rs_seg_vec_lay_out_end(rs_seg_vec *vec) {
  const seg_ref *refs = vec->sorted;
  const size_t n = vec->n;
  uint64_t *seen = rs_calloc(n / 64 + 1, sizeof *seen); /* a bit per push order: it stays in cache */
  reshard_result_t r = RESHARD_SUCCESS;
  if (!seen) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory ordering %zu segments", n);
  for (size_t k = 0; k < n && !r; k++) {
    const uint32_t o = refs[k].orig;
    if (o >= n || (seen[o / 64] >> (o % 64) & 1))
      r = rs_error(RESHARD_ERROR_INTERNAL, "segment order: push order %u of place %zu is out of range or repeated",
                   (unsigned)o, k);
    else if (k && cmp_seg_ref(&refs[k - 1], &refs[k]) >= 0)
      r = rs_error(RESHARD_ERROR_INTERNAL, "segment order: places %zu and %zu are out of order", k - 1, k);
    else
      seen[o / 64] |= (uint64_t)1 << (o % 64);
  }
  free(seen);
  if (r) rs_seg_vec_changed(vec);
  return r;
}

/* The refs of n segments in cmp_seg_ref order, without comparing most of
 * them: each segment's stream (level, from, to, group, origin) gets a
 * bucket through a hash table, the few distinct streams are sorted, the
 * segments placed stream by stream in index order (a stable counting
 * sort), and only relay streams, ordered by (box, piece, index), are then
 * sorted inside. The same order as a qsort by cmp_seg_ref. */
static uint64_t stream_hash(const seg_ref *r) {
  uint64_t h = (uint64_t)(uint32_t)r->level * 0x9e3779b97f4a7c15ULL;
  h = (h ^ (uint32_t)r->from) * 0xff51afd7ed558ccdULL;
  h = (h ^ (uint32_t)r->to) * 0xc4ceb9fe1a85ec53ULL;
  h = (h ^ (uint32_t)r->group) * 0x9e3779b97f4a7c15ULL;
  h = (h ^ (uint32_t)r->origin) * 0xff51afd7ed558ccdULL;
  return h ^ (h >> 29);
}

static int cmp_stream_first(const void *a, const void *b) {
  /* buckets are represented by their first segment's ref */
  return cmp_ref_level_stream(a, b);
}

static reshard_result_t sort_refs(seg_ref *refs, size_t n) {
  if (n < 2) return RESHARD_SUCCESS;
  size_t cap = 1024, nb = 0, cap_b = 256;
  uint32_t *slot = rs_malloc(cap * sizeof *slot);      /* bucket + 1, 0 empty */
  uint32_t *bucket = rs_malloc(n * sizeof *bucket);    /* per segment */
  seg_ref *first = rs_malloc(cap_b * sizeof *first);   /* per bucket */
  reshard_result_t r = RESHARD_SUCCESS;
  if (!slot || !bucket || !first) goto oom;
  memset(slot, 0, cap * sizeof *slot);
  for (size_t i = 0; i < n; i++) {
    if (2 * (nb + 1) > cap) { /* grow and rehash */
      size_t ncap = 2 * cap;
      uint32_t *ns = rs_calloc(ncap, sizeof *ns);
      if (!ns) goto oom;
      for (size_t b = 0; b < nb; b++) {
        size_t j = stream_hash(&first[b]) & (ncap - 1);
        while (ns[j]) j = (j + 1) & (ncap - 1);
        ns[j] = (uint32_t)b + 1;
      }
      free(slot);
      slot = ns;
      cap = ncap;
    }
    size_t j = stream_hash(&refs[i]) & (cap - 1);
    for (; slot[j]; j = (j + 1) & (cap - 1))
      if (!cmp_ref_level_stream(&first[slot[j] - 1], &refs[i])) break;
    if (!slot[j]) {
      if (nb == cap_b) {
        seg_ref *nf = rs_realloc(first, 2 * cap_b * sizeof *nf);
        if (!nf) goto oom;
        first = nf;
        cap_b *= 2;
      }
      first[nb] = refs[i];
      first[nb].index = nb; /* the bucket, once the firsts are sorted */
      slot[j] = (uint32_t)++nb;
    }
    bucket[i] = slot[j] - 1;
  }
  free(slot);
  slot = NULL;
  /* buckets in stream order; start[b]: where bucket b's segments go */
  if (nb > 1) qsort(first, nb, sizeof *first, cmp_stream_first);
  size_t *start = rs_calloc(nb + 1, sizeof *start), *pos_of = rs_malloc((nb + 1) * sizeof *pos_of);
  seg_ref *out = rs_malloc(n * sizeof *out);
  if (!start || !pos_of || !out) {
    free(start);
    free(pos_of);
    free(out);
    goto oom;
  }
  for (size_t k = 0; k < nb; k++) pos_of[first[k].index] = k;
  for (size_t i = 0; i < n; i++) start[pos_of[bucket[i]] + 1]++;
  for (size_t k = 0; k < nb; k++) start[k + 1] += start[k];
  for (size_t i = 0; i < n; i++) out[start[pos_of[bucket[i]]]++] = refs[i]; /* stable: index order */
  /* start[k] is now the end of bucket k; relay streams sort inside */
  for (size_t k = 0, lo = 0; k < nb; lo = start[k++]) {
    if (first[k].group < 0 || start[k] - lo < 2) continue;
    size_t i = lo + 1; /* often in order already (boxes pushed in their order): a look is cheaper than a sort */
    while (i < start[k] && cmp_seg_ref(&out[i - 1], &out[i]) < 0) i++;
    if (i < start[k]) qsort(out + lo, start[k] - lo, sizeof *out, cmp_seg_ref);
  }
  memcpy(refs, out, n * sizeof *out);
  free(out);
  free(start);
  free(pos_of);
  free(bucket);
  free(first);
  return r;
oom:
  free(slot);
  free(bucket);
  free(first);
  return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory sorting %zu segments", n);
}

/* The segments' refs in cmp_seg_ref order: sorted once, kept in the
 * vector (the chunk sizing cuts the same segments several times). */
static reshard_result_t sorted_refs(rs_seg_vec *segs, const seg_ref **out) {
  if (!segs->sorted) {
    if (segs->n > UINT32_MAX) return rs_error(RESHARD_ERROR_INVALID_USAGE, "chunking: %zu segments", segs->n);
    seg_ref *refs = rs_malloc((segs->n + 1) * sizeof *refs);
    if (!refs) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory sorting %zu segments", segs->n);
    for (size_t i = 0; i < segs->n; i++) refs[i] = ref_of(&segs->v[i], i);
    reshard_result_t r = sort_refs(refs, segs->n);
    if (r) {
      free(refs);
      return r;
    }
    segs->sorted = refs;
  }
  *out = segs->sorted;
  return RESHARD_SUCCESS;
}

/* Whether the stream from -> to stays inside one NVLink domain, where its
 * messages are chunk / domain_div. */
static int in_domain(const reshard_plan_t *plan, int32_t from, int32_t to) {
  return plan->domain_div > 1 && plan->map.domain && plan->map.domain[from] == plan->map.domain[to];
}

/* The cap before pacing: the chunk (divided inside a domain), or the
 * stream's share of the spread rounds when that is larger, never above
 * options.chunk_bytes or an int's count. */
static uint64_t spread_cap(const reshard_plan_t *plan, uint64_t chunk, uint64_t bytes, int inside) {
  if (inside && plan->domain_div > 1) {
    chunk = (chunk / (uint64_t)plan->domain_div) & ~(uint64_t)63;
    if (chunk < 64) chunk = 64;
  }
  if (plan->spread_rounds <= 0) return chunk;
  /* a stream sends in one round of every `phases`, a wide one in all */
  uint64_t rounds = (uint64_t)plan->spread_rounds;
  if (plan->phases > 1 && !rs_stream_wide(plan, bytes))
    rounds = rounds / (uint64_t)plan->phases ? rounds / (uint64_t)plan->phases : 1;
  uint64_t share = (bytes + rounds - 1) / rounds;
  share = (share + 63) & ~(uint64_t)63;
  if (plan->opts.chunk_bytes && share > plan->opts.chunk_bytes) share = plan->opts.chunk_bytes & ~(size_t)63;
  if (share > ((uint64_t)INT32_MAX & ~(uint64_t)63)) share = (uint64_t)INT32_MAX & ~(uint64_t)63;
  return share > chunk ? share : chunk;
}

/* The horizon is what the longest network streams take at their caps:
 * the narrow one's messages one round in `phases`, the wide one's every
 * round. Every rank derives it from the agreed pace and the chunk alike, so both ends of a stream
 * (and the ranks that cut it only to learn its rounds) cut it alike. */
uint64_t rs_pace_rounds(const reshard_plan_t *plan, uint64_t chunk) {
  uint64_t h = 0;
  if (plan->pace.narrow) {
    uint64_t cap = spread_cap(plan, chunk, plan->pace.narrow, 0);
    h = (plan->pace.narrow + cap - 1) / cap;
    if (plan->phases > 1) h *= (uint64_t)plan->phases;
  }
  if (plan->pace.wide) {
    uint64_t cap = spread_cap(plan, chunk, plan->pace.wide, 0);
    uint64_t n = (plan->pace.wide + cap - 1) / cap;
    if (n > h) h = n;
  }
  /* no network stream: the longest inside a domain, at its chunk */
  if (!h && plan->pace.inside) {
    uint64_t cap = spread_cap(plan, chunk, plan->pace.inside, 1);
    h = (plan->pace.inside + cap - 1) / cap;
    if (plan->phases > 1 && !rs_stream_wide(plan, plan->pace.inside)) h *= (uint64_t)plan->phases;
  }
  return h;
}

/* Pacing. The network's streams set the plan's rounds; three kinds of
 * stream were cut as if they were alone. A stream inside a domain, at
 * chunk / domain_div in one round of `phases`, took many times the
 * network's rounds to move bytes that NVLink carries in a fraction of
 * them: DeepSeek-V3's forwards to the other 63 ranks of a domain (37 MB
 * each at 1 MiB every 16 rounds) ran 460 rounds past the network's 160.
 * It now takes at least its bytes over its rounds within the horizon,
 * and a quarter more (a forward starts a round late, and its data
 * lands unevenly), up to the chunk, or domain_div chunks where the chunk
 * is at least RS_RELAY_MIN_PART_DEFAULT (256 KiB). A relay owner forwards all it
 * receives to each other member of its domain, (members - 1) x its
 * network bytes: capped at the chunk, its forwards needed that many
 * times the network's messages and ran on after the network's rounds
 * (Qwen3-235B -> SGLang tp8 dp8 ep8 on gb200-nvl72: 95 rounds of NVLink
 * after 12 of network, 1.464 x T_lower). Larger forwards take staging
 * from the network's streams, and round_load, which prices them, shrinks
 * the chunk to make room (28 -> 3.5 MB there). Not under 256 KiB, about
 * a round's latency in NIC time: a small budget would shrink the chunk
 * further into the latency-bound range (Qwen2.5-0.5B with 1 MiB of
 * staging: its relay plan 0.0111 -> 0.0214 s). A bound that does not
 * scale with the chunk does not let it shrink: an eighth of the budget
 * (32 MiB) kept the whole Qwen3-235B -> SGLang at a 21 MB chunk whose
 * forwards fell behind, 1.425 x, against 1.086 here; and a fixed larger
 * cap once let the plan's chunk fall to 64 bytes on a 16-rank probe with
 * 4 KiB of staging.
 * A wide network stream (a relay forward between domains) whose data is
 * ready early sent a chunk every round and piled onto its receiver's
 * first rounds; it now takes at most its bytes over the horizon.
 * A narrow network stream nothing waits on past NVLink (RS_PACE_FREE:
 * direct traffic, a source -> owner stream of a group inside one domain)
 * sent a chunk a round until done, so a rank whose streams were short
 * sent most of its bytes in the first rounds and one whose streams were
 * long sent evenly: the ranks' rounds differed, and a round takes its
 * busiest rank's time. DeepSeek-V3 on 32 + 32 ranks, every source rank
 * sending 900 MiB: rounds of 2.3 ms on some ranks beside 1.1 ms on
 * others, the main plan 1.34 x its NIC time. It now also takes at most
 * its bytes over its rounds within the horizon, so that every rank's
 * rounds carry its bytes evenly, in messages of at least
 * RS_RELAY_MIN_PART_DEFAULT (256 KiB, about five times a message's cost
 * in NIC time): paced into one message a round, the short streams of
 * Llama-3.1-70B's plan (302 rounds) tripled its messages' cost, 1.015
 * -> 1.038 x T_lower, and Qwen3-30B-A3B's went 1.032 -> 1.083. Streams
 * that others wait on keep their caps: a relay stream that pipelines
 * over the network, and forwards, which go as their data arrives
 * (paced, the panel's DeepSeek-V3 went from 1.095 to 1.146 x T_lower:
 * the forwards between domains left later). A plan without network
 * streams (a spreading pre-plan, a plan inside one node) takes its
 * horizon from its longest stream inside a domain, and every stream
 * inside takes at most its bytes over it, for the same reason: the
 * DeepSeek-V3 spreading copy's givers sent 98 us rounds beside others'
 * 79 us, 3.33 -> 2.63 ms. Smaller caps never raise a round's staging, and round_load
 * and the ladder's cuts price the larger ones (they pass RS_PACE_NONE
 * or RS_PACE_INSIDE, not knowing which network streams are free), so
 * the chunk agreed stays within the budget. `bytes` may be padded to
 * 64: the cap only grows with it. */
uint64_t rs_chunk_cap(const reshard_plan_t *plan, uint64_t chunk, uint64_t bytes, int kind) {
  const int inside = kind == RS_PACE_INSIDE;
  uint64_t cap = spread_cap(plan, chunk, bytes, inside);
  uint64_t horizon = rs_pace_rounds(plan, chunk);
  int wide = rs_stream_wide(plan, bytes);
  if (horizon && (inside || wide || kind == RS_PACE_FREE)) {
    /* the rounds this stream sends in within the horizon, and the bytes
     * a message needs to be done by its end */
    uint64_t rounds = plan->phases > 1 && !wide ? horizon / (uint64_t)plan->phases : horizon;
    if (!rounds) rounds = 1;
    uint64_t need = ((bytes + rounds - 1) / rounds + 63) & ~(uint64_t)63;
    if (inside && !plan->pace.narrow && !plan->pace.wide) { /* no network: NVLink sets the pace */
      if (need < RS_RELAY_MIN_PART_DEFAULT) need = RS_RELAY_MIN_PART_DEFAULT;
      if (need < cap) cap = need;
    } else if (inside) { /* NVLink keeps pace with the network */
      /* a quarter over the average: a forward starts a round late and
       * its data lands unevenly (a short source stream's first) */
      need = (need + need / 4 + 63) & ~(uint64_t)63;
      uint64_t most = chunk >= RS_RELAY_MIN_PART_DEFAULT ? chunk * (uint64_t)plan->domain_div : chunk;
      if (need > most) need = most & ~(uint64_t)63;
      if (need > cap) cap = need;
    } else {
      /* a free stream's messages stay worth their cost (a short one
       * goes in a few messages of RS_RELAY_MIN_PART_DEFAULT) */
      if (kind == RS_PACE_FREE && !wide && need < RS_RELAY_MIN_PART_DEFAULT) need = RS_RELAY_MIN_PART_DEFAULT;
      if (need < cap) { /* a network stream spreads over the horizon; one */
        cap = need;     /* longer than it keeps its spread share */
      }
    }
  }
  return cap;
}

/* How a network stream whose segment s is paced: RS_PACE_FREE where
 * nothing waits on it past NVLink (direct traffic, and a source -> owner
 * relay stream that does not pipeline between domains), else
 * RS_PACE_NONE. Every party of the stream knows its segments' group,
 * origin and pipe. */
static int stream_kind(const rs_seg *s) {
  return s->group < 0 || (s->origin >= 0 && !s->pipe) ? RS_PACE_FREE : RS_PACE_NONE;
}

reshard_result_t rs_streams_size(const reshard_plan_t *plan, rs_seg_vec *segs, rs_streams *out) {
  memset(out, 0, sizeof *out);
  const seg_ref *v = NULL;
  RS_CHECK(sorted_refs(segs, &v));
  out->bytes = rs_malloc((segs->n + 1) * sizeof *out->bytes);
  out->inside = rs_malloc(segs->n + 1);
  out->kind = rs_malloc(segs->n + 1);
  out->from = rs_malloc((segs->n + 1) * sizeof *out->from);
  out->to = rs_malloc((segs->n + 1) * sizeof *out->to);
  if (!out->bytes || !out->inside || !out->kind || !out->from || !out->to) {
    rs_streams_free(out);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory sizing streams (%zu segments)", segs->n);
  }
  /* the streams in (level, stream) order; virtual segments (other
   * pairs' streams) take no staging here */
  size_t m = 0;
  const seg_ref *prev = NULL;
  for (size_t i = 0; i < segs->n; i++) {
    if (v[i].dir == RS_SEG_VIRTUAL) continue;
    if (!prev || cmp_ref_level_stream(&v[i], prev)) {
      out->inside[m] = (unsigned char)(plan && in_domain(plan, v[i].from, v[i].to));
      out->kind[m] = out->inside[m] ? RS_PACE_INSIDE : stream_kind(&segs->v[v[i].index]);
      out->from[m] = v[i].from;
      out->to[m] = v[i].to;
      out->bytes[m++] = 0;
    }
    out->bytes[m - 1] += v[i].bytes;
    prev = &v[i];
  }
  for (size_t i = 0; i < m; i++) {
    out->bytes[i] = (out->bytes[i] + 63) & ~(uint64_t)63;
    out->total += out->bytes[i];
  }
  out->n = m;
  return RESHARD_SUCCESS;
}

void rs_streams_free(rs_streams *s) {
  free(s->bytes);
  free(s->kind);
  free(s->inside);
  free(s->from);
  free(s->to);
  memset(s, 0, sizeof *s);
}

/* A round's most staging at chunk c: a stream has at most one message a
 * round, of at most min(its bytes, its cap), in a 64-byte slot. Sends and
 * receives stage in separate halves, each as large as its direction's
 * busiest round; with phases those rounds can fall in different phases,
 * so the bound is the busiest send phase plus the busiest receive phase
 * (with one phase: all streams); a wide stream (phase -1) is in every
 * phase. sums: 2 x plan->phases scratch. */
static uint64_t round_load(const reshard_plan_t *plan, const rs_streams *st, const int32_t *phase, uint64_t c,
                           uint64_t *sums) {
  int np = plan->phases > 1 ? plan->phases : 1;
  memset(sums, 0, 2 * (size_t)np * sizeof *sums);
  uint64_t all[2] = {0, 0};
  for (size_t i = 0; i < st->n; i++) {
    uint64_t cap = rs_chunk_cap(plan, c, st->bytes[i], st->kind[i]);
    int send = st->from[i] == plan->rank;
    uint64_t most = st->bytes[i] < cap ? st->bytes[i] : cap;
    if (phase && phase[i] < 0) all[send] += most;
    else sums[send * np + (phase ? phase[i] : 0)] += most;
  }
  uint64_t most[2] = {0, 0};
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < np; k++)
      if (sums[d * np + k] > most[d]) most[d] = sums[d * np + k];
  return most[0] + all[0] + most[1] + all[1];
}

uint64_t rs_streams_limit(const reshard_plan_t *plan, const rs_streams *st, const int32_t *phase, uint64_t half,
                          uint64_t *sums) {
  if (st->total <= half || round_load(plan, st, phase, UINT64_MAX / 2, sums) <= half) return UINT64_MAX;
  /* the largest multiple of 64 whose round load fits: the load grows
   * with c and exceeds half once every cap exceeds its stream, so bisect
   * between a c that fits (0 does) and one that does not */
  uint64_t lo = 0, hi = 64;
  while (round_load(plan, st, phase, hi, sums) <= half) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 64) {
    uint64_t mid = (lo + (hi - lo) / 2) & ~(uint64_t)63;
    if (round_load(plan, st, phase, mid, sums) <= half) lo = mid;
    else hi = mid;
  }
  return lo;
}

reshard_result_t rs_chunk_limit(const reshard_plan_t *plan, rs_seg_vec *segs, uint64_t half, uint64_t *out) {
  rs_streams st;
  RS_CHECK(rs_streams_size(plan, segs, &st));
  int np = plan->phases > 1 ? plan->phases : 1;
  uint64_t *sums = rs_malloc(2 * (size_t)np * sizeof *sums);
  int32_t *phase = rs_malloc((st.n + 1) * sizeof *phase);
  if (!sums || !phase) {
    free(sums);
    free(phase);
    rs_streams_free(&st);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory sizing streams (%zu streams)", st.n);
  }
  for (size_t i = 0; i < st.n; i++) phase[i] = rs_stream_phase(plan, st.from[i], st.to[i], st.bytes[i]);
  *out = rs_streams_limit(plan, &st, phase, half, sums);
  free(sums);
  free(phase);
  rs_streams_free(&st);
  return RESHARD_SUCCESS;
}

int32_t rs_chunk_spread(const rs_streams *st, uint64_t share) {
  if (share < 64) share = 64;
  uint64_t r = (st->total + share - 1) / share;
  return r < 1 ? 1 : r > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)r;
}

size_t rs_chunk_bound(const reshard_options_t *o, uint64_t limit) {
  size_t chunk = (size_t)(limit < o->staging_bytes / 2 ? limit : o->staging_bytes / 2);
  if (o->chunk_bytes && o->chunk_bytes < chunk) chunk = o->chunk_bytes;
  /* one message must stay countable in an int (MPI) */
  if (chunk > ((size_t)INT32_MAX & ~(size_t)63)) chunk = (size_t)INT32_MAX & ~(size_t)63;
  chunk &= ~(size_t)63;
  return chunk < 64 ? 64 : chunk;
}

/* Shifted round robin: at position i every rank sends to rank+i+1 and
 * receives from rank-i-1, so no receiver is hit by all senders at once. */
static uint64_t sched_key(int rank, int size, int peer, int is_send) {
  if (is_send) return (uint64_t)((peer - rank + size) % size);
  return (uint64_t)((rank - peer + size) % size);
}

/* The schedule: by round, then the round's forwards after its other
 * messages (they are posted apart, later: exec/schedule.h), then shifted
 * round robin, then stream key (the order in which both sides of a pair
 * post a round's messages, which is how the transports match messages
 * that share a tag). */
typedef struct sched_ref {
  int32_t round;
  uint64_t sched;
  msg_key key;
  size_t index;
} sched_ref;

static int cmp_sched(const void *a, const void *b) {
  const sched_ref *x = a, *y = b;
  int c = cmp_i32(x->round, y->round);
  if (!c) c = is_forward(x->key) - is_forward(y->key); /* a round's forwards last */
  if (!c) c = (x->sched > y->sched) - (x->sched < y->sched);
  if (!c) c = cmp_i32(x->key.group, y->key.group);
  if (!c) c = cmp_i32(x->key.origin, y->key.origin);
  if (!c) c = (x->index > y->index) - (x->index < y->index);
  return c;
}

/* Reorders ch->msgs by the schedule. */
static reshard_result_t schedule(chunker *ch) {
  if (ch->nmsgs < 2) return RESHARD_SUCCESS;
  sched_ref *refs = rs_malloc(ch->nmsgs * sizeof *refs);
  rs_msg *sorted = rs_malloc(ch->nmsgs * sizeof *sorted);
  if (!refs || !sorted) {
    free(refs);
    free(sorted);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory scheduling messages");
  }
  for (size_t i = 0; i < ch->nmsgs; i++)
    refs[i] = (sched_ref){ch->msgs[i].round, sched_key(ch->plan->rank, ch->plan->size, ch->msgs[i].peer, ch->is_send),
                          ch->keys[i], i};
  if (ch->nmsgs > 1) qsort(refs, ch->nmsgs, sizeof *refs, cmp_sched);
  for (size_t i = 0; i < ch->nmsgs; i++) sorted[i] = ch->msgs[refs[i].index];
  free(refs);
  free(ch->msgs);
  ch->msgs = sorted;
  ch->cap_msgs = ch->nmsgs;
  return RESHARD_SUCCESS;
}

/* Schedules one direction's messages, lays each round out in staging
 * (64-byte aligned for the copy loops) and hands the arrays to the plan. */
static reshard_result_t finish_direction(chunker *ch) {
  reshard_plan_t *plan = ch->plan;
  const int is_send = ch->is_send;
  RS_CHECK(schedule(ch));
  int nrounds = ch->nmsgs ? ch->msgs[ch->nmsgs - 1].round + 1 : 0;
  size_t *starts = rs_calloc((size_t)nrounds + 1, sizeof *starts);
  if (!starts) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking");
  uint64_t half = 0, off = 0;
  int round = -1;
  for (size_t i = 0; i < ch->nmsgs; i++) {
    rs_msg *m = &ch->msgs[i];
    if (m->round != round) {
      for (int k = round + 1; k <= m->round; k++) starts[k] = i;
      round = m->round;
      off = 0;
    }
    m->staging_off = off;
    for (uint32_t k = 0; k < m->ncopies; k++) {
      rs_copy *c = &ch->copies[m->first_copy + k];
      if (is_send) c->dst_off += off;
      else c->src_off += off;
    }
    off += (m->bytes + 63) & ~(uint64_t)63;
    if (off > half) half = off;
  }
  for (int k = round + 1; k <= nrounds; k++) starts[k] = ch->nmsgs;
  for (size_t i = 0; i < ch->nmsgs; i++) {
    rs_msg *m = &ch->msgs[i];
    m->direct = m->ncopies == 1 && ch->copies[m->first_copy].ndim == 0 && !ch->copies[m->first_copy].cvt_from;
  }
  if (is_send) {
    plan->sends = ch->msgs;
    plan->nsends = ch->nmsgs;
    plan->send_round = starts;
    plan->send_copies = ch->copies;
    plan->send_vbox = ch->vboxes;
    plan->nsend_copies = ch->ncopies;
    plan->send_half = half;
  } else {
    plan->recvs = ch->msgs;
    plan->nrecvs = ch->nmsgs;
    plan->recv_round = starts;
    plan->recv_copies = ch->copies;
    plan->recv_vbox = ch->vboxes;
    plan->nrecv_copies = ch->ncopies;
    plan->recv_half = half;
  }
  ch->msgs = NULL;
  ch->copies = NULL;
  ch->vboxes = NULL;
  ch->nmsgs = ch->ncopies = 0;
  return RESHARD_SUCCESS;
}

enum { RS_CUT_PREFETCH = 8 };

/* A source -> owner relay stream of `bytes` goes in at least
 * RS_RELAY_PIPELINE_ROUNDS messages, none under RS_RELAY_MIN_PART_DEFAULT
 * (the default relay part size: about a message's latency in NIC time;
 * the constant, not the tests' lowered part size, so that tiny relayed
 * tensors keep one message): its owner forwards each message's bytes the
 * round after they land, so the forwards overlap the stream instead of
 * following it (a fan-out takes about (k + 2) / k of its source's time
 * in the plan replay, 1.28 at 8, rather than twice it: the destination's
 * link carries the source's next message beside the forwards, diary
 * "Forwards one round after their data"); longer streams are cut finer
 * than that by the chunk anyway. */
static uint64_t relay_pipeline_cap(uint64_t cap, uint64_t bytes) {
  uint64_t want = (bytes + RS_RELAY_PIPELINE_ROUNDS - 1) / RS_RELAY_PIPELINE_ROUNDS;
  want = (want + 63) & ~(uint64_t)63;
  if (want < RS_RELAY_MIN_PART_DEFAULT) want = RS_RELAY_MIN_PART_DEFAULT;
  return want < cap ? want : cap;
}

/* The cap of the stream of `bytes` that segment s opens: rs_chunk_cap's
 * (paced as RS_PACE_FREE where nothing waits on it past NVLink: direct
 * traffic, and a source -> owner relay stream that does not pipeline),
 * and a source -> owner relay stream's pipelining cap (rs_seg.pipe).
 * Every party of the stream, virtual ones included, knows its segments'
 * group, origin and pipe, so all cut it alike. */
static size_t stream_cap(const reshard_plan_t *plan, size_t chunk, uint64_t bytes, const rs_seg *s) {
  const int inside = in_domain(plan, s->from, s->to);
  const int pipelines = s->group >= 0 && s->origin >= 0 && s->pipe;
  uint64_t cap = rs_chunk_cap(plan, chunk, bytes, inside ? RS_PACE_INSIDE : stream_kind(s));
  if (pipelines) cap = relay_pipeline_cap(cap, bytes);
  return (size_t)cap;
}

/* A forward's readiness runs (chunker.runs) from the spans of the
 * segments it forwards, appended to *runs: its bytes are bytes dep_off
 * .. dep_off + bytes of theirs laid end to end, and each run may travel
 * the round after the round its bytes arrived in. */
static reshard_result_t forward_runs(const rs_seg *s, const size_t *span_at,
                                     const uint32_t *span_n, const rs_span_vec *spans, rs_span_vec *runs) {
  const size_t first = runs->n;
  const uint64_t lo = s->dep_off, hi = s->dep_off + s->bytes;
  uint64_t base = 0; /* the dependency's first byte, in their concatenation */
  for (int32_t k = 0; k < s->ndep && base < hi; k++) {
    const int64_t d = s->dep + k;
    const uint32_t n = span_n[d];
    if (!n) /* cut in an earlier level, so recorded: a planning bug */
      return rs_error(RESHARD_ERROR_INTERNAL, "chunking: a forward %d -> %d depends on a segment not cut before it",
                      s->from, s->to);
    const rs_span *sp = spans->v + span_at[d]; /* span_at[d] is set once span_n[d] is */
    for (uint32_t j = 0; j < n; j++) {
      uint64_t a = base + (j ? sp[j - 1].end : 0), b = base + sp[j].end;
      if (b <= lo || a >= hi) continue;
      if (RS_VEC_GROW(runs->v, runs->n, runs->cap)) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking (runs)");
      runs->v[runs->n++] = (rs_span){(b < hi ? b : hi) - lo, sp[j].round + 1};
    }
    base += sp[n - 1].end;
  }
  if (runs->n == first || runs->v[runs->n - 1].end != s->bytes)
    return rs_error(RESHARD_ERROR_INTERNAL,
                    "chunking: a forward %d -> %d of %llu bytes at %llu finds %llu bytes in its %d dependencies", s->from,
                    s->to, (unsigned long long)s->bytes, (unsigned long long)lo, (unsigned long long)base, s->ndep);
  return RESHARD_SUCCESS;
}

/* A forward stream's segments in the order their data is ready to leave
 * (the round its last byte may travel in, from the spans of what it
 * forwards; the canonical order among equals), into *order (n refs,
 * scratch grown as needed). In the canonical (box, piece) order a
 * forward waited on whichever source sent its box last: an owner
 * receives its part from many sources, each sending its own boxes in
 * box order over the whole horizon, so the forward of the first box
 * waited for the end of its source's stream and every later box behind
 * it. Qwen3-235B -> SGLang tp8 dp8 ep8 on gb200-nvl72 (8 layers): the
 * forwards inside the destination domain moved 1.5% of their bytes
 * during the 12 network rounds and took 95 rounds after them (1.547 x
 * T_lower). Every party of the stream knows the spans (what a stream
 * waits on is cut first, virtual streams included), so all order it
 * alike. The forwards' runs stay in *runs, forward k's from (*run_at)[k]
 * to (*run_at)[k + 1], for the cut: what they wait on was cut before the
 * stream, so they do not change while it is cut, and a relay member's
 * cut (its group's whole split, tens of thousands of forwards, once per
 * trial chunk) need not find them twice. */
typedef struct ready_ref {
  int32_t ready;
  uint32_t at; /* canonical position in the stream */
  seg_ref ref;
} ready_ref;

static int cmp_ready(const void *a, const void *b) {
  const ready_ref *x = a, *y = b;
  int c = cmp_i32(x->ready, y->ready);
  return c ? c : (x->at > y->at) - (x->at < y->at);
}

static reshard_result_t ready_order(const rs_seg_vec *segs, const seg_ref *refs, size_t n, const size_t *span_at,
                                    const uint32_t *span_n, const rs_span_vec *spans, rs_span_vec *runs,
                                    size_t **run_at, ready_ref **order, size_t *cap) {
  if (n > *cap) {
    ready_ref *o = rs_realloc(*order, n * sizeof *o);
    if (!o) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking (%zu forwards)", n);
    *order = o;
    size_t *a = rs_realloc(*run_at, (n + 1) * sizeof *a);
    if (!a) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking (%zu forwards)", n);
    *run_at = a;
    *cap = n;
  }
  runs->n = 0;
  for (size_t k = 0; k < n; k++) {
    (*run_at)[k] = runs->n;
    RS_CHECK(forward_runs(&segs->v[refs[k].index], span_at, span_n, spans, runs));
    int32_t r = 0;
    for (size_t j = (*run_at)[k]; j < runs->n; j++)
      if (runs->v[j].round > r) r = runs->v[j].round;
    (*order)[k] = (ready_ref){r, (uint32_t)k, refs[k]};
  }
  (*run_at)[n] = runs->n;
  if (n > 1) qsort(*order, n, sizeof **order, cmp_ready);
  return RESHARD_SUCCESS;
}

/* Cuts every stream into messages: ch[RS_SEG_RECV], ch[RS_SEG_SEND] and
 * ch[RS_SEG_VIRTUAL] (dry) receive them; measure: messages and their
 * bytes only, no copies. */
static reshard_result_t cut_streams(reshard_plan_t *plan, rs_seg_vec *segs, size_t chunk_bytes, int measure,
                                    chunker *ch) {
  memset(ch, 0, 3 * sizeof *ch);
  for (int k = 0; k < 3; k++) {
    ch[k].plan = plan;
    ch[k].cap = chunk_bytes;
    ch[k].is_send = k == RS_SEG_SEND;
    ch[k].dry = k == RS_SEG_VIRTUAL;
    ch[k].measure = measure;
  }
  const seg_ref *refs = NULL;
  RS_CHECK(sorted_refs(segs, &refs));
  reshard_result_t r = RESHARD_SUCCESS;
  /* relay segments' spans, by push order: span_at[o] .. span_at[o] + span_n[o] */
  size_t *span_at = rs_malloc((segs->n + 1) * sizeof *span_at);
  uint32_t *span_n = rs_calloc(segs->n + 1, sizeof *span_n);
  rs_span_vec spans = {0}, runs = {0};
  if (!span_at || !span_n) {
    free(span_at);
    free(span_n);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory chunking");
  }
  ready_ref *order = NULL; /* the open stream's refs, when a forward's */
  size_t *run_at = NULL;    /* and where each one's runs are in `runs` */
  size_t cap_order = 0, begin = 0;
  uint64_t bytes = 0; /* the open stream's */
  for (size_t i = 0, end = 0; i < segs->n && r == RESHARD_SUCCESS; i++) {
    /* segments come in stream order, scattered in memory: ask for the
     * ones a few steps ahead now (the start, the dims and the stream key
     * of an rs_seg) */
    if (i + RS_CUT_PREFETCH < segs->n) {
      const char *ahead = (const char *)&segs->v[refs[i + RS_CUT_PREFETCH].index];
      for (size_t at = 0; at < sizeof(rs_seg); at += 64) __builtin_prefetch(ahead + at);
    }
    if (i == end) { /* a new stream: its cap from its bytes, which all its parties know */
      bytes = 0;
      for (end = i; end < segs->n && (end == i || !cmp_ref_level_stream(&refs[end], &refs[i])); end++)
        bytes += refs[end].bytes;
      begin = i;
      if (segs->v[refs[i].index].dep >= 0 &&
          (r = ready_order(segs, refs + i, end - i, span_at, span_n, &spans, &runs, &run_at, &order, &cap_order)))
        break;
    }
    const int forwards = segs->v[refs[begin].index].dep >= 0; /* ready_order ordered the stream */
    const seg_ref *ref = forwards ? &order[i - begin].ref : &refs[i];
    const rs_seg *s = &segs->v[ref->index];
    chunker *c = &ch[s->dir];
    if (i == begin) {
      c->stream = s;
      c->open = 0;
      c->cur = 0;
      c->cap = stream_cap(plan, chunk_bytes, bytes, s);
      c->phase = rs_stream_phase(plan, s->from, s->to, bytes);
    }
    c->ready = 0;
    c->nruns = c->run_at = 0;
    if (s->dep >= 0 && forwards) { /* its runs and their latest round, as ready_order found them */
      const uint32_t k = order[i - begin].at;
      c->runs = runs.v + run_at[k];
      c->nruns = run_at[k + 1] - run_at[k];
      c->ready = order[i - begin].ready;
    } else if (s->dep >= 0) { /* a forward in a stream that opened with a direct segment */
      runs.n = 0;
      r = forward_runs(s, span_at, span_n, &spans, &runs);
      if (r) break;
      c->runs = runs.v;
      c->nruns = runs.n;
      for (size_t k = 0; k < runs.n; k++)
        if (runs.v[k].round > c->ready) c->ready = runs.v[k].round;
    }
    const uint32_t o = ref->orig;
    if (s->group >= 0) { /* relay traffic: forwards may wait on its bytes */
      c->rec = &spans;
      c->rec_first = span_at[o] = spans.n;
      c->rec_bytes = 0;
    }
    int64_t ext[RESHARD_MAX_DIMS], at[RESHARD_MAX_DIMS] = {0};
    memcpy(ext, s->extent, sizeof ext);
    r = split_box(c, s, 0, s->off, ext, at);
    if (c->rec) span_n[o] = (uint32_t)(spans.n - span_at[o]);
    c->rec = NULL;
    c->nruns = 0;
  }
  free(span_at);
  free(span_n);
  free(spans.v);
  free(runs.v);
  free(order);
  free(run_at);
  return r;
}

static void free_chunkers(chunker *ch) {
  for (int k = 0; k < 3; k++) {
    free(ch[k].msgs);
    free(ch[k].keys);
    free(ch[k].copies);
    free(ch[k].vboxes);
  }
}

reshard_result_t rs_chunk_plan(reshard_plan_t *plan, rs_seg_vec *segs,
                               size_t chunk_bytes) {
  chunker ch[3]; /* RS_SEG_RECV, RS_SEG_SEND, RS_SEG_VIRTUAL */
  reshard_result_t r = cut_streams(plan, segs, chunk_bytes, 0, ch);
  if (r == RESHARD_SUCCESS) r = finish_direction(&ch[RS_SEG_SEND]);
  if (r == RESHARD_SUCCESS) r = finish_direction(&ch[RS_SEG_RECV]);
  free_chunkers(ch);
  return r;
}

/* One direction's staging half: its busiest round's messages, each
 * padded to 64 bytes (as finish_direction lays them out; the sum does not
 * depend on their order). */
static reshard_result_t measured_half(const chunker *ch, uint64_t *half) {
  *half = 0;
  int32_t nrounds = 0;
  for (size_t i = 0; i < ch->nmsgs; i++)
    if (ch->msgs[i].round + 1 > nrounds) nrounds = ch->msgs[i].round + 1;
  uint64_t *sum = rs_calloc((size_t)nrounds + 1, sizeof *sum);
  if (!sum) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory sizing staging (%d rounds)", (int)nrounds);
  for (size_t i = 0; i < ch->nmsgs; i++) {
    uint64_t *x = &sum[ch->msgs[i].round];
    *x += (ch->msgs[i].bytes + 63) & ~(uint64_t)63;
    if (*x > *half) *half = *x;
  }
  free(sum);
  return RESHARD_SUCCESS;
}

reshard_result_t rs_chunk_staging(const reshard_plan_t *plan, rs_seg_vec *segs, size_t chunk, uint64_t *staging) {
  reshard_plan_t tmp;
  memset(&tmp, 0, sizeof tmp);
  tmp.rank = plan->rank;
  tmp.size = plan->size;
  tmp.opts = plan->opts;
  tmp.spread_rounds = plan->spread_rounds;
  tmp.domain_div = plan->domain_div;
  tmp.phases = plan->phases;
  tmp.wide_bytes = plan->wide_bytes;
  tmp.pace = plan->pace;
  tmp.map = plan->map; /* borrowed */
  /* the cut alone: the same messages as rs_chunk_plan, without copies */
  chunker ch[3];
  uint64_t send_half = 0, recv_half = 0;
  reshard_result_t r = cut_streams(&tmp, segs, chunk, 1, ch);
  if (!r) r = measured_half(&ch[RS_SEG_SEND], &send_half);
  if (!r) r = measured_half(&ch[RS_SEG_RECV], &recv_half);
  free_chunkers(ch);
  *staging = 2 * (send_half + recv_half);
  return r;
}

