/* The stage store of stage_store.h. */
#define _GNU_SOURCE
#include "stage_store.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"

struct ss_store {
  int fd;
  int nranks;
  pthread_mutex_t lock;
  uint64_t end;                   /* bytes reserved in the file */
  uint64_t *off, *len;            /* per rank */
  size_t *nsegs;                  /* per rank */
};

/* ---- encoding: LEB128, signed values zigzagged ---- */

typedef struct wbuf {
  unsigned char *p;
  size_t n, cap;
  int oom;
} wbuf;

static void put_bytes(wbuf *b, const void *x, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, x, n);
  b->n += n;
}

static void put_u(wbuf *b, uint64_t v) {
  unsigned char t[10];
  int n = 0;
  do {
    t[n] = (unsigned char)(v & 0x7f);
    v >>= 7;
    if (v) t[n] |= 0x80;
    n++;
  } while (v);
  put_bytes(b, t, (size_t)n);
}

static void put_s(wbuf *b, int64_t v) { put_u(b, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63)); }

typedef struct rbuf {
  const unsigned char *p;
  size_t n, at;
  int bad;
} rbuf;

static uint64_t get_u(rbuf *b) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (b->at >= b->n) break;
    unsigned char c = b->p[b->at++];
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
  b->bad = 1;
  return 0;
}

