/* Lowering: placements and fused buffers -> fragments, on demand.
 *
 * A fused buffer's arrangement on a rank depends on every part present on
 * that rank (the concatenation offsets are prefix sums of the local
 * extents), so a buffer is always lowered whole for one rank and the
 * fragments asked for are filtered from it. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "common/error.h"
#include "common/vec.h"
#include "layout/layout.h"

reshard_result_t rs_frag_vec_push(rs_frag_vec *vec, const rs_frag *f) {
  if (RS_VEC_GROW(vec->v, vec->n, vec->cap))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory lowering fragments (%zu)", vec->n + 1);
  vec->v[vec->n++] = *f;
  return RESHARD_SUCCESS;
}

void rs_frag_vec_free(rs_frag_vec *vec) {
  free(vec->v);
  vec->v = NULL;
  vec->n = vec->cap = 0;
}

/* The piece of [0, extent) that coordinate c of an n-way split holds. */
static int split_piece(const reshard_placement_t *pl, int n, int c,
                       int64_t extent, int64_t *off, int64_t *size) {
  if (pl->split_sizes) {
    int64_t sum = 0, pre = 0;
    for (int i = 0; i < n; i++) {
      if (i == c) pre = sum;
      if (rs_add_overflow_i64(sum, pl->split_sizes[i], &sum)) return -1;
    }
    if (sum != extent) return -1;
    *off = pre;
    *size = pl->split_sizes[c];
    return 0;
  }
  int64_t chunk = rs_ceil_div_i64(extent, n);
  int64_t o = (int64_t)c * chunk;
  if (o > extent) o = extent;
  *off = o;
  *size = rs_min_i64(chunk, extent - o);
  return 0;
}

/* Starting box of a part before any mesh axis applies. For grouped
 * buffers the grouped dim counts groups. */
static void part_root_box(const reshard_layout_t *L, const rs_part *p, int G,
                          int cd, int64_t *vs, int64_t *ve) {
  const rs_tensor *t = &L->tensors[p->tensor];
  for (int d = 0; d < t->ndim; d++) {
    vs[d] = p->vstart[d];
    ve[d] = p->vshape[d];
  }
  if (G > 1) ve[cd] = G;
}

static reshard_result_t split_error(const reshard_layout_t *L,
                                    const rs_part *p, int a, int rank,
                                    int64_t extent) {
  const rs_tensor *t = &L->tensors[p->tensor];
  return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                  "tensor '%s' rank %d: split_sizes of mesh axis %d do not sum to the extent %lld of dim %d",
                  t->name, rank, a, (long long)extent, p->pl[a].dim);
}

/* The local virtual box of part p at mesh position pos. */
static reshard_result_t part_vbox(const reshard_layout_t *L, const rs_part *p,
                                  int G, int cd, int pos, int64_t *vs,
                                  int64_t *ve) {
  const rs_mesh *m = &L->meshes[p->mesh];
  int coord[RESHARD_MAX_MESH_DIMS];
  int rem = pos;
  for (int a = m->ndim - 1; a >= 0; a--) {
    coord[a] = rem % m->shape[a];
    rem /= m->shape[a];
  }
  part_root_box(L, p, G, cd, vs, ve);
  for (int a = 0; a < m->ndim; a++) {
    if (p->pl[a].kind != RESHARD_PLACEMENT_SHARD) continue;
    int d = p->pl[a].dim;
    int64_t off, size;
    if (split_piece(&p->pl[a], m->shape[a], coord[a], ve[d], &off, &size))
      return split_error(L, p, a, m->ranks[pos], ve[d]);
    vs[d] += off;
    ve[d] = size;
  }
  return RESHARD_SUCCESS;
}

typedef struct part_local {
  int present;
  int64_t vs[RESHARD_MAX_DIMS], ve[RESHARD_MAX_DIMS];
} part_local;

/* Does the fragment [s, s+e) intersect the query box? NULL query: yes. */
static int box_hits(int ndim, const int64_t *s, const int64_t *e,
                    const int64_t *qs, const int64_t *qe) {
  if (!qs) return 1;
  for (int d = 0; d < ndim; d++)
    if (s[d] >= qs[d] + qe[d] || qs[d] >= s[d] + e[d]) return 0;
  return 1;
}

