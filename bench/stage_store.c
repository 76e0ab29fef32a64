/* The stage store of stage_store.h. */
#define _GNU_SOURCE
#include "stage_store.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reshard_internal.h"

struct ss_store {
  int fd;
  int nranks;
  pthread_mutex_t lock;
  uint64_t end;                   /* bytes reserved in the file */
  uint64_t *off, *len;            /* per rank */
  size_t *nsegs;                  /* per rank */
};

/* ---- encoding: LEB128, signed values zigzagged ----
 * The writer reserves room for a whole segment at once (at most 10 bytes
 * a value), so that each value is a few stores without bounds checks. */

typedef struct wbuf {
  unsigned char *p;
  size_t n, cap;
  int oom;
} wbuf;

/* Room for `need` more bytes; returns where to write, or NULL. */
static unsigned char *reserve(wbuf *b, size_t need) {
  if (b->oom) return NULL;
  if (b->n + need > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + need) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return NULL;
    }
    b->p = p;
    b->cap = cap;
  }
  return b->p + b->n;
}

static inline unsigned char *w_u(unsigned char *at, uint64_t v) {
  while (v >= 0x80) {
    *at++ = (unsigned char)(v | 0x80);
    v >>= 7;
  }
  *at++ = (unsigned char)v;
  return at;
}

static inline unsigned char *w_s(unsigned char *at, int64_t v) { return w_u(at, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63)); }

static void put_u(wbuf *b, uint64_t v) {
  unsigned char *at = reserve(b, 10);
  if (at) b->n = (size_t)(w_u(at, v) - b->p);
}

static void put_bytes(wbuf *b, const void *x, size_t n) {
  unsigned char *at = reserve(b, n);
  if (!at) return;
  memcpy(at, x, n);
  b->n += n;
}

typedef struct rbuf {
  const unsigned char *p, *end;
  int bad;
} rbuf;

static inline uint64_t get_u(rbuf *b) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && b->p < b->end; shift += 7) {
    unsigned char c = *b->p++;
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
  b->bad = 1;
  return 0;
}