static int64_t get_s(rbuf *b) {
  uint64_t u = get_u(b);
  return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static void get_bytes(rbuf *b, void *x, size_t n) {
  if (b->bad || b->n - b->at < n) {
    b->bad = 1;
    return;
  }
  memcpy(x, b->p + b->at, n);
  b->at += n;
}

static void encode(wbuf *b, const rs_plan_stage *st) {
  put_u(b, st->segs.n);
  put_u(b, st->nlocals);
  put_u(b, st->local_vbox != NULL);
  put_s(b, st->spread);
  put_u(b, st->digest);
  for (int k = 0; k < RS_PHASE_CANDIDATES; k++) put_u(b, st->phase_est[k]);
  for (int k = 0; k < RS_WIDE_CANDIDATES; k++) {
    put_u(b, st->pace_cand[k].narrow);
    put_u(b, st->pace_cand[k].wide);
  }
  for (size_t i = 0; i < st->segs.n; i++) {
    const rs_seg *s = &st->segs.v[i];
    put_s(b, s->peer);
    put_s(b, s->buffer);
    put_u(b, (uint64_t)s->ndim);
    put_s(b, s->tensor);
    put_s(b, s->vtensor);
    put_u(b, s->esize);
    put_u(b, s->off);
    put_u(b, s->bytes);
    for (int d = 0; d < s->ndim; d++) {
      put_s(b, s->extent[d]);
      put_s(b, s->strides[d]);
      put_s(b, s->gstart[d]);
    }
    put_s(b, s->dir);
    put_s(b, s->from);
    put_s(b, s->to);
    put_s(b, s->group);
    put_s(b, s->origin);
    put_s(b, s->level);
    put_s(b, s->dep);
    put_s(b, s->ndep);
    put_s(b, s->fwd);
    put_s(b, s->box);
    put_u(b, s->piece);
  }
  /* the segments' sort, when the creation made it (it does, sizing its
   * streams): later creations need not sort again */
  size_t *perm = st->segs.n ? malloc(st->segs.n * sizeof *perm) : NULL;
  int sorted = perm && rs_seg_vec_order(&st->segs, perm) == 0;
  put_u(b, (uint64_t)sorted);
  for (size_t i = 0; sorted && i < st->segs.n; i++) put_u(b, perm[i]);
  free(perm);
  if (st->segs.n && !perm) b->oom = 1;
  if (st->nlocals) put_bytes(b, st->locals, st->nlocals * sizeof *st->locals);
  if (st->nlocals && st->local_vbox) put_bytes(b, st->local_vbox, st->nlocals * sizeof *st->local_vbox);
}

static reshard_result_t decode(rbuf *b, rs_plan_stage *st, int rank) {
  size_t nsegs = (size_t)get_u(b), nlocals = (size_t)get_u(b);
  int vbox = get_u(b) != 0;
  st->spread = (int32_t)get_s(b);
  st->digest = get_u(b);
  for (int k = 0; k < RS_PHASE_CANDIDATES; k++) st->phase_est[k] = get_u(b);
  for (int k = 0; k < RS_WIDE_CANDIDATES; k++) {
    st->pace_cand[k].narrow = get_u(b);
    st->pace_cand[k].wide = get_u(b);
  }
  if (b->bad || nsegs > b->n || nlocals > b->n)
    return rs_error(RESHARD_ERROR_INTERNAL, "stage store: rank %d: corrupt header", rank);
  st->segs.v = calloc(nsegs + 1, sizeof *st->segs.v);
  st->locals = calloc(nlocals + 1, sizeof *st->locals);
  st->local_vbox = vbox ? calloc(nlocals + 1, sizeof *st->local_vbox) : NULL;
  if (!st->segs.v || !st->locals || (vbox && !st->local_vbox))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "stage store: rank %d: out of memory reading %zu segments", rank, nsegs);
  st->segs.cap = nsegs + 1;
  for (size_t i = 0; i < nsegs && !b->bad; i++) {
    rs_seg *s = &st->segs.v[i];
    s->peer = (int32_t)get_s(b);
    s->buffer = (int32_t)get_s(b);
    uint64_t nd = get_u(b);
    if (nd > RESHARD_MAX_DIMS) {
      b->bad = 1;
      break;
    }
    s->ndim = (int32_t)nd;
    s->tensor = (int32_t)get_s(b);
    s->vtensor = (int32_t)get_s(b);
    s->esize = (uint32_t)get_u(b);
    s->off = get_u(b);
    s->bytes = get_u(b);
    for (int d = 0; d < s->ndim; d++) {
      s->extent[d] = get_s(b);
      s->strides[d] = get_s(b);
      s->gstart[d] = get_s(b);
    }
    s->dir = (int32_t)get_s(b);
    s->from = (int32_t)get_s(b);
    s->to = (int32_t)get_s(b);
    s->group = (int32_t)get_s(b);
    s->origin = (int32_t)get_s(b);
    s->level = (int32_t)get_s(b);
    s->dep = get_s(b);
    s->ndep = (int32_t)get_s(b);
    s->fwd = (int32_t)get_s(b);
    s->box = (int32_t)get_s(b);
    s->piece = (uint32_t)get_u(b);
    st->segs.n = i + 1;
  }
  size_t *perm = NULL;
  if (get_u(b)) {
    perm = malloc((nsegs + 1) * sizeof *perm);
    if (!perm) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "stage store: rank %d: out of memory reading %zu segments", rank, nsegs);
    for (size_t i = 0; i < nsegs; i++) perm[i] = (size_t)get_u(b);
  }
  reshard_result_t r = perm && !b->bad ? rs_seg_vec_set_order(&st->segs, perm) : RESHARD_SUCCESS;
  free(perm);
  if (r) return r;
  if (nlocals) get_bytes(b, st->locals, nlocals * sizeof *st->locals);
  if (nlocals && vbox) get_bytes(b, st->local_vbox, nlocals * sizeof *st->local_vbox);
  st->nlocals = nlocals;
  if (b->bad || b->at != b->n) return rs_error(RESHARD_ERROR_INTERNAL, "stage store: rank %d: corrupt stage", rank);
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
  rs_plan_stage_free(out);
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
  rbuf b = {p, n, 0, 0};
  reshard_result_t r = decode(&b, out, rank);
  free(p);
  if (r) rs_plan_stage_free(out);
  return r;
}

size_t ss_store_segments(const ss_store *s, int rank) { return s->nsegs[rank]; }

uint64_t ss_store_bytes(const ss_store *s) { return s->end; }

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
