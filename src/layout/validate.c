/* Per-rank validation of a layout: each rank checks the buffers it holds,
 * so validation costs O(this rank's fragments) and every violation is
 * reported by the rank that owns it (the others learn of it through the
 * agreement step of plan creation). */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "common/error.h"
#include "common/sorted.h"
#include "layout/layout.h"

typedef struct footprint {
  int64_t lo, hi; /* bytes [lo, hi) */
  const rs_frag *f;
} footprint;

static int footprint_of(const rs_frag *f, size_t es, footprint *fp) {
  int64_t lo = (int64_t)f->byte_offset, hi = lo;
  for (int d = 0; d < f->ndim; d++) {
    int64_t span;
    if (rs_mul_overflow_i64(f->extent[d] - 1, f->strides[d], &span) ||
        rs_mul_overflow_i64(span, (int64_t)es, &span))
      return -1;
    if (span < 0) {
      if (rs_add_overflow_i64(lo, span, &lo)) return -1;
    } else if (rs_add_overflow_i64(hi, span, &hi)) {
      return -1;
    }
  }
  if (rs_add_overflow_i64(hi, (int64_t)es, &hi)) return -1;
  fp->lo = lo;
  fp->hi = hi;
  fp->f = f;
  return 0;
}

/* Distinct elements at distinct addresses: with dims sorted by |stride|,
 * each stride must exceed the reach of all smaller ones (mixed radix).
 * Sufficient, not necessary; exotic interleavings are rejected. */
static int self_overlaps(const rs_frag *f) {
  int64_t s[RESHARD_MAX_DIMS], e[RESHARD_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < f->ndim; d++)
    if (f->extent[d] > 1) {
      /* -INT64_MIN does not exist; such a stride cannot bring two
       * elements together, and footprint_of rejects it as reaching
       * outside any buffer, which is the error to report. */
      if (f->strides[d] == INT64_MIN) return 0;
      int64_t a = f->strides[d] < 0 ? -f->strides[d] : f->strides[d];
      int k = n++;
      while (k > 0 && s[k - 1] > a) {
        s[k] = s[k - 1];
        e[k] = e[k - 1];
        k--;
      }
      s[k] = a;
      e[k] = f->extent[d];
    }
  int64_t reach = 0; /* largest offset reachable with the smaller dims */
  for (int i = 0; i < n; i++) {
    if (s[i] <= reach) return 1;
    int64_t add;
    if (rs_mul_overflow_i64(s[i], e[i] - 1, &add) || rs_add_overflow_i64(reach, add, &reach)) return 1;
  }
  return 0;
}

