/* Plans with block-quantized destinations: the rewritten layouts and the
 * boxes each source rank quantizes (see quant.h). */
#include "plan/quant.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "layout/layout.h"
#include "pack/convert.h"
#include "plan/plan.h"
#include "transport/transport.h"

#define RENAMED_SUFFIX " (before quantization)"

/* A weight to quantize: its ids on both sides and its block grid. */
typedef struct qent {
  int s, t, tscale;   /* source tensor, destination weight and scales */
  int codes, scales;  /* their ids in the main source layout */
  int ndim;
  int64_t shape[RESHARD_MAX_DIMS];
  int64_t block[2];
  int64_t nlead, nbr, nbc;
  unsigned char *covered; /* per block: held whole by some source rank */
  unsigned char *needed;  /* per block: some destination rank holds part of it or its scale */
} qent;

/* A box some rank quantizes; b.in_buf -1: gathered first. */
typedef struct gbox {
  int rank;
  int ent;
  size_t order;
  rs_qbox b;
  uint64_t gather_off;
} gbox;

typedef struct gbox_vec {
  gbox *v;
  size_t n, cap;
} gbox_vec;

static int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); } /* a >= 0, no overflow */

static reshard_result_t push_box(gbox_vec *v, const gbox *g) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 64;
    gbox *p = rs_realloc(v->v, cap * sizeof *p);
    if (!p) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (quantization boxes)");
    v->v = p;
    v->cap = cap;
  }
  v->v[v->n] = *g;
  v->v[v->n].order = v->n;
  v->n++;
  return RESHARD_SUCCESS;
}

static int cmp_box(const void *a, const void *b) {
  const gbox *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  return (x->order > y->order) - (x->order < y->order);
}

/* Block (lead, bi, bj)'s flag. */
static unsigned char *flag(const qent *e, int64_t lead, int64_t bi, int64_t bj) {
  return &e->covered[(lead * e->nbr + bi) * e->nbc + bj];
}

/* Row-major index of a leading coordinate. */
static int64_t lead_index(const qent *e, const int64_t *idx) {
  int64_t l = 0;
  for (int d = 0; d < e->ndim - 2; d++) l = l * e->shape[d] + idx[d];
  return l;
}

/* The boxes of whole blocks inside fragment f of entry e (on f's rank):
 * the interior of f on the block grid of the last two dims. */
static reshard_result_t interior(qent *e, int ei, const rs_frag *f, reshard_dtype_t sdt, gbox_vec *out) {
  const int nd = e->ndim;
  gbox g;
  memset(&g, 0, sizeof g);
  g.rank = f->rank;
  g.ent = ei;
  g.b.ndim = nd;
  g.b.in_dtype = sdt;
  g.b.in_buf = f->buffer;
  g.b.tensor = e->t;
  g.b.block[0] = e->block[0];
  g.b.block[1] = e->block[1];
  for (int d = 0; d < nd; d++) {
    int64_t lo = f->start[d], hi = f->start[d] + f->extent[d];
    if (d >= nd - 2) {
      const int64_t bs = e->block[d - (nd - 2)];
      lo = cdiv(lo, bs) * bs;
      if (hi != e->shape[d]) hi = hi / bs * bs;
    }
    if (hi <= lo) return RESHARD_SUCCESS;
    g.b.start[d] = lo;
    g.b.extent[d] = hi - lo;
    g.b.in_stride[d] = f->strides[d];
  }
  int64_t off = 0;
  for (int d = 0; d < nd; d++) off += (g.b.start[d] - f->start[d]) * f->strides[d];
  g.b.in_off = f->byte_offset + (uint64_t)(off * (int64_t)reshard_dtype_size(sdt));
  /* mark its blocks */
  int64_t idx[RESHARD_MAX_DIMS] = {0};
  for (;;) {
    int64_t lc[RESHARD_MAX_DIMS];
    for (int d = 0; d < nd - 2; d++) lc[d] = g.b.start[d] + idx[d];
    const int64_t l = lead_index(e, lc);
    const int64_t b0 = g.b.start[nd - 2] / e->block[0], b1 = g.b.start[nd - 1] / e->block[1];
    const int64_t n0 = cdiv(g.b.extent[nd - 2], e->block[0]), n1 = cdiv(g.b.extent[nd - 1], e->block[1]);
    for (int64_t i = 0; i < n0; i++)
      for (int64_t j = 0; j < n1; j++) *flag(e, l, b0 + i, b1 + j) = 1;
    int d = nd - 3;
    while (d >= 0 && ++idx[d] == g.b.extent[d]) idx[d--] = 0;
    if (d < 0) break;
  }
  return push_box(out, &g);
}