static inline int64_t get_s(rbuf *b) {
  uint64_t u = get_u(b);
  return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static void get_bytes(rbuf *b, void *x, size_t n) {
  if (b->bad || (size_t)(b->end - b->p) < n) {
    b->bad = 1;
    return;
  }
  memcpy(x, b->p, n);
  b->p += n;
}

/* ---- segments: each as its differences from the one before ----
 * Segments come in stream order, where neighbours mostly share their
 * stream, tensor, buffer, strides and shape: a segment is a mask of the
 * fields that differ from their prediction (the previous segment's value;
 * its push order and piece plus one), then each such field's difference,
 * zigzagged. A typical segment takes a few bytes instead of dozens, and
 * decoding it is a copy of the previous one and a few additions. */
enum {
  /* the fields that change most often first: their mask fits a byte */
  F_OFF, F_GSTART0, F_GSTART1, F_PIECE, F_BOX, F_BYTES, F_ORIG,
  F_PEER, F_BUFFER, F_NDIM, F_TENSOR, F_VTENSOR, F_ESIZE, F_DIR, F_FROM, F_TO, F_GROUP, F_ORIGIN, F_LEVEL,
  F_DEP, F_NDEP, F_FWD, F_DEP_OFF, F_PIPE, F_BESIZE, F_BDTYPE, F_WDTYPE,
  F_GSTART2, /* gstart[2 ..], then extent[], then strides[] */
  F_EXTENT = F_GSTART2 + RESHARD_MAX_DIMS - 2,
  F_STRIDES = F_EXTENT + RESHARD_MAX_DIMS,
  F_N = F_STRIDES + RESHARD_MAX_DIMS
};
_Static_assert(F_N <= 64, "one mask word per segment");

/* Most bytes one segment takes: its mask and a difference per field. */
enum { SEG_MAX_BYTES = 10 * (F_N + 1) };

static int f_gstart(int d) { return d == 0 ? F_GSTART0 : d == 1 ? F_GSTART1 : F_GSTART2 + d - 2; }

/* A segment's fields as numbers (dims past ndim: 0). */
static void seg_fields(const rs_seg *s, uint32_t orig, int64_t *f) {
  f[F_ORIG] = orig;
  f[F_PEER] = s->peer;
  f[F_BUFFER] = s->buffer;
  f[F_NDIM] = s->ndim;
  f[F_TENSOR] = s->tensor;
  f[F_VTENSOR] = s->vtensor;
  f[F_ESIZE] = s->esize;
  f[F_OFF] = (int64_t)s->off;
  f[F_BYTES] = (int64_t)s->bytes;
  f[F_DIR] = s->dir;
  f[F_FROM] = s->from;
  f[F_TO] = s->to;
  f[F_GROUP] = s->group;
  f[F_ORIGIN] = s->origin;
  f[F_LEVEL] = s->level;
  f[F_DEP] = s->dep;
  f[F_NDEP] = s->ndep;
  f[F_FWD] = s->fwd;
  f[F_DEP_OFF] = (int64_t)s->dep_off;
  f[F_PIPE] = s->pipe;
  f[F_BESIZE] = s->besize;
  f[F_BDTYPE] = s->bdtype;
  f[F_WDTYPE] = s->wdtype;
  f[F_BOX] = s->box;
  f[F_PIECE] = s->piece;
  for (int d = 0; d < RESHARD_MAX_DIMS; d++) {
    const int in = d < s->ndim;
    f[f_gstart(d)] = in ? s->gstart[d] : 0;
    f[F_EXTENT + d] = in ? s->extent[d] : 0;
    f[F_STRIDES + d] = in ? s->strides[d] : 0;
  }
}

/* The predictions for the segment after one with fields f. */
static void predict(int64_t *f) {
  f[F_ORIG]++;
  f[F_PIECE]++;
}

static void encode(wbuf *b, const rs_plan_stage *st) {
  put_u(b, st->segs.n);
  put_u(b, st->nlocals);
  put_u(b, st->local_vbox != NULL);
  put_u(b, ((uint64_t)st->spread << 1) ^ (uint64_t)((int64_t)st->spread >> 63));
  put_u(b, st->digest);
  for (int k = 0; k < RS_PHASE_CANDIDATES; k++) put_u(b, st->phase_est[k]);
  for (int k = 0; k < RS_WIDE_CANDIDATES; k++) {
    put_u(b, st->pace_cand[k].narrow);
    put_u(b, st->pace_cand[k].wide);
    put_u(b, st->pace_cand[k].inside);
  }
  /* in stream order, with each segment's push order, when the creation
   * sorted them (it does, sizing its streams): later creations then
   * neither sort nor read them out of sequence */
  const size_t n = st->segs.n;
  uint32_t *index_of = n ? malloc(n * sizeof *index_of) : NULL, *orig_of = n ? malloc(n * sizeof *orig_of) : NULL;
  if (n && (!index_of || !orig_of)) b->oom = 1;
  int sorted = index_of && orig_of && rs_seg_vec_order(&st->segs, index_of, orig_of) == 0;
  put_u(b, (uint64_t)sorted);
  int64_t prev[F_N] = {0}, cur[F_N];
  for (size_t k = 0; k < n && !b->oom; k++) {
    if (sorted && k + 16 < n) { /* scattered in memory: ask for a later one now */
      const char *ahead = (const char *)&st->segs.v[index_of[k + 16]];
      for (size_t at = 0; at < sizeof(rs_seg); at += 64) __builtin_prefetch(ahead + at);
    }
    unsigned char *at = reserve(b, SEG_MAX_BYTES);
    if (!at) break;
    const size_t i = sorted ? index_of[k] : k;
    seg_fields(&st->segs.v[i], sorted ? orig_of[k] : (uint32_t)k, cur);
    predict(prev);
    uint64_t mask = 0;
    for (int f = 0; f < F_N; f++)
      if (cur[f] != prev[f]) mask |= (uint64_t)1 << f;
    at = w_u(at, mask);
    for (uint64_t m = mask; m; m &= m - 1) {
      const int f = __builtin_ctzll(m);
      at = w_s(at, (int64_t)((uint64_t)cur[f] - (uint64_t)prev[f]));
    }
    memcpy(prev, cur, sizeof prev);
    b->n = (size_t)(at - b->p);
  }
  free(index_of);
  free(orig_of);
  if (st->nlocals) put_bytes(b, st->locals, st->nlocals * sizeof *st->locals);
  if (st->nlocals && st->local_vbox) put_bytes(b, st->local_vbox, st->nlocals * sizeof *st->local_vbox);
}

static reshard_result_t decode(rbuf *b, size_t len, rs_plan_stage *st, int rank) {
  size_t nsegs = (size_t)get_u(b), nlocals = (size_t)get_u(b);
  int vbox = get_u(b) != 0;
  st->spread = (int32_t)get_s(b);
  st->digest = get_u(b);
  for (int k = 0; k < RS_PHASE_CANDIDATES; k++) st->phase_est[k] = get_u(b);
  for (int k = 0; k < RS_WIDE_CANDIDATES; k++) {
    st->pace_cand[k].narrow = get_u(b);
    st->pace_cand[k].wide = get_u(b);
    st->pace_cand[k].inside = get_u(b);
  }
  if (b->bad || nsegs > len || nlocals > len)
    return rs_error(RESHARD_ERROR_INTERNAL, "stage store: rank %d: corrupt header", rank);
  if (st->segs.cap < nsegs + 1) { /* else the memory given (ss_store_get) is reused */
    free(st->segs.v);
    st->segs.v = malloc((nsegs + 1) * sizeof *st->segs.v);
    st->segs.cap = st->segs.v ? nsegs + 1 : 0;
  }
  st->segs.n = 0;
  st->locals = calloc(nlocals + 1, sizeof *st->locals);
  st->local_vbox = vbox ? calloc(nlocals + 1, sizeof *st->local_vbox) : NULL;
  if (!st->segs.v || !st->locals || (vbox && !st->local_vbox))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "stage store: rank %d: out of memory reading %zu segments", rank, nsegs);
  const int sorted = get_u(b) != 0;
  /* the creation's sort, installed as the segments are decoded */
  if (sorted) RS_CHECK(rs_seg_vec_lay_out_begin(&st->segs, nsegs));
  int64_t f[F_N] = {0};
  for (size_t i = 0; i < nsegs && !b->bad; i++) {
    predict(f);
    const uint64_t mask = get_u(b);
    if (mask >> F_N) {
      b->bad = 1;
      break;
    }
    for (uint64_t m = mask; m; m &= m - 1) {
      const int k = __builtin_ctzll(m);
      f[k] = (int64_t)((uint64_t)f[k] + (uint64_t)get_s(b));
    }
    if (f[F_NDIM] < 0 || f[F_NDIM] > RESHARD_MAX_DIMS || f[F_ORIG] < 0 || (uint64_t)f[F_ORIG] >= nsegs) {
      b->bad = 1;
      break;
    }
    rs_seg *s = &st->segs.v[i];
    s->peer = (int32_t)f[F_PEER];
    s->buffer = (int32_t)f[F_BUFFER];
    s->ndim = (int32_t)f[F_NDIM];
    s->tensor = (int32_t)f[F_TENSOR];
    s->vtensor = (int32_t)f[F_VTENSOR];
    s->esize = (uint32_t)f[F_ESIZE];
    s->off = (uint64_t)f[F_OFF];
    s->bytes = (uint64_t)f[F_BYTES];
    for (int d = 0; d < RESHARD_MAX_DIMS; d++) {
      s->gstart[d] = f[f_gstart(d)];
      s->extent[d] = f[F_EXTENT + d];
      s->strides[d] = f[F_STRIDES + d];
    }
    s->dir = (int32_t)f[F_DIR];
    s->from = (int32_t)f[F_FROM];
    s->to = (int32_t)f[F_TO];
    s->group = (int32_t)f[F_GROUP];
    s->origin = (int32_t)f[F_ORIGIN];
    s->level = (int32_t)f[F_LEVEL];
    s->dep = f[F_DEP];
    s->ndep = (int32_t)f[F_NDEP];
    s->fwd = (int32_t)f[F_FWD];
    s->dep_off = (uint64_t)f[F_DEP_OFF];
    s->pipe = (int32_t)f[F_PIPE];
    s->besize = (uint32_t)f[F_BESIZE];
    s->bdtype = (int32_t)f[F_BDTYPE];
    s->wdtype = (int32_t)f[F_WDTYPE];
    s->box = (int32_t)f[F_BOX];
    s->piece = (uint32_t)f[F_PIECE];
    if (sorted) rs_seg_vec_lay_out_put(&st->segs, i, (uint32_t)f[F_ORIG]);
    st->segs.n = i + 1;
  }
  if (sorted && !b->bad && st->segs.n == nsegs) RS_CHECK(rs_seg_vec_lay_out_end(&st->segs));
  else if (sorted) rs_seg_vec_changed(&st->segs); /* a partial sort: none */
  if (nlocals) get_bytes(b, st->locals, nlocals * sizeof *st->locals);
  if (nlocals && vbox) get_bytes(b, st->local_vbox, nlocals * sizeof *st->local_vbox);
  st->nlocals = nlocals;
  if (b->bad || b->p != b->end) return rs_error(RESHARD_ERROR_INTERNAL, "stage store: rank %d: corrupt stage", rank);
  return RESHARD_SUCCESS;
}

