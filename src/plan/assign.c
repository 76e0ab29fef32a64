/* Replica choice: which source rank provides which part of a destination
 * fragment. Splitting every cell evenly across all ranks that hold it
 * balances the source ranks' egress without any communication, because
 * sender and receiver both run this same function on the same global
 * description. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/sorted.h"
#include "common/vec.h"
#include "plan/plan.h"

void rs_piece_vec_free(rs_piece_vec *vec) {
  free(vec->v);
  vec->v = NULL;
  vec->n = vec->cap = 0;
}

void rs_assign_ctx_free(rs_assign_ctx *ctx) {
  rs_frag_vec_free(&ctx->holders);
  rs_lower_cache_free(&ctx->lowered);
  free(ctx->bounds);
  free(ctx->cands);
  free(ctx->bucket_at);
  free(ctx->bucket);
  free(ctx->marks);
  rs_frag_vec_free(&ctx->tix);
  ctx->tix_valid = 0;
  ctx->prep_valid = 0;
  ctx->bounds = NULL;
  ctx->cands = NULL;
  ctx->bucket_at = ctx->bucket = NULL;
  ctx->marks = NULL;
  ctx->bounds_cap = ctx->cands_cap = ctx->bucket_at_cap = ctx->bucket_cap = ctx->marks_cap = 0;
}

/* Sorts and dedups the n boundaries b[0..n) of [lo, hi] (all inside it):
 * by marking them when the range is small against n (a stacked tensor's
 * windows give one boundary per expert), by qsort otherwise. Returns the
 * count left. */
static size_t sort_bounds(rs_assign_ctx *ctx, int64_t *b, size_t n, int64_t lo, int64_t hi) {
  uint64_t range = (uint64_t)(hi - lo) + 1;
  if (n > 16 && range <= 8 * (uint64_t)n) {
    if (range > ctx->marks_cap) {
      unsigned char *m = rs_malloc(range);
      if (m) {
        free(ctx->marks);
        ctx->marks = m;
        ctx->marks_cap = range;
      }
    }
    if (range <= ctx->marks_cap) {
      memset(ctx->marks, 0, range);
      for (size_t i = 0; i < n; i++) ctx->marks[b[i] - lo] = 1;
      size_t u = 0;
      for (uint64_t x = 0; x < range; x++)
        if (ctx->marks[x]) b[u++] = lo + (int64_t)x;
      return u;
    }
  }
  if (n > 2) qsort(b, n, sizeof *b, rs_cmp_i64);
  size_t u = 0;
  for (size_t i = 0; i < n; i++)
    if (u == 0 || b[i] != b[u - 1]) b[u++] = b[i];
  return u;
}

static int grow_ints(int **v, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  free(*v);
  *cap = need * 2;
  *v = rs_malloc(*cap * sizeof **v);
  if (!*v) *cap = 0;
  return *v ? 0 : -1;
}

/* Buckets the holders (in canonical order) by the intervals of dim 0 they
 * cover: the cells of interval k have their holders among bucket
 * [bucket_at[k], bucket_at[k+1]), still in canonical order. A stacked
 * tensor held in one window per expert then costs a cell its expert's few
 * holders instead of all of them. */