/* Marks the blocks a destination fragment of the weight (scale 0) or of
 * its scales (scale 1: coordinates are blocks) needs. */
static void mark_needed(qent *e, const rs_frag *f, int scale) {
  const int nd = e->ndim;
  int64_t idx[RESHARD_MAX_DIMS] = {0};
  int64_t lo[2], hi[2];
  for (int k = 0; k < 2; k++) {
    const int d = nd - 2 + k;
    lo[k] = scale ? f->start[d] : f->start[d] / e->block[k];
    hi[k] = scale ? f->start[d] + f->extent[d] : (f->start[d] + f->extent[d] - 1) / e->block[k] + 1;
  }
  for (;;) {
    int64_t lc[RESHARD_MAX_DIMS];
    for (int d = 0; d < nd - 2; d++) lc[d] = f->start[d] + idx[d];
    const int64_t l = lead_index(e, lc);
    for (int64_t i = lo[0]; i < hi[0]; i++)
      for (int64_t j = lo[1]; j < hi[1]; j++) e->needed[(l * e->nbr + i) * e->nbc + j] = 1;
    int d = nd - 3;
    while (d >= 0 && ++idx[d] == f->extent[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

/* Blocks no source rank holds whole: each is gathered to the rank that
 * holds most of it (ties: the lowest rank) and quantized there. */
static reshard_result_t split_blocks(const reshard_layout_t *src, qent *e, int ei, reshard_dtype_t sdt,
                                     gbox_vec *out) {
  const int nd = e->ndim;
  reshard_result_t r = RESHARD_SUCCESS;
  rs_frag_vec hv = {0};
  rs_lower_cache cache;
  memset(&cache, 0, sizeof cache);
  for (int64_t l = 0; l < e->nlead && !r; l++)
    for (int64_t bi = 0; bi < e->nbr && !r; bi++)
      for (int64_t bj = 0; bj < e->nbc && !r; bj++) {
        const int64_t k = (l * e->nbr + bi) * e->nbc + bj;
        if (e->covered[k] || !e->needed[k]) continue; /* quantized whole, or received by nobody */
        gbox g;
        memset(&g, 0, sizeof g);
        g.ent = ei;
        g.b.ndim = nd;
        g.b.in_dtype = sdt;
        g.b.in_buf = -1;
        g.b.tensor = e->t;
        g.b.block[0] = e->block[0];
        g.b.block[1] = e->block[1];
        int64_t rest = l;
        for (int d = nd - 3; d >= 0; d--) {
          g.b.start[d] = rest % e->shape[d];
          rest /= e->shape[d];
          g.b.extent[d] = 1;
        }
        for (int k = 0; k < 2; k++) {
          const int d = nd - 2 + k;
          const int64_t b = k ? bj : bi;
          g.b.start[d] = b * e->block[k];
          const int64_t end = g.b.start[d] + e->block[k];
          g.b.extent[d] = (end < e->shape[d] ? end : e->shape[d]) - g.b.start[d];
        }
        hv.n = 0;
        r = rs_layout_find_holders(src, e->s, g.b.start, g.b.extent, &cache, &hv);
        if (r) break;
        /* the holder with the most of it */
        int best = -1;
        int64_t best_n = 0;
        for (size_t i = 0; i < hv.n; i++) {
          int64_t n = 0;
          for (size_t j = 0; j < hv.n; j++) {
            if (hv.v[j].rank != hv.v[i].rank) continue;
            int64_t v = 1;
            for (int d = 0; d < nd; d++) {
              int64_t lo = hv.v[j].start[d] > g.b.start[d] ? hv.v[j].start[d] : g.b.start[d];
              int64_t a = hv.v[j].start[d] + hv.v[j].extent[d], b = g.b.start[d] + g.b.extent[d];
              int64_t hi = a < b ? a : b;
              v *= hi > lo ? hi - lo : 0;
            }
            n += v;
          }
          if (n > best_n || (n == best_n && best >= 0 && hv.v[i].rank < best)) best = hv.v[i].rank, best_n = n;
        }
        if (best < 0) {
          r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                       "tensor '%s': no source rank holds any of its block starting at row %lld, column %lld, so "
                       "the block cannot be quantized",
                       src->tensors[e->s].name, (long long)g.b.start[nd - 2], (long long)g.b.start[nd - 1]);
          break;
        }
        g.rank = best;
        r = push_box(out, &g);
      }
  rs_frag_vec_free(&hv);
  rs_lower_cache_free(&cache);
  return r;
}

/* The weights to quantize, or an error naming the one that cannot be. */
static void free_entries(qent *e, int n) {
  for (int i = 0; i < n; i++) free(e[i].covered), free(e[i].needed);
  free(e);
}

static reshard_result_t find_entries(const reshard_layout_t *src, const reshard_layout_t *dst, qent **out,
                                     int *nout) {
  qent *e = NULL;
  int n = 0;
  reshard_result_t r = RESHARD_SUCCESS;
  for (int t = 0; t < dst->ntensors; t++) {
    const rs_tensor *T = &dst->tensors[t];
    if (!T->block[0]) continue;
    int s;
    if (reshard_layout_find_tensor(src, T->name, &s) != RESHARD_SUCCESS) {
      rs_error_clear(); /* plan creation names the missing tensor */
      continue;
    }
    const rs_tensor *S = &src->tensors[s];
    if (S->block[0]) {
      if (S->block[0] != T->block[0] || S->block[1] != T->block[1] || S->dtype != T->dtype) {
        r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                        "tensor '%s': fp8 blocks of %d x %d on the source side, %d x %d on the destination side "
                        "(re-quantizing between block sizes is not supported)",
                        T->name, S->block[0], S->block[1], T->block[0], T->block[1]);
        break;
      }
      continue; /* codes and scales move as they are */
    }
    if (S->dtype != RESHARD_FP32 && S->dtype != RESHARD_BF16 && S->dtype != RESHARD_FP16) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "tensor '%s': the destination quantizes it to fp8 blocks, but its source dtype is %s (a "
                      "source must be f32, bf16 or f16, or fp8e4m3 declared with the same blocks)",
                      T->name, reshard_dtype_name(S->dtype));
      break;
    }
    int same = S->ndim == T->ndim;
    for (int d = 0; same && d < T->ndim; d++) same = S->shape[d] == T->shape[d];
    if (!same) continue; /* plan creation names the shapes */
    const char *sname = dst->tensors[T->scale_id].name;
    int other;
    if (reshard_layout_find_tensor(src, sname, &other) == RESHARD_SUCCESS) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "tensor '%s': the source layout declares it, but not its weight '%s' as blocked fp8 "
                      "(reshard_layout_add_tensor_blocked on both sides, or a wider weight without scales)",
                      sname, T->name);
      break;
    }
    rs_error_clear();
    qent *p = rs_realloc(e, (size_t)(n + 1) * sizeof *e);
    if (!p) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
      break;
    }
    e = p;
    qent *q = &e[n];
    memset(q, 0, sizeof *q);
    q->s = s, q->t = t, q->tscale = T->scale_id;
    q->ndim = T->ndim;
    for (int d = 0; d < T->ndim; d++) q->shape[d] = T->shape[d];
    q->block[0] = T->block[0], q->block[1] = T->block[1];
    q->nlead = 1;
    for (int d = 0; d < T->ndim - 2; d++) q->nlead *= T->shape[d];
    q->nbr = cdiv(T->shape[T->ndim - 2], q->block[0]);
    q->nbc = cdiv(T->shape[T->ndim - 1], q->block[1]);
    q->covered = rs_calloc((size_t)(q->nlead * q->nbr * q->nbc) + 1, 1);
    q->needed = rs_calloc((size_t)(q->nlead * q->nbr * q->nbc) + 1, 1);
    n++;
    if (!q->covered || !q->needed) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (block grid of '%s')", T->name);
      break;
    }
  }
  if (r) {
    free_entries(e, n);
    return r;
  }
  *out = e;
  *nout = n;
  return RESHARD_SUCCESS;
}