/* ---- the store ---- */

reshard_result_t ss_store_create(int nranks, ss_store **out) {
  *out = NULL;
  ss_store *s = calloc(1, sizeof *s);
  if (!s) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "stage store: out of memory");
  s->fd = -1;
  s->nranks = nranks;
  s->off = calloc((size_t)nranks + 1, sizeof *s->off);
  s->len = calloc((size_t)nranks + 1, sizeof *s->len);
  s->nsegs = calloc((size_t)nranks + 1, sizeof *s->nsegs);
  if (!s->off || !s->len || !s->nsegs) {
    ss_store_free(s);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "stage store: out of memory");
  }
  const char *dir = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/reshard_stages.XXXXXX", dir && *dir ? dir : "/tmp");
  s->fd = mkstemp(path);
  if (s->fd < 0) {
    int e = errno;
    ss_store_free(s);
    return rs_error(RESHARD_ERROR_BACKEND, "stage store: cannot create a temporary file %s: %s", path, strerror(e));
  }
  unlink(path); /* gone when the store is */
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return RESHARD_SUCCESS;
}

reshard_result_t ss_store_put(ss_store *s, int rank, const rs_plan_stage *stage) {
  wbuf b = {0};
  encode(&b, stage);
  if (b.oom) {
    free(b.p);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "stage store: rank %d: out of memory encoding %zu segments", rank,
                    stage->segs.n);
  }
  pthread_mutex_lock(&s->lock);
  uint64_t at = s->end;
  s->end += b.n;
  pthread_mutex_unlock(&s->lock);
  for (size_t done = 0; done < b.n;) {
    ssize_t w = pwrite(s->fd, b.p + done, b.n - done, (off_t)(at + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : ENOSPC;
      free(b.p);
      return rs_error(RESHARD_ERROR_BACKEND, "stage store: rank %d: writing %zu bytes: %s", rank, b.n, strerror(e));
    }
    done += (size_t)w;
  }
  free(b.p);
  s->off[rank] = at;
  s->len[rank] = b.n;
  s->nsegs[rank] = stage->segs.n;
  return RESHARD_SUCCESS;
}

