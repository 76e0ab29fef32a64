/* Source-side spreading: which slices move where, and the layouts that
 * say so (see spread.h). */
#include "plan/spread.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "layout/layout.h"
#include "plan/executor.h"
#include "plan/plan.h"
#include "transport/transport.h"

#define SCRATCH_NAME "reshard.spread"

/* One slice: rows [start, start + extent) of a fragment of `origin`,
 * copied to `to`. */
typedef struct slice {
  int origin, to;
  size_t order;
  int tensor, ndim;
  int64_t start[RESHARD_MAX_DIMS], extent[RESHARD_MAX_DIMS];
  uint64_t bytes, off;
} slice;

typedef struct slice_vec {
  slice *v;
  size_t n, cap;
} slice_vec;

static reshard_result_t push_slice(slice_vec *v, const slice *s) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 64;
    slice *p = rs_realloc(v->v, cap * sizeof *p);
    if (!p) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (spreading)");
    v->v = p;
    v->cap = cap;
  }
  v->v[v->n] = *s;
  v->v[v->n].order = v->n;
  v->n++;
  return RESHARD_SUCCESS;
}

/* By receiving rank, then origin, then the order made: one scratch
 * buffer per (receiver, origin), its slices in a fixed order. */
static int cmp_slice(const void *a, const void *b) {
  const slice *x = a, *y = b;
  if (x->to != y->to) return x->to < y->to ? -1 : 1;
  if (x->origin != y->origin) return x->origin < y->origin ? -1 : 1;
  return (x->order > y->order) - (x->order < y->order);
}

/* Whether rank r alone holds every element of fragment f. */
static reshard_result_t sole_held(const reshard_layout_t *src, const rs_frag *f, rs_lower_cache *cache,
                                  rs_frag_vec *hv, int *sole) {
  hv->n = 0;
  RS_CHECK(rs_layout_find_holders(src, f->tensor, f->start, f->extent, cache, hv));
  *sole = 1;
  for (size_t i = 0; i < hv->n && *sole; i++) *sole = hv->v[i].rank == f->rank;
  return RESHARD_SUCCESS;
}

/* A receiver of one domain and the egress it can still take. */
typedef struct taker {
  int rank;
  uint64_t room;
} taker;

/* Gives away `excess` bytes of egress of donor r, in slices of its
 * sole-held fragments (in canonical order), to the takers from *at on. A
 * fragment is cut along dim d*, the outermost whose rows (one index of
 * it, everything inside) are at most RS_SPREAD_GRAIN bytes (the last dim
 * if none), for each index of the dims outside d* in turn: slices are
 * boxes, and a taker's share misses its room by less than a row. */
/* Whether a destination rank outside rank r's domain needs part of f
 * (a tensor the destination does not declare, or declares and places
 * nowhere near f, such as block quantization's source weight, gains
 * nothing from a copy). */
static reshard_result_t needed_outside(const reshard_layout_t *src, const reshard_layout_t *dst, const rs_rank_map *map,
                                       int tensor, const int64_t *start, const int64_t *extent, int origin,
                                       rs_lower_cache *dcache, rs_frag_vec *hv, int *needed) {
  *needed = 0;
  int t;
  if (reshard_layout_find_tensor(dst, src->tensors[tensor].name, &t) != RESHARD_SUCCESS) {
    rs_error_clear();
    return RESHARD_SUCCESS;
  }
  hv->n = 0;
  RS_CHECK(rs_layout_find_holders(dst, t, start, extent, dcache, hv));
  for (size_t i = 0; i < hv->n && !*needed; i++) *needed = map->domain[hv->v[i].rank] != map->domain[origin];
  return RESHARD_SUCCESS;
}