/* Adds this rank group's scratch buffers and fragments to the main source
 * (codes, scales) and the gather layout; records offsets in the boxes. */
static reshard_result_t add_rank(rs_quant_layouts *q, const reshard_layout_t *src, qent *e, gbox *g, size_t n,
                                 int me) {
  const int rank = g[0].rank;
  uint64_t codes = 0, scales = 0, gather = 0;
  for (size_t i = 0; i < n; i++) {
    g[i].b.code_off = codes;
    g[i].b.scale_off = scales;
    codes += (uint64_t)rs_qbox_elems(&g[i].b);
    scales += 4 * (uint64_t)rs_qbox_blocks(&g[i].b);
    if (g[i].b.in_buf < 0) {
      gather = (gather + 7) / 8 * 8;
      g[i].gather_off = gather;
      gather += (uint64_t)rs_qbox_elems(&g[i].b) * reshard_dtype_size(g[i].b.in_dtype);
    }
  }
  int cb, sb, gb = -1;
  RS_CHECK(reshard_layout_add_buffer(q->src, "reshard.quant.codes", rank, codes, &cb));
  RS_CHECK(reshard_layout_add_buffer(q->src, "reshard.quant.scales", rank, scales, &sb));
  if (gather) RS_CHECK(reshard_layout_add_buffer(q->gather, "reshard.quant.gather", rank, gather, &gb));
  for (size_t i = 0; i < n; i++) {
    const qent *E = &e[g[i].ent];
    const rs_qbox *b = &g[i].b;
    const int nd = b->ndim;
    reshard_fragment_t f = {E->codes, cb, b->start, b->extent, b->code_off, NULL};
    RS_CHECK(reshard_layout_add_fragment(q->src, &f));
    int64_t ss[RESHARD_MAX_DIMS], se[RESHARD_MAX_DIMS];
    for (int d = 0; d < nd; d++) ss[d] = b->start[d], se[d] = b->extent[d];
    for (int k = 0; k < 2; k++) {
      ss[nd - 2 + k] = b->start[nd - 2 + k] / b->block[k];
      se[nd - 2 + k] = cdiv(b->extent[nd - 2 + k], b->block[k]);
    }
    reshard_fragment_t fs = {E->scales, sb, ss, se, b->scale_off, NULL};
    RS_CHECK(reshard_layout_add_fragment(q->src, &fs));
    if (b->in_buf < 0) {
      reshard_fragment_t fg = {E->s, gb, b->start, b->extent, g[i].gather_off, NULL};
      RS_CHECK(reshard_layout_add_fragment(q->gather, &fg));
    }
  }
  if (rank != me) return RESHARD_SUCCESS;
  q->boxes = rs_malloc((n + 1) * sizeof *q->boxes);
  if (!q->boxes) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (size_t i = 0; i < n; i++) {
    rs_qbox *b = &q->boxes[i];
    *b = g[i].b;
    if (b->in_buf < 0) { /* read from the gather scratch, dense */
      b->in_off = g[i].gather_off;
      int64_t st = 1;
      for (int d = b->ndim - 1; d >= 0; d--) b->in_stride[d] = st, st *= b->extent[d];
    }
  }
  q->nboxes = n;
  q->codes_buf = cb, q->scales_buf = sb, q->gather_buf = gb;
  q->codes_bytes = codes, q->scales_bytes = scales, q->gather_bytes = gather;
  (void)src;
  return RESHARD_SUCCESS;
}