reshard_result_t ss_store_get(ss_store *s, int rank, rs_plan_stage *out) {
  rs_seg_vec keep = out->segs; /* its memory is reused */
  rs_seg_vec_changed(&keep);
  out->segs = (rs_seg_vec){0};
  rs_plan_stage_free(out);
  out->segs = keep;
  size_t n = (size_t)s->len[rank];
  if (!n) return rs_error(RESHARD_ERROR_INTERNAL, "stage store: rank %d was never stored", rank);
  unsigned char *p = malloc(n);
  if (!p) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "stage store: rank %d: out of memory reading %zu bytes", rank, n);
  for (size_t done = 0; done < n;) {
    ssize_t r = pread(s->fd, p + done, n - done, (off_t)(s->off[rank] + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : EIO;
      free(p);
      return rs_error(RESHARD_ERROR_BACKEND, "stage store: rank %d: reading %zu bytes: %s", rank, n, strerror(e));
    }
    done += (size_t)r;
  }
  rbuf b = {p, p + n, 0};
  reshard_result_t r = decode(&b, n, out, rank);
  free(p);
  if (r) rs_plan_stage_free(out);
  return r;
}

size_t ss_store_segments(const ss_store *s, int rank) { return s->nsegs[rank]; }

void ss_store_free(ss_store *s) {
  if (!s) return;
  if (s->fd >= 0) {
    close(s->fd);
    pthread_mutex_destroy(&s->lock);
  }
  free(s->off);
  free(s->len);
  free(s->nsegs);
  free(s);
}