static reshard_result_t give(const reshard_layout_t *src, const reshard_layout_t *dst, const rs_rank_map *map, int r,
                             uint64_t excess, uint64_t rho, taker *tk, int ntk, int *at, rs_lower_cache *cache,
                             rs_lower_cache *dcache, rs_frag_vec *fv, rs_frag_vec *hv, slice_vec *out) {
  fv->n = 0;
  RS_CHECK(rs_layout_rank_fragments(src, r, fv));
  for (size_t i = 0; i < fv->n && excess > 0 && *at < ntk; i++) {
    const rs_frag *f = &fv->v[i];
    const int nd = f->ndim;
    int64_t elems = 1;
    for (int d = 0; d < nd; d++) elems *= f->extent[d];
    if (nd == 0 || elems < 2) continue; /* not worth a slice */
    int sole, needed;
    RS_CHECK(sole_held(src, f, cache, hv, &sole));
    if (!sole) continue;
    RS_CHECK(needed_outside(src, dst, map, f->tensor, f->start, f->extent, r, dcache, hv, &needed));
    if (!needed) continue;
    const uint64_t esize = reshard_dtype_size(src->tensors[f->tensor].dtype);
    int ds = nd - 1;
    uint64_t row = esize;
    for (int d = nd - 1; d >= 0; d--) { /* row: bytes of one index of d */
      if (row <= RS_SPREAD_GRAIN && f->extent[d] > 1) ds = d;
      if (d > 0) row *= (uint64_t)f->extent[d];
    }
    row = esize;
    for (int d = ds + 1; d < nd; d++) row *= (uint64_t)f->extent[d];
    int64_t idx[RESHARD_MAX_DIMS] = {0}; /* over the dims outside ds */
    for (;;) {
      int64_t next = 0;
      while (next < f->extent[ds] && excess > 0 && *at < ntk) {
        taker *t = &tk[*at];
        const uint64_t want = (t->room < excess ? t->room : excess) / rho;
        int64_t rows = (int64_t)((want + row - 1) / row);
        if (rows < 1) rows = 1;
        if (rows > f->extent[ds] - next) rows = f->extent[ds] - next;
        slice s;
        memset(&s, 0, sizeof s);
        s.origin = r;
        s.to = t->rank;
        s.tensor = f->tensor;
        s.ndim = nd;
        for (int d = 0; d < nd; d++) {
          s.start[d] = f->start[d] + (d < ds ? idx[d] : 0);
          s.extent[d] = d < ds ? 1 : f->extent[d];
        }
        s.start[ds] += next;
        s.extent[ds] = rows;
        s.bytes = (uint64_t)rows * row;
        next += rows;
        /* rows only the origin's domain needs stay with the origin */
        RS_CHECK(needed_outside(src, dst, map, s.tensor, s.start, s.extent, r, dcache, hv, &needed));
        if (!needed) continue;
        RS_CHECK(push_slice(out, &s));
        const uint64_t gone = s.bytes * rho;
        excess = gone < excess ? excess - gone : 0;
        t->room = gone < t->room ? t->room - gone : 0;
        if (!t->room) ++*at;
      }
      if (!excess || *at >= ntk) break;
      int d = ds - 1;
      while (d >= 0 && ++idx[d] == f->extent[d]) idx[d--] = 0;
      if (d < 0) break;
    }
  }
  return RESHARD_SUCCESS;
}

/* The slices of every domain: ranks above the domain's mean egress by
 * more than mean / RS_SPREAD_SLACK (and RS_SPREAD_MIN_BYTES) give their
 * excess to the ranks below the mean, donors and takers in rank order.
 * A donor's byte moved saves about rho bytes of egress, rho = its egress
 * over its held bytes (at least 1: data several destination domains need
 * leaves once per domain). */
static reshard_result_t decide(const reshard_layout_t *src, const reshard_layout_t *dst, const rs_rank_map *map,
                               int nranks,
                               const uint64_t *egress, const uint64_t *held, uint64_t floor, slice_vec *out) {
  reshard_result_t r = RESHARD_SUCCESS;
  taker *tk = rs_malloc(((size_t)nranks + 1) * sizeof *tk);
  rs_frag_vec fv = {0}, hv = {0};
  rs_lower_cache cache, dcache;
  memset(&cache, 0, sizeof cache);
  memset(&dcache, 0, sizeof dcache);
  if (!tk) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (spreading)");
  /* domains in order of their first rank */
  for (int first = 0; !r && first < nranks; first++) {
    const int dom = map->domain[first];
    int seen = 0;
    for (int q = 0; q < first && !seen; q++) seen = map->domain[q] == dom;
    if (seen) continue;
    uint64_t sum = 0;
    int n = 0;
    for (int q = first; q < nranks; q++)
      if (map->domain[q] == dom && egress[q]) sum += egress[q] - 1, n++;
    if (n < 2) continue;
    const uint64_t mean = sum / (uint64_t)n;
    const uint64_t slack = mean / RS_SPREAD_SLACK > floor ? mean / RS_SPREAD_SLACK : floor;
    int ntk = 0;
    for (int q = first; q < nranks; q++)
      if (map->domain[q] == dom && egress[q] && egress[q] - 1 < mean) tk[ntk++] = (taker){q, mean - (egress[q] - 1)};
    int at = 0;
    for (int q = first; !r && q < nranks && at < ntk; q++) {
      if (map->domain[q] != dom || !egress[q] || egress[q] - 1 <= mean + slack) continue;
      const uint64_t e = egress[q] - 1;
      uint64_t rho = held[q] ? e / held[q] : 1;
      if (rho < 1) rho = 1;
      r = give(src, dst, map, q, e - mean, rho, tk, ntk, &at, &cache, &dcache, &fv, &hv, out);
    }
  }
  free(tk);
  rs_frag_vec_free(&fv);
  rs_frag_vec_free(&hv);
  rs_lower_cache_free(&cache);
  rs_lower_cache_free(&dcache);
  return r;
}

/* The scratch buffer of slices s[0 .. n) (one receiver, one origin) in
 * both layouts; this rank's are recorded. */