/* The main source: the caller's with the weights renamed and the fp8
 * weights and scales declared; the main destination: the caller's with
 * the renamed weights declared, partial and held nowhere. */
static reshard_result_t rewrite(rs_quant_layouts *q, const reshard_layout_t *src, const reshard_layout_t *dst,
                                qent *e, int n) {
  RS_CHECK(rs_layout_clone(src, &q->src));
  RS_CHECK(rs_layout_clone(dst, &q->dst));
  int *ids = rs_malloc(((size_t)n + 1) * sizeof *ids);
  char **names = rs_calloc((size_t)n + 1, sizeof *names);
  reshard_result_t r = ids && names ? RESHARD_SUCCESS : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  int k = 0;
  for (; !r && k < n; k++) {
    const char *nm = src->tensors[e[k].s].name;
    size_t len = strlen(nm);
    names[k] = rs_malloc(len + sizeof RENAMED_SUFFIX);
    if (!names[k]) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
      break;
    }
    memcpy(names[k], nm, len);
    memcpy(names[k] + len, RENAMED_SUFFIX, sizeof RENAMED_SUFFIX);
    ids[k] = e[k].s;
    int other;
    if (reshard_layout_find_tensor(dst, names[k], &other) == RESHARD_SUCCESS) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': the destination declares it, and reshard uses that "
                   "name for the source's weight before quantization", names[k]);
      k++;
      break;
    }
    rs_error_clear();
  }
  if (r) {
    for (int i = 0; i < k; i++) free(names[i]);
  } else {
    r = rs_layout_rename_tensors(q->src, (size_t)n, ids, names);
  }
  for (int i = 0; !r && i < n; i++) {
    const rs_tensor *S = &src->tensors[e[i].s], *T = &dst->tensors[e[i].t], *SC = &dst->tensors[e[i].tscale];
    int hid;
    r = reshard_layout_add_tensor(q->src, T->name, T->dtype, T->ndim, T->shape, &e[i].codes);
    if (!r) r = reshard_layout_add_tensor(q->src, SC->name, SC->dtype, SC->ndim, SC->shape, &e[i].scales);
    /* partial: they hold the blocks the destination needs (what it needs
     * and nobody holds, plan creation names) */
    if (!r) r = reshard_layout_allow_partial(q->src, e[i].codes);
    if (!r) r = reshard_layout_allow_partial(q->src, e[i].scales);
    if (!r) { /* blocked like the destination's: planning the rewritten
               * layouts again moves codes and scales as they are */
      rs_tensor *C = &q->src->tensors[e[i].codes];
      C->block[0] = T->block[0], C->block[1] = T->block[1], C->scale_id = e[i].scales;
    }
    if (!r) r = reshard_layout_add_tensor(q->dst, q->src->tensors[e[i].s].name, S->dtype, S->ndim, S->shape, &hid);
    if (!r) r = reshard_layout_allow_partial(q->dst, hid);
  }
  free(ids);
  free(names);
  return r;
}