static int box_empty(int ndim, const int64_t *e) {
  for (int d = 0; d < ndim; d++)
    if (e[d] <= 0) return 1;
  return 0;
}

/* Row-major element strides of a local buffer of the given shape, and its
 * byte size; overflow is an error naming the buffer and rank. */
static reshard_result_t dense_strides(const rs_buffer *buf, int rank, int ndim, const int64_t *shape, size_t es,
                                      int64_t *strides, uint64_t *bytes) {
  int64_t total = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = total;
    if (rs_mul_overflow_i64(total, shape[d], &total))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' rank %d: element count overflows", buf->name, rank);
  }
  int64_t total_bytes;
  if (rs_mul_overflow_i64(total, (int64_t)es, &total_bytes))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' rank %d: byte size overflows", buf->name, rank);
  *bytes = (uint64_t)total_bytes;
  return RESHARD_SUCCESS;
}

/* Lowers fused buffer b on rank: computes its byte size and, when out is
 * given, appends its non-empty fragments (only those of part only_part if
 * >= 0, only those hitting the query box if qs != NULL). */
static reshard_result_t lower_fused(const reshard_layout_t *L, int b,
                                    int rank, int only_part,
                                    const int64_t *qs, const int64_t *qe,
                                    rs_frag_vec *out, uint64_t *bytes_out) {
  const rs_buffer *buf = &L->buffers[b];
  const rs_part *parts = &L->parts[buf->first_part];
  const rs_tensor *t0 = &L->tensors[parts[0].tensor];
  const int ndim = t0->ndim, cd = buf->concat_dim, G = buf->num_groups;
  const size_t es = reshard_dtype_size(t0->dtype);
  part_local stack_loc[8];
  part_local *loc = buf->nparts <= 8 ? stack_loc : rs_malloc((size_t)buf->nparts * sizeof *loc);
  if (!loc) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "buffer '%s': out of memory", buf->name);
  reshard_result_t r = RESHARD_SUCCESS;
  int first = -1;
  int64_t shape[RESHARD_MAX_DIMS] = {0};
  int64_t block_sum = 0; /* grouped: sum of per-group blocks */
  for (int k = 0; k < buf->nparts; k++) {
    const rs_part *p = &parts[k];
    int pos = rs_mesh_position(&L->meshes[p->mesh], rank);
    loc[k].present = pos >= 0;
    if (G > 1 && rs_add_overflow_i64(block_sum, L->tensors[p->tensor].shape[cd] / G, &block_sum)) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' rank %d: size overflows", buf->name, rank);
      goto done;
    }
    if (pos < 0) continue;
    RS_CHECK_GOTO(part_vbox(L, p, G, cd, pos, loc[k].vs, loc[k].ve), r, done);
    if (first < 0) {
      first = k;
      memcpy(shape, loc[k].ve, sizeof(int64_t) * (size_t)ndim);
      if (ndim && G == 1) shape[cd] = 0;
    } else {
      for (int d = 0; d < ndim; d++) {
        int grouped = G > 1 && d == cd;
        if ((d != cd || grouped) && loc[k].ve[d] != loc[first].ve[d]) {
          r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                       "buffer '%s' rank %d: tensor '%s' has local extent %lld on dim %d but tensor '%s' has %lld; fused parts must agree off the concat dim",
                       buf->name, rank, L->tensors[p->tensor].name, (long long)loc[k].ve[d], d,
                       L->tensors[parts[first].tensor].name, (long long)loc[first].ve[d]);
          goto done;
        }
        if (grouped && loc[k].vs[d] != loc[first].vs[d]) {
          r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' rank %d: grouped parts hold different groups", buf->name, rank);
          goto done;
        }
      }
    }
    if (ndim && G == 1 && rs_add_overflow_i64(shape[cd], loc[k].ve[cd], &shape[cd])) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' rank %d: size overflows", buf->name, rank);
      goto done;
    }
  }
  if (first < 0) {
    if (bytes_out) *bytes_out = 0;
    goto done;
  }
  if (G > 1 && rs_mul_overflow_i64(loc[first].ve[cd], block_sum, &shape[cd])) {
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' rank %d: size overflows", buf->name, rank);
    goto done;
  }
  int64_t strides[RESHARD_MAX_DIMS];
  uint64_t total_bytes = 0;
  RS_CHECK_GOTO(dense_strides(buf, rank, ndim, shape, es, strides, &total_bytes), r, done);
  if (bytes_out) *bytes_out = total_bytes;
  if (!out) goto done;

  rs_frag f;
  memset(&f, 0, sizeof f);
  f.rank = rank;
  f.buffer = b;
  f.ndim = ndim;
  memcpy(f.strides, strides, sizeof strides);
  if (G == 1) {
    int64_t prefix = 0;
    for (int k = 0; k < buf->nparts; k++) {
      if (!loc[k].present) continue;
      const rs_tensor *t = &L->tensors[parts[k].tensor];
      for (int d = 0; d < ndim; d++) {
        f.start[d] = loc[k].vs[d];
        f.extent[d] = rs_max_i64(0, rs_min_i64(loc[k].vs[d] + loc[k].ve[d], t->shape[d]) - loc[k].vs[d]);
      }
      int64_t off = ndim ? prefix * strides[cd] : 0;
      if (ndim) prefix += loc[k].ve[cd];
      if ((only_part >= 0 && k != only_part) || box_empty(ndim, f.extent) ||
          !box_hits(ndim, f.start, f.extent, qs, qe))
        continue;
      f.tensor = parts[k].tensor;
      f.pos = k;
      f.byte_offset = (uint64_t)off * es;
      RS_CHECK_GOTO(rs_frag_vec_push(out, &f), r, done);
    }
  } else {
    int64_t g0 = loc[first].vs[cd], ng = loc[first].ve[cd];
    for (int64_t g = 0; g < ng; g++) {
      int64_t prefix = 0;
      for (int k = 0; k < buf->nparts; k++) {
        const rs_tensor *t = &L->tensors[parts[k].tensor];
        int64_t blk = t->shape[cd] / G;
        int64_t off = (g * block_sum + prefix) * strides[cd];
        prefix += blk;
        if (!loc[k].present || (only_part >= 0 && k != only_part)) continue;
        for (int d = 0; d < ndim; d++) {
          f.start[d] = loc[k].vs[d];
          f.extent[d] = rs_max_i64(0, rs_min_i64(loc[k].vs[d] + loc[k].ve[d], t->shape[d]) - loc[k].vs[d]);
        }
        f.start[cd] = (g0 + g) * blk;
        f.extent[cd] = blk;
        if (box_empty(ndim, f.extent) || !box_hits(ndim, f.start, f.extent, qs, qe)) continue;
        f.tensor = parts[k].tensor;
        f.pos = g * buf->nparts + k;
        f.byte_offset = (uint64_t)off * es;
        RS_CHECK_GOTO(rs_frag_vec_push(out, &f), r, done);
      }
    }
  }