static int cmp_footprint(const void *a, const void *b) {
  const footprint *x = a, *y = b;
  return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Exact when both fragments share strides and neither wraps in the frame
 * those strides define; otherwise conservative (byte ranges intersect
 * means overlap). */
static int frags_overlap(const footprint *a, const footprint *b, size_t es,
                         size_t es_b) {
  if (a->hi <= b->lo || b->hi <= a->lo) return 0;
  const rs_frag *fa = a->f, *fb = b->f;
  /* element strides only mean the same bytes for the same element size */
  if (fa->ndim != fb->ndim || fa->ndim == 0 || es != es_b) return 1;
  int nd = fa->ndim;
  int order[RESHARD_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    if (fa->strides[d] != fb->strides[d] || fa->strides[d] <= 0) return 1;
    order[d] = d;
  }
  /* dims by decreasing stride */
  for (int i = 1; i < nd; i++)
    for (int j = i; j > 0 && fa->strides[order[j]] > fa->strides[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  if (fa->byte_offset > fb->byte_offset) {
    const rs_frag *t = fa;
    fa = fb;
    fb = t;
  }
  int64_t delta = (int64_t)(fb->byte_offset - fa->byte_offset);
  if (delta % (int64_t)es) return 1;
  delta /= (int64_t)es;
  int64_t coord[RESHARD_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    int d = order[i];
    coord[d] = delta / fa->strides[d];
    delta -= coord[d] * fa->strides[d];
  }
  if (delta) return 1;
  for (int i = 1; i < nd; i++) { /* no wrapping into the next outer dim */
    int d = order[i], outer = order[i - 1];
    int64_t reach = rs_max_i64(coord[d] + fb->extent[d], fa->extent[d]);
    if (reach * fa->strides[d] > fa->strides[outer]) return 1;
  }
  for (int d = 0; d < nd; d++)
    if (coord[d] >= fa->extent[d] || coord[d] + fb->extent[d] <= 0) return 0;
  return 1;
}

static reshard_result_t validate_raw(const reshard_layout_t *L,
                                     const char *side, int b) {
  const rs_buffer *buf = &L->buffers[b];
  rs_frag_vec frags = {0};
  reshard_result_t r = RESHARD_SUCCESS;
  footprint *fps = NULL;
  RS_CHECK_GOTO(rs_layout_raw_fragments(L, b, &frags), r, done);
  fps = rs_malloc((frags.n ? frags.n : 1) * sizeof *fps);
  if (!fps) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory validating buffer '%s'", buf->name);
    goto done;
  }
  for (size_t i = 0; i < frags.n; i++) {
    const rs_frag *f = &frags.v[i];
    const rs_tensor *t = &L->tensors[f->tensor];
    size_t es = reshard_dtype_size(t->dtype);
    if (self_overlaps(f)) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                   "tensor '%s' rank %d: %s fragment %lld in buffer '%s' overlaps itself (strides put two elements at one address)",
                   t->name, f->rank, side, (long long)f->pos, buf->name);
      goto done;
    }
    if (footprint_of(f, es, &fps[i]) || fps[i].lo < 0 || (uint64_t)fps[i].hi > buf->raw_bytes) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                   "tensor '%s' rank %d: %s fragment %lld lies outside buffer '%s' of %zu bytes (byte_offset/strides)",
                   t->name, f->rank, side, (long long)f->pos, buf->name, buf->raw_bytes);
      goto done;
    }
  }
  qsort(fps, frags.n, sizeof *fps, cmp_footprint);
  for (size_t i = 0; i < frags.n; i++)
    for (size_t j = i + 1; j < frags.n && fps[j].lo < fps[i].hi; j++) {
      const rs_tensor *ti = &L->tensors[fps[i].f->tensor];
      if (frags_overlap(&fps[i], &fps[j], reshard_dtype_size(ti->dtype),
                        reshard_dtype_size(L->tensors[fps[j].f->tensor].dtype))) {
        r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                     "rank %d: %s fragments of tensors '%s' and '%s' overlap in buffer '%s' (byte_offset/strides)",
                     fps[i].f->rank, side, ti->name, L->tensors[fps[j].f->tensor].name, buf->name);
        goto done;
      }
    }
done:
  free(fps);
  rs_frag_vec_free(&frags);
  return r;
}

static reshard_result_t validate_buffer(const reshard_layout_t *L, int b, int rank, void *side) {
  if (L->buffers[b].kind == RS_BUFFER_RAW) return validate_raw(L, side, b);
  uint64_t bytes;
  /* lowering checks split sums, part agreement and overflow */
  return rs_layout_buffer_bytes(L, b, rank, &bytes);
}

reshard_result_t rs_layout_validate_rank(const reshard_layout_t *L,
                                         const char *side, int rank) {
  /* only the buffers this rank holds: their holders check the others */
  return rs_layout_each_rank_buffer(L, rank, validate_buffer, (void *)side);
}

/* The boxes that hold tensor t somewhere: its parts' windows (clipped to
 * the shape) and its raw fragments. NULL-free: *n may be 0. */