reshard_result_t rs_quant_layouts_make(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks, int me,
                                       rs_quant_layouts *out) {
  memset(out, 0, sizeof *out);
  out->codes_buf = out->scales_buf = out->gather_buf = -1;
  if (!src || !dst) return RESHARD_SUCCESS; /* plan creation says what is missing */
  qent *e = NULL;
  int n = 0;
  RS_CHECK(find_entries(src, dst, &e, &n));
  if (!n) return RESHARD_SUCCESS;
  reshard_result_t r = RESHARD_SUCCESS;
  int *qidx = rs_malloc(((size_t)src->ntensors + 1) * sizeof *qidx);
  gbox_vec boxes = {0};
  rs_frag_vec fv = {0};
  if (!qidx) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (int i = 0; !r && i < src->ntensors; i++) qidx[i] = -1;
  for (int i = 0; !r && i < n; i++) qidx[e[i].s] = i;
  /* whole blocks: every source fragment's interior, on its rank */
  for (int rk = 0; !r && rk < nranks; rk++) {
    fv.n = 0;
    r = rs_layout_rank_fragments(src, rk, &fv);
    for (size_t i = 0; !r && i < fv.n; i++) {
      const int ei = qidx[fv.v[i].tensor];
      if (ei >= 0) r = interior(&e[ei], ei, &fv.v[i], src->tensors[fv.v[i].tensor].dtype, &boxes);
    }
  }
  size_t whole = boxes.n;
  /* the blocks split across source ranks that a destination rank needs
   * (a partial destination need not cover them all) */
  int split = 0;
  for (int i = 0; i < n && !split; i++)
    for (int64_t k = 0; k < e[i].nlead * e[i].nbr * e[i].nbc && !split; k++) split = !e[i].covered[k];
  /* destination tensor -> 2 x its entry (+1: the entry's scales), or -1 */
  int *dmap = split ? rs_malloc(((size_t)dst->ntensors + 1) * sizeof *dmap) : NULL;
  if (split && !dmap && !r) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (int i = 0; dmap && i < dst->ntensors; i++) dmap[i] = -1;
  for (int k = 0; dmap && k < n; k++) dmap[e[k].t] = 2 * k, dmap[e[k].tscale] = 2 * k + 1;
  for (int rk = 0; !r && split && rk < nranks; rk++) {
    fv.n = 0;
    r = rs_layout_rank_fragments(dst, rk, &fv);
    for (size_t i = 0; !r && i < fv.n; i++) {
      const int m = dmap[fv.v[i].tensor];
      if (m >= 0) mark_needed(&e[m / 2], &fv.v[i], m % 2);
    }
  }
  free(dmap);
  for (int i = 0; !r && i < n; i++) r = split_blocks(src, &e[i], i, src->tensors[e[i].s].dtype, &boxes);
  if (!r) r = rewrite(out, src, dst, e, n);
  if (!r && boxes.n > whole) r = rs_layout_tensors_only(src, &out->gather);
  if (!r && boxes.n) qsort(boxes.v, boxes.n, sizeof *boxes.v, cmp_box); /* qsort(NULL, 0) is UB */
  for (size_t i = 0; !r && i < boxes.n;) {
    size_t j = i;
    while (j < boxes.n && boxes.v[j].rank == boxes.v[i].rank) j++;
    r = add_rank(out, src, e, boxes.v + i, j - i, me);
    i = j;
  }
  free_entries(e, n);
  free(qidx);
  free(boxes.v);
  rs_frag_vec_free(&fv);
  if (r) rs_quant_layouts_free(out);
  return r;
}