static reshard_result_t add_buffer(rs_spread_layouts *o, slice *s, size_t n, int me) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    s[i].off = bytes;
    bytes += (s[i].bytes + 63) / 64 * 64;
  }
  int mid, pid;
  RS_CHECK(reshard_layout_add_buffer(o->src, SCRATCH_NAME, s[0].to, bytes, &mid));
  RS_CHECK(reshard_layout_add_buffer(o->pre, SCRATCH_NAME, s[0].to, bytes, &pid));
  o->src->buffers[mid].spread_origin = s[0].origin + 1;
  for (size_t i = 0; i < n; i++) {
    reshard_fragment_t f = {s[i].tensor, mid, s[i].start, s[i].extent, s[i].off, NULL};
    RS_CHECK(reshard_layout_add_fragment(o->src, &f));
    f.buffer_id = pid;
    RS_CHECK(reshard_layout_add_fragment(o->pre, &f));
    o->moved += s[i].bytes;
  }
  if (s[0].to != me) return RESHARD_SUCCESS;
  const int k = o->nbufs++;
  o->main_id[k] = mid, o->pre_id[k] = pid;
  o->off[k] = o->bytes, o->len[k] = bytes;
  o->bytes += bytes;
  return RESHARD_SUCCESS;
}

uint64_t rs_spread_egress(const reshard_plan_t *p) {
  uint64_t e = 0;
  for (size_t i = 0; p->has_topo && i < p->npeers; i++)
    if (p->map.domain[p->peers[i].peer] != p->map.domain[p->rank]) e += p->peers[i].send_bytes;
  return e;
}

reshard_result_t rs_spread_layouts_make(const reshard_layout_t *src, const reshard_layout_t *dst, const rs_rank_map *map,
                                        int nranks, int me,
                                        const uint64_t *egress, const uint64_t *held, int always,
                                        rs_spread_layouts *out) {
  memset(out, 0, sizeof *out);
  slice_vec sv = {0};
  reshard_result_t r = decide(src, dst, map, nranks, egress, held, always ? 0 : RS_SPREAD_MIN_BYTES, &sv);
  if (r || !sv.n) {
    free(sv.v);
    return r;
  }
  qsort(sv.v, sv.n, sizeof *sv.v, cmp_slice);
  size_t groups = 0;
  for (size_t i = 0; i < sv.n; i++) groups += !i || sv.v[i].to != sv.v[i - 1].to || sv.v[i].origin != sv.v[i - 1].origin;
  out->main_id = rs_malloc((groups + 1) * sizeof *out->main_id);
  out->pre_id = rs_malloc((groups + 1) * sizeof *out->pre_id);
  out->off = rs_malloc((groups + 1) * sizeof *out->off);
  out->len = rs_malloc((groups + 1) * sizeof *out->len);
  if (!out->main_id || !out->pre_id || !out->off || !out->len)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (spreading)");
  if (!r) r = rs_layout_clone(src, &out->src);
  if (!r) r = rs_layout_tensors_only(src, &out->pre);
  for (size_t i = 0; !r && i < sv.n;) {
    size_t j = i;
    while (j < sv.n && sv.v[j].to == sv.v[i].to && sv.v[j].origin == sv.v[i].origin) j++;
    r = add_buffer(out, sv.v + i, j - i, me);
    i = j;
  }
  free(sv.v);
  if (r) rs_spread_layouts_free(out);
  return r;
}

void rs_spread_layouts_free(rs_spread_layouts *s) {
  if (!s) return;
  reshard_layout_destroy(s->src);
  reshard_layout_destroy(s->pre);
  free(s->main_id);
  free(s->pre_id);
  free(s->off);
  free(s->len);
  memset(s, 0, sizeof *s);
}

reshard_result_t rs_spread_create(rs_spread_layouts *sl, const reshard_layout_t *user_src, reshard_comm_t *comm,
                                  const rs_executor *ex, rs_spread **out) {
  *out = NULL;
  const int me = comm->rank;
  rs_spread *s = rs_calloc(1, sizeof *s);
  if (!s) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory", me);
  s->user_nsrc = user_src->nbuffers;
  s->pre_ndst = sl->pre->nbuffers;
  s->nbufs = sl->nbufs;
  s->main_id = sl->main_id, s->pre_id = sl->pre_id, s->off = sl->off, s->len = sl->len;
  sl->main_id = sl->pre_id = NULL, sl->off = sl->len = NULL, sl->nbufs = 0;
  s->bytes = sl->bytes;
  s->moved = sl->moved;
  reshard_result_t r = RESHARD_SUCCESS;
  if (ex->stream_ordered) { /* (spread_wanted: only where it has spread_prepare) */
    r = ex->spread_prepare(comm, s);
  } else if (s->bytes && !(s->scratch = rs_bulk_malloc(s->bytes))) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory for %llu bytes of spreading scratch",
                 me, (unsigned long long)s->bytes);
  }
  if (r) {
    rs_spread_free(s);
    return r;
  }
  *out = s;
  return RESHARD_SUCCESS;
}

void rs_spread_free(rs_spread *s) {
  if (!s) return;
  free(s->main_id);
  free(s->pre_id);
  free(s->off);
  free(s->len);
  if (s->dev_free) s->dev_free(s);
  else rs_bulk_free(s->scratch);
  free(s);
}