done:
  if (loc != stack_loc) free(loc);
  return r;
}

static reshard_result_t lower_raw(const reshard_layout_t *L, int b,
                                  const int64_t *qs, const int64_t *qe,
                                  int only_tensor, rs_frag_vec *out) {
  const rs_buffer *buf = &L->buffers[b];
  for (int i = 0; i < buf->nraws; i++) {
    const rs_raw *raw = &L->raws[buf->raws[i]];
    const rs_tensor *t = &L->tensors[raw->tensor];
    if (only_tensor >= 0 && raw->tensor != only_tensor) continue;
    if (box_empty(t->ndim, raw->extent) || !box_hits(t->ndim, raw->start, raw->extent, qs, qe)) continue;
    rs_frag f;
    memset(&f, 0, sizeof f);
    f.tensor = raw->tensor;
    f.rank = buf->raw_rank;
    f.buffer = b;
    f.ndim = t->ndim;
    f.pos = i;
    memcpy(f.start, raw->start, sizeof f.start);
    memcpy(f.extent, raw->extent, sizeof f.extent);
    memcpy(f.strides, raw->strides, sizeof f.strides);
    f.byte_offset = raw->byte_offset;
    RS_CHECK(rs_frag_vec_push(out, &f));
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rs_layout_raw_fragments(const reshard_layout_t *L, int b,
                                         rs_frag_vec *out) {
  return lower_raw(L, b, NULL, NULL, -1, out);
}

unsigned char *rs_layout_rank_meshes(const reshard_layout_t *L, int rank) {
  unsigned char *in = rs_calloc((size_t)L->nmeshes + 1, 1);
  if (!in) {
    rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory (meshes of rank %d)", rank);
    return NULL;
  }
  for (int i = 0; i < L->nmeshes; i++) in[i] = rs_mesh_position(&L->meshes[i], rank) >= 0;
  return in;
}

int rs_layout_buffer_on_rank(const reshard_layout_t *L, int b, int rank, const unsigned char *in_mesh) {
  const rs_buffer *buf = &L->buffers[b];
  if (buf->kind == RS_BUFFER_RAW) return buf->raw_rank == rank;
  for (int k = 0; k < buf->nparts; k++)
    if (in_mesh[L->parts[buf->first_part + k].mesh]) return 1;
  return 0;
}

reshard_result_t rs_layout_each_rank_buffer(const reshard_layout_t *L, int rank, rs_rank_buffer_fn visit, void *arg) {
  /* which meshes hold the rank, once: a 100k-tensor layout has hundreds
   * of thousands of parts, most of them on other ranks */
  unsigned char *in_mesh = rs_layout_rank_meshes(L, rank);
  if (!in_mesh) return RESHARD_ERROR_OUT_OF_MEMORY;
  reshard_result_t r = RESHARD_SUCCESS;
  for (int b = 0; b < L->nbuffers && r == RESHARD_SUCCESS; b++)
    if (rs_layout_buffer_on_rank(L, b, rank, in_mesh)) r = visit(L, b, rank, arg);
  free(in_mesh);
  return r;
}

static reshard_result_t lower_rank_buffer(const reshard_layout_t *L, int b, int rank, void *out) {
  if (L->buffers[b].kind == RS_BUFFER_RAW) return lower_raw(L, b, NULL, NULL, -1, out);
  return lower_fused(L, b, rank, -1, NULL, NULL, out, NULL);
}

reshard_result_t rs_layout_rank_fragments(const reshard_layout_t *L, int rank,
                                          rs_frag_vec *out) {
  return rs_layout_each_rank_buffer(L, rank, lower_rank_buffer, out);
}

reshard_result_t rs_layout_buffer_bytes(const reshard_layout_t *L, int b,
                                        int rank, uint64_t *bytes) {
  const rs_buffer *buf = &L->buffers[b];
  if (buf->kind == RS_BUFFER_RAW) {
    *bytes = buf->raw_rank == rank ? buf->raw_bytes : 0;
    return RESHARD_SUCCESS;
  }
  return lower_fused(L, b, rank, -1, NULL, NULL, NULL, bytes);
}

/* ---- holders: walk the mesh axes, pruning shards that miss the box ---- */

typedef struct holder_walk {
  const reshard_layout_t *L;
  const rs_part *p;
  const rs_mesh *m;
  int G, cd;
  int64_t blk; /* grouped: elements per group of this part */
  const int64_t *qs, *qe;
  rs_lower_cache *cache;
  rs_frag_vec *out;
  int single; /* the buffer has this one part, ungrouped */
} holder_walk;

void rs_lower_cache_free(rs_lower_cache *c) {
  free(c->keys);
  free(c->first);
  free(c->count);
  rs_frag_vec_free(&c->frags);
  memset(c, 0, sizeof *c);
}

/* Bounds: the table grows to RS_LOWER_CACHE_SLOTS and holds at most
 * RS_LOWER_CACHE_FRAGS fragments (~28 MiB), then is emptied. A source rank
 * of DeepSeek-V3 (61 layers over 4 stages, 256 experts a layer in a window
 * each) touches ~17k (buffer, rank) pairs, destination rank by destination
 * rank. */
#define RS_LOWER_CACHE_SLOTS ((size_t)1 << 16)
#define RS_LOWER_CACHE_FRAGS ((size_t)1 << 17)

static size_t cache_slot(uint64_t key, size_t cap) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return (size_t)key & (cap - 1);
}

/* Resizes the (emptied, or to be rehashed) table to cap slots. */
static reshard_result_t cache_resize(rs_lower_cache *c, size_t cap) {
  uint64_t *keys = rs_calloc(cap, sizeof *keys);
  uint32_t *first = rs_malloc(cap * sizeof *first), *count = rs_malloc(cap * sizeof *count);
  if (!keys || !first || !count) {
    free(keys);
    free(first);
    free(count);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory (lowering cache of %zu)", cap);
  }
  for (size_t i = 0; i < c->cap; i++) {
    if (!c->keys[i]) continue;
    size_t j = cache_slot(c->keys[i], cap);
    while (keys[j]) j = (j + 1) & (cap - 1);
    keys[j] = c->keys[i];
    first[j] = c->first[i];
    count[j] = c->count[i];
  }
  free(c->keys);
  free(c->first);
  free(c->count);
  c->keys = keys;
  c->first = first;
  c->count = count;
  c->cap = cap;
  return RESHARD_SUCCESS;
}

/* The fragments of buffer b on rank, lowered once per cache fill. */
static reshard_result_t cached_lowering(const reshard_layout_t *L, rs_lower_cache *c, int b, int rank,
                                        const rs_frag **frags, size_t *nfrags) {
  if (!c->cap) RS_CHECK(cache_resize(c, 1024));
  uint64_t key = ((uint64_t)(uint32_t)b << 32 | (uint32_t)rank) + 1;
  size_t j = cache_slot(key, c->cap);
  for (; c->keys[j]; j = (j + 1) & (c->cap - 1))
    if (c->keys[j] == key) {
      *frags = c->frags.v + c->first[j];
      *nfrags = c->count[j];
      return RESHARD_SUCCESS;
    }
  if (c->frags.n >= RS_LOWER_CACHE_FRAGS || (c->n * 2 >= c->cap && c->cap >= RS_LOWER_CACHE_SLOTS)) {
    memset(c->keys, 0, c->cap * sizeof *c->keys);
    c->n = 0;
    c->frags.n = 0;
  } else if (c->n * 2 >= c->cap) {
    RS_CHECK(cache_resize(c, c->cap * 2));
  }
  for (j = cache_slot(key, c->cap); c->keys[j];) j = (j + 1) & (c->cap - 1);
  size_t first = c->frags.n;
  RS_CHECK(lower_fused(L, b, rank, -1, NULL, NULL, &c->frags, NULL));
  c->keys[j] = key;
  c->first[j] = (uint32_t)first;
  c->count[j] = (uint32_t)(c->frags.n - first);
  c->n++;
  *frags = c->frags.v + first;
  *nfrags = c->frags.n - first;
  return RESHARD_SUCCESS;
}

/* The fragment of a buffer with a single ungrouped part, whose local box
 * the walk has just computed: the same fragment lower_fused would produce
 * (the whole local buffer, dense, at offset 0), without lowering the
 * buffer again for every holder (replicated tensors have hundreds). */
static reshard_result_t single_part_frag(const holder_walk *w, int rank, const int64_t *vs, const int64_t *ve) {
  const rs_tensor *t = &w->L->tensors[w->p->tensor];
  const rs_buffer *buf = &w->L->buffers[w->p->buffer];
  rs_frag f;
  memset(&f, 0, sizeof f);
  uint64_t bytes;
  RS_CHECK(dense_strides(buf, rank, t->ndim, ve, reshard_dtype_size(t->dtype), f.strides, &bytes));
  for (int d = 0; d < t->ndim; d++) {
    f.start[d] = vs[d];
    f.extent[d] = rs_max_i64(0, rs_min_i64(vs[d] + ve[d], t->shape[d]) - vs[d]);
  }
  if (box_empty(t->ndim, f.extent) || !box_hits(t->ndim, f.start, f.extent, w->qs, w->qe)) return RESHARD_SUCCESS;
  f.tensor = w->p->tensor;
  f.rank = rank;
  f.buffer = w->p->buffer;
  f.ndim = t->ndim;
  return rs_frag_vec_push(w->out, &f);
}

static reshard_result_t walk_axes(holder_walk *w, int a, int pos, int64_t *vs,
                                  int64_t *ve) {
  const rs_mesh *m = w->m;
  if (a == m->ndim) {
    if (w->single) return single_part_frag(w, m->ranks[pos], vs, ve);
    if (!w->cache) return lower_fused(w->L, w->p->buffer, m->ranks[pos], w->p->index, w->qs, w->qe, w->out, NULL);
    const rs_frag *f;
    size_t n;
    RS_CHECK(cached_lowering(w->L, w->cache, w->p->buffer, m->ranks[pos], &f, &n));
    const int nparts = w->L->buffers[w->p->buffer].nparts;
    for (size_t i = 0; i < n; i++)
      if (f[i].pos % nparts == w->p->index && box_hits(f[i].ndim, f[i].start, f[i].extent, w->qs, w->qe))
        RS_CHECK(rs_frag_vec_push(w->out, &f[i]));
    return RESHARD_SUCCESS;
  }
  const reshard_placement_t *pl = &w->p->pl[a];
  int n = m->shape[a];
  if (pl->kind != RESHARD_PLACEMENT_SHARD) {
    for (int c = 0; c < n; c++) RS_CHECK(walk_axes(w, a + 1, pos * n + c, vs, ve));
    return RESHARD_SUCCESS;
  }
  int d = pl->dim;
  int64_t lo = w->qs[d], hi = w->qs[d] + w->qe[d];
  if (w->G > 1 && d == w->cd) { /* the grouped dim counts groups */
    lo = lo / w->blk;
    hi = rs_ceil_div_i64(hi, w->blk);
  }
  int64_t s0 = vs[d], e0 = ve[d];
  reshard_result_t r = RESHARD_SUCCESS;
  for (int c = 0; c < n && r == RESHARD_SUCCESS; c++) {
    int64_t off, size;
    if (split_piece(pl, n, c, e0, &off, &size)) {
      /* name the first rank whose piece is at fault, as lowering would */
      int first = pos;
      for (int b = a; b < m->ndim; b++) first *= m->shape[b];
      r = split_error(w->L, w->p, a, m->ranks[first], e0);
      break;
    }
    if (size <= 0 || s0 + off >= hi || s0 + off + size <= lo) continue;
    vs[d] = s0 + off;
    ve[d] = size;
    r = walk_axes(w, a + 1, pos * n + c, vs, ve);
  }
  vs[d] = s0;
  ve[d] = e0;
  return r;
}

reshard_result_t rs_layout_find_holders(const reshard_layout_t *L, int tensor,
                                        const int64_t *start,
                                        const int64_t *extent,
                                        rs_lower_cache *cache,
                                        rs_frag_vec *out) {
  const rs_tensor *t = &L->tensors[tensor];
  if (box_empty(t->ndim, extent)) return RESHARD_SUCCESS;
  for (int i = 0; i < t->nparts; i++) {
    const rs_part *p = &L->parts[t->parts[i]];
    const rs_buffer *buf = &L->buffers[p->buffer];
    holder_walk w = {L, p, &L->meshes[p->mesh], buf->num_groups, buf->concat_dim, 1, start, extent, cache, out,
                     buf->nparts == 1 && buf->num_groups == 1};
    if (w.G > 1) w.blk = t->shape[w.cd] / w.G;
    if (w.G > 1 && w.blk == 0) continue;
    int64_t vs[RESHARD_MAX_DIMS], ve[RESHARD_MAX_DIMS];
    part_root_box(L, p, w.G, w.cd, vs, ve);
    /* a window that misses the box holds none of it: the walk prunes only
     * sharded dims, and a stacked tensor has a window per expert */
    if (w.G == 1 && !box_hits(t->ndim, vs, ve, start, extent)) continue;
    RS_CHECK(walk_axes(&w, 0, 0, vs, ve));
  }
  for (int i = 0; i < t->nraws; i++) {
    const rs_raw *raw = &L->raws[t->raws[i]];
    (void)raw;
  }
  if (t->nraws) {
    /* Raw fragments are few in practice (escape hatch); scan their
     * buffers once each. */
    int last = -1;
    for (int i = 0; i < t->nraws; i++) {
      int b = L->raws[t->raws[i]].buffer;
      if (b == last) continue;
      last = b;
      RS_CHECK(lower_raw(L, b, start, extent, tensor, out));
    }
  }
  return RESHARD_SUCCESS;
}