void rs_quant_layouts_free(rs_quant_layouts *q) {
  if (!q) return;
  reshard_layout_destroy(q->src);
  reshard_layout_destroy(q->dst);
  reshard_layout_destroy(q->gather);
  free(q->boxes);
  memset(q, 0, sizeof *q);
  q->codes_buf = q->scales_buf = q->gather_buf = -1;
}

reshard_result_t rs_quant_create(rs_quant_layouts *ql, const reshard_layout_t *user_src, reshard_comm_t *comm,
                                 const rs_executor *ex,
                                 int64_t timeout_ms, rs_quant **out) {
  *out = NULL;
  const int me = comm->rank;
  rs_quant *q = rs_calloc(1, sizeof *q);
  if (!q) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  q->user_nsrc = user_src->nbuffers;
  q->pre_ndst = ql->gather ? ql->gather->nbuffers : 0;
  q->boxes = ql->boxes, q->nboxes = ql->nboxes;
  ql->boxes = NULL, ql->nboxes = 0;
  q->codes_buf = ql->codes_buf, q->scales_buf = ql->scales_buf, q->gather_buf = ql->gather_buf;
  q->codes_bytes = ql->codes_bytes, q->scales_bytes = ql->scales_bytes, q->gather_bytes = ql->gather_bytes;
  reshard_result_t r = RESHARD_SUCCESS;
  if (!ex->stream_ordered) { /* (the device executor allocates below, with the boxes) */
    if (q->codes_bytes && !(q->codes = rs_bulk_malloc(q->codes_bytes))) r = RESHARD_ERROR_OUT_OF_MEMORY;
    if (q->scales_bytes && !(q->scales = rs_bulk_malloc(q->scales_bytes))) r = RESHARD_ERROR_OUT_OF_MEMORY;
    if (q->gather_bytes && !(q->gather = rs_bulk_malloc(q->gather_bytes))) r = RESHARD_ERROR_OUT_OF_MEMORY;
  }
  /* the caller's buffers the boxes read, and how much of each */
  q->in_bufs = rs_malloc((q->nboxes + 1) * sizeof *q->in_bufs);
  q->in_need = rs_malloc((q->nboxes + 1) * sizeof *q->in_need);
  if (!q->in_bufs || !q->in_need) r = RESHARD_ERROR_OUT_OF_MEMORY;
  for (size_t i = 0; !r && i < q->nboxes; i++) {
    const int b = q->boxes[i].in_buf;
    if (b < 0) continue;
    size_t k = 0;
    while (k < q->nin && q->in_bufs[k] != b) k++;
    if (k == q->nin) {
      uint64_t bytes = 0;
      r = rs_layout_buffer_bytes(user_src, b, me, &bytes);
      q->in_bufs[q->nin] = b;
      q->in_need[q->nin++] = bytes;
    }
  }
  if (r == RESHARD_ERROR_OUT_OF_MEMORY)
    r = rs_error(r, "plan_create rank %d: out of memory for the quantization scratch (%zu + %zu + %zu bytes)", me,
                 ql->codes_bytes, ql->scales_bytes, ql->gather_bytes);
  if (!r && ex->stream_ordered) {
    if (!ex->quant_prepare)
      r = rs_error(RESHARD_ERROR_UNSUPPORTED, "plan_create rank %d: the destination quantizes weights to fp8 blocks, "
                   "which the %s transport cannot run", me, comm->ops->name);
    else
      r = ex->quant_prepare(comm, q, timeout_ms);
  }
  if (r) {
    rs_quant_free(q);
    return r;
  }
  *out = q;
  return RESHARD_SUCCESS;
}

void rs_quant_free(rs_quant *q) {
  if (!q) return;
  free(q->boxes);
  if (q->dev_free) {
    q->dev_free(q);
  } else {
    rs_bulk_free(q->codes);
    rs_bulk_free(q->scales);
    rs_bulk_free(q->gather);
  }
  free(q->in_bufs);
  free(q->in_need);
  free(q);
}