static reshard_result_t tensor_boxes(const reshard_layout_t *L, int t, int64_t **out, size_t *n, int *whole) {
  const rs_tensor *T = &L->tensors[t];
  const int nd = T->ndim;
  size_t cap = (size_t)T->nparts + (size_t)T->nraws;
  int64_t *b = rs_malloc((cap ? cap : 1) * 2 * (size_t)(nd ? nd : 1) * sizeof *b);
  if (!b) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory checking tensor '%s'", T->name);
  size_t k = 0;
  *whole = 0;
  for (int i = 0; i < T->nparts && !*whole; i++) {
    const rs_part *p = &L->parts[T->parts[i]];
    int64_t *lo = b + k * 2 * (size_t)nd, *hi = lo + nd;
    int full = 1, empty = 0;
    for (int d = 0; d < nd; d++) {
      lo[d] = p->vstart[d];
      hi[d] = rs_min_i64(T->shape[d], p->vstart[d] + p->vshape[d]);
      full &= lo[d] == 0 && hi[d] == T->shape[d];
      empty |= hi[d] <= lo[d];
    }
    if (full) *whole = 1;
    if (!empty) k++;
  }
  for (int i = 0; i < T->nraws && !*whole; i++) {
    const rs_raw *r = &L->raws[T->raws[i]];
    int64_t *lo = b + k * 2 * (size_t)nd, *hi = lo + nd;
    int empty = 0;
    for (int d = 0; d < nd; d++) {
      lo[d] = r->start[d];
      hi[d] = r->start[d] + r->extent[d];
      empty |= hi[d] <= lo[d];
    }
    if (!empty) k++;
  }
  *out = b;
  *n = k;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_layout_check_coverage(const reshard_layout_t *L, const char *side) {
  reshard_result_t r = RESHARD_SUCCESS;
  int64_t *cuts = NULL;
  for (int t = 0; t < L->ntensors && r == RESHARD_SUCCESS; t++) {
    const rs_tensor *T = &L->tensors[t];
    const int nd = T->ndim;
    int64_t numel = 1;
    for (int d = 0; d < nd; d++) numel = T->shape[d] ? numel : 0;
    if (T->partial || numel == 0) continue;
    int64_t *box = NULL;
    size_t nbox = 0;
    int whole = 0;
    RS_CHECK(tensor_boxes(L, t, &box, &nbox, &whole));
    if (whole) {
      free(box);
      continue;
    }
    if (nbox == 0) {
      free(box);
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "tensor '%s': declared on the %s side but placed nowhere there (place it, or say "
                      "reshard_layout_allow_partial when this side does not need it)",
                      T->name, side);
    }
    /* the grid of every box boundary; each cell must lie in some box */
    size_t per = 2 * nbox + 2, nb[RESHARD_MAX_DIMS];
    cuts = rs_malloc(per * (size_t)(nd ? nd : 1) * sizeof *cuts);
    if (!cuts) {
      free(box);
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory checking tensor '%s'", T->name);
    }
    for (int d = 0; d < nd; d++) {
      int64_t *c = cuts + (size_t)d * per;
      size_t n = 0;
      c[n++] = 0;
      c[n++] = T->shape[d];
      for (size_t i = 0; i < nbox; i++) {
        c[n++] = box[i * 2 * (size_t)nd + (size_t)d];
        c[n++] = box[i * 2 * (size_t)nd + (size_t)nd + (size_t)d];
      }
      qsort(c, n, sizeof *c, rs_cmp_i64);
      size_t u = 0;
      for (size_t i = 0; i < n; i++)
        if (!u || c[i] != c[u - 1]) c[u++] = c[i];
      nb[d] = u;
    }
    size_t idx[RESHARD_MAX_DIMS] = {0};
    for (;;) {
      int covered = 0;
      for (size_t i = 0; i < nbox && !covered; i++) {
        const int64_t *lo = box + i * 2 * (size_t)nd, *hi = lo + nd;
        int in = 1;
        for (int d = 0; d < nd && in; d++) {
          const int64_t *c = cuts + (size_t)d * per;
          in = lo[d] <= c[idx[d]] && c[idx[d] + 1] <= hi[d];
        }
        covered = in;
      }
      if (!covered) {
        char where[256];
        size_t u = 0;
        for (int d = 0; d < nd && u < sizeof where; d++) {
          const int64_t *c = cuts + (size_t)d * per;
          u += (size_t)snprintf(where + u, sizeof where - u, "%s%lld:%lld", d ? ", " : "", (long long)c[idx[d]],
                                (long long)c[idx[d] + 1]);
        }
        r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                     "tensor '%s': the %s side holds none of box [%s] (place all of it, or say "
                     "reshard_layout_allow_partial when this side needs only part)",
                     T->name, side, where);
        break;
      }
      int d = nd - 1;
      for (; d >= 0; d--) {
        if (++idx[d] + 1 < nb[d]) break;
        idx[d] = 0;
      }
      if (d < 0) break;
    }
    free(box);
    free(cuts);
    cuts = NULL;
  }
  return r;
}