static reshard_result_t bucket_holders(rs_assign_ctx *ctx, const rs_frag *H, const int *order, size_t nh,
                                       const int64_t *b0, size_t nb0, const char *name) {
  size_t nint = nb0 - 1, total = 0;
  if (grow_ints(&ctx->bucket_at, &ctx->bucket_at_cap, nint + 1))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory planning tensor '%s'", name);
  int *at = ctx->bucket_at;
  memset(at, 0, (nint + 1) * sizeof *at);
  /* interval k is [b0[k], b0[k+1]); a holder covers those from the first
   * that starts at or after its start (the bounds include it, clipped)
   * until its end */
  for (int pass = 0; pass < 2; pass++) {
    int *fill = ctx->cands + 5 * (nh + 1);
    if (pass) memcpy(fill, at, nint * sizeof *fill);
    for (size_t j = 0; j < nh; j++) {
      const rs_frag *h = &H[order[j]];
      const int64_t end = h->start[0] + h->extent[0];
      /* from the first interval with b0[k] >= h's start */
      for (size_t k = rs_lower_bound_i64(b0, nint, h->start[0]); k < nint && b0[k] < end; k++) {
        if (pass) ctx->bucket[fill[k]++] = order[j];
        else at[k + 1]++, total++;
      }
    }
    if (!pass) {
      for (size_t k = 0; k < nint; k++) at[k + 1] += at[k];
      if (grow_ints(&ctx->bucket, &ctx->bucket_cap, total + 1))
        return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory planning tensor '%s'", name);
    }
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t piece_push(rs_piece_vec *vec, const rs_piece *p) {
  if (RS_VEC_GROW(vec->v, vec->n, vec->cap))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory assigning pieces");
  vec->v[vec->n++] = *p;
  return RESHARD_SUCCESS;
}

/* Appends the boxes that make up elements [a, b) of the row-major cell
 * (start cs, extent ce): at most 2*nd boxes, each a run of whole blocks at
 * the outermost level the range allows. */
static reshard_result_t push_range(rs_piece_vec *out, rs_piece *p, int nd,
                                   const int64_t *cs, const int64_t *ce,
                                   int64_t a, int64_t b) {
  int64_t block[RESHARD_MAX_DIMS]; /* elements in one index step of dim d */
  int64_t acc = 1;
  for (int d = nd - 1; d >= 0; d--) {
    block[d] = acc;
    acc *= ce[d];
  }
  if (nd == 0) return a < b ? piece_push(out, p) : RESHARD_SUCCESS;
  while (a < b) {
    int d = 0;
    while (d < nd - 1 && (a % block[d] != 0 || a + block[d] > b)) d++;
    int64_t idx = (a / block[d]) % ce[d];
    int64_t count = rs_min_i64((b - a) / block[d], ce[d] - idx);
    int64_t rem = a;
    for (int j = 0; j < nd; j++) {
      int64_t coord = (rem / block[j]) % ce[j];
      if (j < d) {
        p->start[j] = cs[j] + coord;
        p->extent[j] = 1;
      } else if (j == d) {
        p->start[j] = cs[j] + coord;
        p->extent[j] = count;
      } else {
        p->start[j] = cs[j];
        p->extent[j] = ce[j];
      }
    }
    RS_CHECK(piece_push(out, p));
    a += count * block[d];
  }
  return RESHARD_SUCCESS;
}

uint64_t rs_frag_offset_of(const rs_frag *f, const int64_t *start,
                           size_t esize) {
  int64_t off = (int64_t)f->byte_offset;
  for (int d = 0; d < f->ndim; d++)
    off += (start[d] - f->start[d]) * f->strides[d] * (int64_t)esize;
  return (uint64_t)off;
}

/* Canonical order of holders: rank, then buffer, then position. */
static int frag_before(const rs_frag *a, const rs_frag *b) {
  if (a->rank != b->rank) return a->rank < b->rank;
  if (a->buffer != b->buffer) return a->buffer < b->buffer;
  return a->pos < b->pos;
}

/* Stable merge sort of holder indices into canonical order (holders come
 * mostly sorted, one run per part, so runs already in order are kept). */
static void sort_canonical(const rs_frag *H, int *idx, int *tmp, size_t n) {
  for (size_t w = 1; w < n; w *= 2) {
    for (size_t lo = 0; lo + w < n; lo += 2 * w) {
      size_t mid = lo + w, hi = lo + 2 * w < n ? lo + 2 * w : n;
      if (!frag_before(&H[idx[mid]], &H[idx[mid - 1]])) continue; /* in order */
      size_t a = lo, b = mid, k = 0;
      while (a < mid && b < hi) tmp[k++] = frag_before(&H[idx[b]], &H[idx[a]]) ? idx[b++] : idx[a++];
      while (a < mid) tmp[k++] = idx[a++];
      while (b < hi) tmp[k++] = idx[b++];
      memcpy(idx + lo, tmp, k * sizeof *idx);
    }
  }
}

static void format_box(char *buf, size_t n, int ndim, const int64_t *s,
                       const int64_t *e) {
  size_t used = 0;
  used += (size_t)snprintf(buf + used, n - used, "[");
  for (int d = 0; d < ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld:%lld", d ? ", " : "",
                             (long long)s[d], (long long)(s[d] + e[d]));
  if (used < n) snprintf(buf + used, n - used, "]");
}

/* Narrows the holders c[0..nc) of a cell to those in the receiver's NVLink
 * domain when there are any (NVLink is several times faster than the
 * network); out needs nc entries. Sender and receiver share the rank map,
 * so they narrow identically. */
static int prefer_domain(const rs_assign_ctx *ctx, const rs_frag *H,
                         const int *c, int nc, int receiver, int *out) {
  if (!ctx->domain) return 0;
  int n = 0;
  for (int k = 0; k < nc; k++)
    if (ctx->domain[H[c[k]].rank] == ctx->domain[receiver]) out[n++] = c[k];
  return n;
}

/* Source-side spreading (src/plan/spread.h): a cell that plan creation
 * copied from its origin rank to scratch on another rank of the origin's
 * NVLink domain has both as holders. The copy serves receivers outside
 * that domain (it exists because the origin's NIC bounded the plan), the
 * origin those inside it. Writes the holders left to out (nc entries)
 * and returns their count; 0: no copy among them, nothing narrowed. */
static int spread_narrow(const rs_assign_ctx *ctx, const rs_frag *H, const int *c, int nc, int receiver, int *out) {
  if (!ctx->spread || !ctx->domain) return 0;
  const rs_buffer *B = ctx->src->buffers;
  int origin = -1;
  for (int k = 0; k < nc && origin < 0; k++) origin = B[H[c[k]].buffer].spread_origin - 1;
  if (origin < 0) return 0;
  const int outside = ctx->domain[origin] != ctx->domain[receiver];
  int n = 0;
  for (int k = 0; k < nc; k++)
    if ((B[H[c[k]].buffer].spread_origin != 0) == outside) out[n++] = c[k];
  return n;
}

/* Whether fragment f meets the box [qs, qs + qe) (the layout's test). */
static int hits(const rs_frag *f, const int64_t *qs, const int64_t *qe) {
  for (int d = 0; d < f->ndim; d++)
    if (f->start[d] >= qs[d] + qe[d] || qs[d] >= f->start[d] + f->extent[d]) return 0;
  return 1;
}

/* Senders: every holder of source tensor t (its whole box), in the order
 * rs_layout_find_holders gives them, so that each destination box of t
 * scans them instead of walking the layout again (plan_sends assigns the
 * boxes tensor by tensor); filtered by the box they are the holders of
 * that box, in that order. *ok 0: not kept (raw fragments, or too many),
 * walk the layout. */
enum { RS_TENSOR_HOLDERS_MAX = 1 << 16 };
static reshard_result_t tensor_holders(rs_assign_ctx *ctx, int t, int *ok) {
  *ok = 0;
  if (ctx->tix_tensor == t && ctx->tix_valid) { /* 1: kept; -1: too many, walk */
    *ok = ctx->tix_valid > 0;
    return RESHARD_SUCCESS;
  }
  const rs_tensor *T = &ctx->src->tensors[t];
  if (T->nraws) return RESHARD_SUCCESS;
  int64_t zero[RESHARD_MAX_DIMS] = {0};
  ctx->tix_valid = 0;
  ctx->tix.n = 0;
  RS_CHECK(rs_layout_find_holders(ctx->src, t, zero, T->shape, &ctx->lowered, &ctx->tix));
  ctx->tix_tensor = t;
  if (ctx->tix.n > RS_TENSOR_HOLDERS_MAX) {
    ctx->tix_valid = -1;
    ctx->tix.n = 0;
    return RESHARD_SUCCESS;
  }
  ctx->tix_valid = 1;
  *ok = 1;
  return RESHARD_SUCCESS;
}

/* What the cells of box D need, whoever receives it: its holders in
 * ctx->holders, each dim's cell bounds in ctx->bounds (nb[d] of them, dim
 * d at d * *per_dim), the holders in canonical order and by outermost
 * interval (ctx->cands, ctx->bucket). A sender keeps only the holders
 * that meet the hull of its own (the cells it walks lie inside the hull,
 * and any holder of such a cell meets it); the bounds come from all. */
static reshard_result_t prep_box(rs_assign_ctx *ctx, const rs_frag *D, int src_tensor, const char *name, size_t *nb,
                                 size_t *per_dim_out) {
  const int nd = D->ndim;
  const int32_t me = ctx->sender - 1;
  int indexed = 0;
  if (ctx->sender) RS_CHECK(tensor_holders(ctx, src_tensor, &indexed));
  const rs_frag *A;
  size_t na;
  if (indexed) {
    A = ctx->tix.v;
    na = ctx->tix.n;
  } else {
    ctx->holders.n = 0;
    RS_CHECK(rs_layout_find_holders(ctx->src, src_tensor, D->start, D->extent, &ctx->lowered, &ctx->holders));
    A = ctx->holders.v;
    na = ctx->holders.n;
  }
  const size_t per_dim = 2 * na + 2;
  *per_dim_out = per_dim;
  if (ctx->bounds_cap < per_dim * (size_t)(nd ? nd : 1)) {
    free(ctx->bounds);
    ctx->bounds_cap = per_dim * (size_t)(nd ? nd : 1) * 2;
    ctx->bounds = rs_malloc(ctx->bounds_cap * sizeof(int64_t));
    if (!ctx->bounds) {
      ctx->bounds_cap = 0;
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory planning tensor '%s'", name);
    }
  }
  /* Clip every holder to D so that cells stay inside D; the sender's
   * hull on the way. */
  size_t n[RESHARD_MAX_DIMS];
  int64_t hlo[RESHARD_MAX_DIMS], hhi[RESHARD_MAX_DIMS];
  int any = 0;
  for (int d = 0; d < nd; d++) {
    int64_t *b = ctx->bounds + (size_t)d * per_dim;
    n[d] = 0;
    b[n[d]++] = D->start[d];
    b[n[d]++] = D->start[d] + D->extent[d];
  }
  for (size_t i = 0; i < na; i++) {
    const rs_frag *h = &A[i];
    if (indexed && !hits(h, D->start, D->extent)) continue;
    for (int d = 0; d < nd; d++) {
      int64_t *b = ctx->bounds + (size_t)d * per_dim;
      int64_t lo = D->start[d], hi = D->start[d] + D->extent[d];
      int64_t s = rs_max_i64(h->start[d], lo);
      int64_t e = rs_min_i64(h->start[d] + h->extent[d], hi);
      /* lo and hi are in already: replicas holding all of D add nothing
       * to sort */
      if (s != lo && s != hi) b[n[d]++] = s;
      if (e != lo && e != hi) b[n[d]++] = e;
      if (h->rank == me) {
        hlo[d] = any ? rs_min_i64(hlo[d], s) : s;
        hhi[d] = any ? rs_max_i64(hhi[d], e) : e;
      }
    }
    if (h->rank == me) any = 1;
  }
  for (int d = 0; d < nd; d++) nb[d] = sort_bounds(ctx, ctx->bounds + (size_t)d * per_dim, n[d], D->start[d],
                                                   D->start[d] + D->extent[d]);
  if (indexed) { /* the holders that meet the sender's hull (none: it sends nothing of D) */
    ctx->holders.n = 0;
    for (size_t i = 0; i < na && any; i++) {
      const rs_frag *h = &A[i];
      int meet = hits(h, D->start, D->extent);
      for (int d = 0; d < nd && meet; d++)
        meet = rs_max_i64(h->start[d], hlo[d]) < rs_min_i64(h->start[d] + h->extent[d], hhi[d]);
      if (meet) RS_CHECK(rs_frag_vec_push(&ctx->holders, h));
    }
  }
  const size_t nh = ctx->holders.n;
  /* cands holds five arrays of nh + 1: a cell's candidates, the holders
   * in canonical order, the merge sort's scratch, the candidates in the
   * receiver's domain, and those source-side spreading leaves (spread.h);
   * then per_dim for bucket_holders */
  if (ctx->cands_cap < 5 * (nh + 1) + per_dim) {
    free(ctx->cands);
    ctx->cands_cap = (5 * (nh + 1) + per_dim) * 2;
    ctx->cands = rs_malloc(ctx->cands_cap * sizeof(int));
    if (!ctx->cands) {
      ctx->cands_cap = 0;
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory planning tensor '%s'", name);
    }
  }
  const rs_frag *H = ctx->holders.v;
  int *order = ctx->cands + nh + 1;
  for (size_t i = 0; i < nh; i++) order[i] = (int)i;
  sort_canonical(H, order, order + nh + 1, nh);
  if (nd) RS_CHECK(bucket_holders(ctx, H, order, nh, ctx->bounds, nb[0], name));
  return RESHARD_SUCCESS;
}

/* The scratch of rs_assign_pieces for D's box: kept from the previous call
 * (another receiver's) when the box, tensor and sender are the same,
 * prepared again otherwise. */
static reshard_result_t prep_cached(rs_assign_ctx *ctx, const rs_frag *D, int src_tensor, const char *name,
                                    size_t *nb, size_t *per_dim) {
  const int nd = D->ndim;
  /* a sender's prep keeps only the holders meeting its hull: the sender
   * is part of the key */
  int same = ctx->prep_valid && ctx->prep_tensor == src_tensor && ctx->prep_ndim == nd && ctx->prep_sender == ctx->sender;
  for (int d = 0; d < nd && same; d++) same = ctx->prep_start[d] == D->start[d] && ctx->prep_extent[d] == D->extent[d];
  if (same) { /* the box of the previous call (another receiver's): its scratch is intact */
    memcpy(nb, ctx->prep_nb, sizeof ctx->prep_nb);
    *per_dim = ctx->prep_per_dim;
    return RESHARD_SUCCESS;
  }
  ctx->prep_valid = 0;
  RS_CHECK(prep_box(ctx, D, src_tensor, name, nb, per_dim));
  ctx->prep_valid = 1;
  ctx->prep_tensor = src_tensor;
  ctx->prep_sender = ctx->sender;
  ctx->prep_ndim = nd;
  for (int d = 0; d < nd; d++) {
    ctx->prep_start[d] = D->start[d];
    ctx->prep_extent[d] = D->extent[d];
  }
  memcpy(ctx->prep_nb, nb, sizeof ctx->prep_nb);
  ctx->prep_per_dim = *per_dim;
  return RESHARD_SUCCESS;
}

/* A sender's walk: the cells [ilo, ihi) inside the hull of its holders
 * within D. Returns 0 when no cell is (nothing to assign). */
static int sender_cells(const rs_assign_ctx *ctx, const rs_frag *D, const size_t *nb, size_t per_dim, size_t *ilo,
                        size_t *ihi) {
  const int nd = D->ndim;
  const rs_frag *H = ctx->holders.v;
  const size_t nh = ctx->holders.n;
  int any = 0;
  int64_t hlo[RESHARD_MAX_DIMS], hhi[RESHARD_MAX_DIMS];
  for (size_t i = 0; i < nh; i++) {
    if (H[i].rank != ctx->sender - 1) continue;
    for (int d = 0; d < nd; d++) {
      int64_t s0 = rs_max_i64(H[i].start[d], D->start[d]);
      int64_t e0 = rs_min_i64(H[i].start[d] + H[i].extent[d], D->start[d] + D->extent[d]);
      hlo[d] = any ? rs_min_i64(hlo[d], s0) : s0;
      hhi[d] = any ? rs_max_i64(hhi[d], e0) : e0;
    }
    any = 1;
  }
  if (!any) return 0;
  for (int d = 0; d < nd; d++) {
    const int64_t *b = ctx->bounds + (size_t)d * per_dim;
    ilo[d] = rs_lower_bound_i64(b, nb[d], hlo[d]);
    ihi[d] = rs_lower_bound_i64(b, nb[d], hhi[d]);
    if (ilo[d] >= ihi[d]) return 0;
  }
  return 1;
}

/* Holders of the cell [cs, cs + ce) (bucket idx0), one per rank (the
 * first in canonical order), sorted by rank, into ctx->cands: walking the
 * holders in canonical order, a rank's first holder inside the cell is
 * the one kept. Returns how many. */
static int cell_holders(rs_assign_ctx *ctx, int nd, size_t idx0, const int64_t *cs, const int64_t *ce) {
  const rs_frag *H = ctx->holders.v;
  const size_t nh = ctx->holders.n;
  int nc = 0;
  int *c = ctx->cands;
  const int *cell_order = nd ? ctx->bucket + ctx->bucket_at[idx0] : ctx->cands + nh + 1;
  const size_t ncell = nd ? (size_t)(ctx->bucket_at[idx0 + 1] - ctx->bucket_at[idx0]) : nh;
  for (size_t j = 0; j < ncell; j++) {
    const int i = cell_order[j];
    int inside = 1;
    for (int d = 0; d < nd && inside; d++)
      inside = H[i].start[d] <= cs[d] && cs[d] + ce[d] <= H[i].start[d] + H[i].extent[d];
    if (!inside || (nc > 0 && H[c[nc - 1]].rank == H[i].rank)) continue;
    c[nc++] = i;
  }
  return nc;
}

/* A cell the receiver does not hold: its row-major element range goes to
 * the owners in nowners consecutive ranges (one range, the receiver's, in
 * a direct plan); each range is split evenly over the holders c[0..nc):
 * every holder provides floor or ceil of its share, whatever the cell's
 * shape (a cell with fewer rows than replicas still uses them all). */
static reshard_result_t split_cell(rs_assign_ctx *ctx, const rs_frag *D, int src_tensor, const int32_t *owners,
                                   int nowners, const int *c, int nc, uint64_t cell_no, const int64_t *cs,
                                   const int64_t *ce, rs_piece *p, int32_t *nparts, rs_piece_vec *out) {
  const int nd = D->ndim;
  const rs_frag *H = ctx->holders.v;
  const size_t nh = ctx->holders.n;
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= ce[d];
  uint64_t key = rs_mix64(((uint64_t)(uint32_t)src_tensor << 32) ^ (uint64_t)(uint32_t)D->rank) ^
                 rs_mix64(((uint64_t)(uint32_t)D->buffer << 40) ^ ((uint64_t)D->pos << 20) ^ cell_no);
  int64_t obase = n / nowners, oextra = n % nowners, at = 0;
  int *near = ctx->cands + 3 * (nh + 1);
  for (int o = 0; o < nowners; o++) {
    int64_t on = obase + (o < oextra);
    const int *cc = c;
    int ncc = nc;
    int *left = ctx->cands + 4 * (nh + 1);
    const int nleft = ctx->first_only ? 0 : spread_narrow(ctx, H, c, nc, owners[o], left);
    if (nleft) cc = left, ncc = nleft;
    const int nnear = ctx->first_only ? 0 : prefer_domain(ctx, H, cc, ncc, owners[o], near);
    if (nnear) cc = near, ncc = nnear;
    /* the baseline of RESHARD_FLAG_FIRST_REPLICA: the lowest holder */
    int64_t np = ctx->first_only ? rs_min_i64(1, on) : rs_min_i64(ncc, on);
    int rot = ctx->first_only ? 0 : (int)((key + (uint64_t)o) % (uint64_t)ncc);
    int64_t base = np ? on / np : 0, extra = np ? on % np : 0;
    p->owner = o;
    p->part = on ? *nparts : -1;
    if (on && ctx->parts) RS_CHECK(push_range(ctx->parts, p, nd, cs, ce, at, at + on));
    *nparts += on > 0;
    for (int64_t i = 0; i < np; i++) {
      int64_t sz = base + (i < extra);
      const rs_frag *h = &H[cc[(i + rot) % ncc]];
      if (!ctx->sender || h->rank == ctx->sender - 1) {
        p->src = *h;
        RS_CHECK(push_range(out, p, nd, cs, ce, at, at + sz));
      }
      at += sz;
    }
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rs_assign_pieces(rs_assign_ctx *ctx, const rs_frag *D,
                                  int src_tensor, const char *name,
                                  const int32_t *owners, int nowners,
                                  rs_piece_vec *out) {
  const int nd = D->ndim;
  const int32_t self = D->rank;
  if (!owners || nowners < 1) {
    owners = &self;
    nowners = 1;
  }
  out->n = 0;
  if (ctx->parts) ctx->parts->n = 0;
  int32_t nparts = 0;
  size_t nb[RESHARD_MAX_DIMS], per_dim;
  reshard_result_t r = prep_cached(ctx, D, src_tensor, name, nb, &per_dim);
  if (r) return r;
  rs_frag *H = ctx->holders.v;
  int64_t cs[RESHARD_MAX_DIMS], ce[RESHARD_MAX_DIMS];

  /* Odometer over cells, outermost dim slowest; cell_no is the cell's
   * row-major index in the whole grid (a key of the split, so a sender that
   * walks only its own cells numbers them like the receiver). */
  size_t idx[RESHARD_MAX_DIMS] = {0}, ilo[RESHARD_MAX_DIMS] = {0}, ihi[RESHARD_MAX_DIMS];
  uint64_t stride[RESHARD_MAX_DIMS];
  for (int d = nd - 1; d >= 0; d--) {
    ihi[d] = nb[d] - 1;
    stride[d] = d == nd - 1 ? 1 : stride[d + 1] * (uint64_t)(nb[d + 1] - 1);
  }
  /* a sender: the cells inside the hull of its holders */
  if (ctx->sender && nd && !sender_cells(ctx, D, nb, per_dim, ilo, ihi)) return RESHARD_SUCCESS;
  uint64_t cell_no = 0;
  for (int d = 0; d < nd; d++) {
    idx[d] = ilo[d];
    cell_no += idx[d] * stride[d];
  }
  for (;;) {
    for (int d = 0; d < nd; d++) {
      const int64_t *b = ctx->bounds + (size_t)d * per_dim;
      cs[d] = b[idx[d]];
      ce[d] = b[idx[d] + 1] - b[idx[d]];
    }
    const int nc = cell_holders(ctx, nd, nd ? idx[0] : 0, cs, ce);
    const int *c = ctx->cands;
    if (nc == 0) {
      char box[256];
      format_box(box, sizeof box, nd, cs, ce);
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "tensor '%s' rank %d: destination box %s is held by no source rank",
                      name, D->rank, box);
    }
    rs_piece p;
    memcpy(p.start, cs, sizeof cs);
    memcpy(p.extent, ce, sizeof ce);
    p.owner = 0;
    p.part = -1;
    int local = -1;
    if (nowners == 1)
      for (int k = 0; k < nc; k++)
        if (H[c[k]].rank == owners[0]) local = c[k];
    if (local >= 0) {
      /* The receiver holds the cell itself: no transport at all. */
      p.src = H[local];
      if (!ctx->sender || p.src.rank == ctx->sender - 1) RS_CHECK(piece_push(out, &p));
    } else {
      r = split_cell(ctx, D, src_tensor, owners, nowners, c, nc, cell_no, cs, ce, &p, &nparts, out);
      if (r) return r;
    }
    int d = nd - 1;
    for (; d >= 0; d--) {
      if (++idx[d] < ihi[d]) break;
      idx[d] = ilo[d];
    }
    if (d < 0) break;
    cell_no = 0;
    for (int k = 0; k < nd; k++) cell_no += idx[k] * stride[k];
  }
  return RESHARD_SUCCESS;
}
