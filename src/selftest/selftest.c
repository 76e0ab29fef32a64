/* The self-test of include/reshard_selftest.h: seeded values from global
 * coordinates, byte-exact checks. */
#include "reshard_selftest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "selftest/ref_cast.h"

static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
  return h;
}

/* Seed of one tensor at one step; elements then cost one multiply-xorshift
 * each, so that verifying gigabytes stays cheap next to moving them. */
static uint64_t tensor_seed(const char *name, uint64_t step) {
  return mix(name_hash(name) ^ mix(step + 0x9e37));
}

static inline uint64_t elem_bits(uint64_t seed, uint64_t linear) {
  uint64_t v = (linear + seed) * 0x9E3779B97F4A7C15ULL;
  return v ^ (v >> 29);
}

static inline void elem_bytes(uint64_t seed, int64_t linear, size_t esize,
                              unsigned char *out) {
  uint64_t v = elem_bits(seed, (uint64_t)linear);
  for (size_t i = 0; i < esize; i++) {
    if (i && i % 8 == 0) v = mix(v);
    out[i] = (unsigned char)(v >> (8 * (i % 8)));
  }
  /* a one-byte value equal to the sentinel would hide a missed write */
  if (esize == 1 && out[0] == RESHARD_SELFTEST_SENTINEL) out[0] ^= 0x5a;
}

static int values_mode; /* reshard_selftest_values_t, read and written atomically */

void reshard_selftest_set_values(reshard_selftest_values_t v) {
  __atomic_store_n(&values_mode, v == RESHARD_SELFTEST_FINITE ? 1 : 0, __ATOMIC_RELAXED);
}

reshard_selftest_values_t reshard_selftest_get_values(void) {
  return __atomic_load_n(&values_mode, __ATOMIC_RELAXED) ? RESHARD_SELFTEST_FINITE : RESHARD_SELFTEST_BITS;
}

/* RESHARD_SELFTEST_FINITE's value of dtype dt from an element's hash v:
 * sign from bit 0, mantissa from the bits above it, exponent -1 - (the
 * trailing zeros of v >> 24), clamped at the dtype's smallest normal
 * exponent (so never a subnormal, a NaN or an infinity in the tensor
 * itself); the bits written little-endian like elem_bytes'. Returns 0 for
 * a dtype that is not a float. */
static inline int finite_bytes(uint64_t v, reshard_dtype_t dt, unsigned char *out) {
  uint64_t t = v >> 24;
  int e = -1 - (t ? __builtin_ctzll(t) : 40), n;
  uint64_t sign = v & 1, m = v >> 1, b;
#define RS_FINITE(bias, emin, mbits, width)                                                      \
  do {                                                                                          \
    int ee = e < (emin) ? (emin) : e;                                                           \
    b = sign << ((width)-1) | (uint64_t)((bias) + ee) << (mbits) | (m & ((1ull << (mbits)) - 1)); \
    n = (width) / 8;                                                                            \
  } while (0)
  switch (dt) {
  case RESHARD_FP64: RS_FINITE(1023, -1022, 52, 64); break;
  case RESHARD_FP32: RS_FINITE(127, -126, 23, 32); break;
  case RESHARD_BF16: RS_FINITE(127, -126, 7, 16); break;
  case RESHARD_FP16: RS_FINITE(15, -14, 10, 16); break;
  case RESHARD_FP8_E4M3: RS_FINITE(7, -6, 3, 8); break;
  case RESHARD_FP8_E5M2: RS_FINITE(15, -14, 2, 8); break;
  default: return 0;
  }
#undef RS_FINITE
  /* a one-byte value equal to the sentinel would hide a missed write */
  if (n == 1 && b == RESHARD_SELFTEST_SENTINEL) b ^= 1;
  for (int i = 0; i < n; i++) out[i] = (unsigned char)(b >> (8 * i));
  return 1;
}

/* An element's bytes in the current mode (dt: the tensor's dtype). */
static inline void elem_value(uint64_t seed, int64_t linear, reshard_dtype_t dt, size_t esize, unsigned char *out) {
  if (__atomic_load_n(&values_mode, __ATOMIC_RELAXED) && finite_bytes(elem_bits(seed, (uint64_t)linear), dt, out))
    return;
  elem_bytes(seed, linear, esize, out);
}

void reshard_selftest_expected(const char *name, uint64_t step, int64_t linear,
                 size_t esize, unsigned char *out) {
  elem_bytes(tensor_seed(name, step), linear, esize, out);
}

/* Fixed-size compares and fills inline; a libc call per element would
 * dominate the verification of a whole model. */
static inline int bytes_differ(const unsigned char *a, const unsigned char *b,
                               size_t n) {
  switch (n) {
    case 1: return a[0] != b[0];
    case 2: { uint16_t x, y; memcpy(&x, a, 2); memcpy(&y, b, 2); return x != y; }
    case 4: { uint32_t x, y; memcpy(&x, a, 4); memcpy(&y, b, 4); return x != y; }
    case 8: { uint64_t x, y; memcpy(&x, a, 8); memcpy(&y, b, 8); return x != y; }
    default: return memcmp(a, b, n) != 0;
  }
}

enum { VISIT_FILL, VISIT_MASK, VISIT_CHECK };

typedef struct elem_ctx {
  const char *name;
  uint64_t seed;
  size_t es;
  reshard_dtype_t dt;
  unsigned char *buf, *mask;
  int64_t bad;
  const char *label;
  int rank;
  /* a converted tensor's check: the source's dtype and size, and the
   * destination's dtype (cast < 0: none) */
  int cast;
  reshard_dtype_t sdt, ddt;
  size_t ses;
} elem_ctx;

static uint32_t le_bits(const unsigned char *p, size_t n) {
  uint32_t v = 0;
  for (size_t i = 0; i < n && i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

/* Whether a converted element is right: the source's value cast by the
 * reference (src/selftest/ref_cast.c); any NaN where the cast gives one. */
static int cast_differs(const elem_ctx *x, int64_t lin, const unsigned char *at) {
  unsigned char raw[16];
  elem_value(x->seed, lin, x->sdt, x->ses, raw);
  int64_t want = rs_ref_round(x->ddt, rs_ref_decode(x->sdt, le_bits(raw, x->ses)));
  uint32_t got = le_bits(at, x->es);
  return want < 0 ? !rs_ref_is_nan(x->ddt, got) : got != (uint32_t)want;
}

/* Visits every element of a fragment, one innermost row at a time: the
 * global linear index advances by one and the buffer position by the
 * innermost stride. */
static void for_each_row(const reshard_fragment_info_t *f,
                         const int64_t *shape, int what, elem_ctx *x) {
  int nd = f->ndim;
  int64_t idx[RESHARD_MAX_DIMS] = {0};
  for (int d = 0; d < nd; d++)
    if (f->extent[d] == 0) return;
  const int64_t es = (int64_t)x->es;
  const int64_t n = nd ? f->extent[nd - 1] : 1;
  /* the innermost stride of a one-element row is any value (layouts
   * accept a huge one there): only a row that steps uses it */
  const int64_t step = nd && n > 1 ? f->strides[nd - 1] * es : 0;
  for (;;) {
    int64_t lin = 0, off = (int64_t)f->byte_offset;
    for (int d = 0; d < nd; d++) {
      lin = lin * shape[d] + f->start[d] + idx[d];
      off += idx[d] * f->strides[d] * es;
    }
    for (int64_t i = 0; i < n; i++, lin++, off += step) {
      unsigned char *at = what == VISIT_MASK ? x->mask + off : x->buf + off;
      if (what == VISIT_MASK) {
        for (size_t k = 0; k < x->es; k++) at[k] = 1;
      } else if (what == VISIT_FILL) {
        elem_value(x->seed, lin, x->dt, x->es, at);
      } else {
        unsigned char want[16];
        if (!x->cast) elem_value(x->seed, lin, x->dt, x->es, want);
        if (x->cast ? cast_differs(x, lin, at) : bytes_differ(want, at, x->es)) {
          if (x->bad < 5)
            fprintf(stderr, "%s: rank %d tensor '%s' element %lld (buffer byte %lld) wrong\n", x->label, x->rank, x->name,
                    (long long)lin, (long long)off);
          x->bad++;
        }
      }
    }
    int d = nd - 2;
    while (d >= 0 && ++idx[d] == f->extent[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

static void visit(const reshard_layout_t *L, const reshard_fragment_info_t *f,
                  int what, uint64_t step, elem_ctx *c) {
  reshard_dtype_t dt;
  int64_t shape[RESHARD_MAX_DIMS];
  reshard_layout_tensor_info(L, f->tensor_id, &c->name, &dt, NULL, shape);
  c->es = reshard_dtype_size(dt);
  c->dt = dt;
  c->seed = tensor_seed(c->name, step);
  for_each_row(f, shape, what, c);
}

reshard_result_t reshard_selftest_alloc(reshard_selftest_t *s, const reshard_layout_t *L, int rank,
                                        int64_t fill_step) {
  if (!s) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "selftest_alloc: NULL argument");
  memset(s, 0, sizeof *s);
  if (!L || rank < 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "selftest_alloc: %s", L ? "negative rank" : "layout is NULL");
  s->nbuf = reshard_layout_num_buffers(L);
  s->ptr = calloc((size_t)s->nbuf + 1, sizeof *s->ptr);
  s->mask = calloc((size_t)s->nbuf + 1, sizeof *s->mask);
  s->bytes = calloc((size_t)s->nbuf + 1, sizeof *s->bytes);
  if (!s->ptr || !s->mask || !s->bytes)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "selftest_alloc rank %d: out of memory", rank);
  for (int b = 0; b < s->nbuf; b++) {
    RS_CHECK(reshard_layout_buffer_bytes(L, b, rank, &s->bytes[b]));
    if (!s->bytes[b]) continue;
    s->ptr[b] = rs_bulk_malloc(s->bytes[b]);
    s->mask[b] = rs_bulk_malloc(s->bytes[b]);
    if (s->mask[b]) memset(s->mask[b], 0, s->bytes[b]);
    if (!s->ptr[b] || !s->mask[b])
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "selftest_alloc rank %d: out of memory (buffer %d, %zu bytes)", rank,
                      b, s->bytes[b]);
    memset(s->ptr[b], RESHARD_SELFTEST_SENTINEL, s->bytes[b]);
  }
  size_t n = 0;
  RS_CHECK(reshard_layout_fragments(L, rank, NULL, 0, &n));
  s->frags = calloc(n + 1, sizeof *s->frags);
  if (!s->frags) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "selftest_alloc rank %d: out of memory", rank);
  RS_CHECK(reshard_layout_fragments(L, rank, s->frags, n, &s->nfrags));
  for (size_t i = 0; i < s->nfrags; i++) {
    elem_ctx c = {0};
    c.mask = s->mask[s->frags[i].buffer_id];
    c.rank = rank;
    visit(L, &s->frags[i], VISIT_MASK, 0, &c);
  }
  if (fill_step >= 0) reshard_selftest_fill(s, L, (uint64_t)fill_step);
  return RESHARD_SUCCESS;
}

void reshard_selftest_fill(reshard_selftest_t *s, const reshard_layout_t *L, uint64_t step) {
  for (size_t i = 0; i < s->nfrags; i++) {
    elem_ctx c = {0};
    c.buf = s->ptr[s->frags[i].buffer_id];
    visit(L, &s->frags[i], VISIT_FILL, step, &c);
  }
}

/* ---- destinations quantized to fp8 blocks (reshard_layout_add_tensor_blocked) ---- */

/* A weight quantized on the way: its source's seed, dtype and shape. */
typedef struct qref {
  uint64_t seed;
  reshard_dtype_t sdt;
  size_t ses;
  int nd;
  int64_t shape[RESHARD_MAX_DIMS];
  int64_t block[2];
} qref;

/* The source's value of element g (global coordinates), exactly. */
static double q_value(const qref *q, const int64_t *g) {
  int64_t lin = 0;
  for (int d = 0; d < q->nd; d++) lin = lin * q->shape[d] + g[d];
  unsigned char raw[16];
  elem_value(q->seed, lin, q->sdt, q->ses, raw);
  return rs_ref_decode(q->sdt, le_bits(raw, q->ses));
}

/* max |x| over the block whose first element is g (NaN if it holds one). */
static double q_amax(const qref *q, const int64_t *g0) {
  int64_t g[RESHARD_MAX_DIMS];
  memcpy(g, g0, sizeof g);
  const int r = q->nd - 2, c = q->nd - 1;
  double amax = 0;
  for (int64_t i = g0[r]; i < g0[r] + q->block[0] && i < q->shape[r]; i++)
    for (int64_t j = g0[c]; j < g0[c] + q->block[1] && j < q->shape[c]; j++) {
      g[r] = i, g[c] = j;
      double x = q_value(q, g);
      if (x != x) return x;
      if (fabs(x) > amax) amax = fabs(x);
    }
  return amax;
}

/* Checks a fragment of the weight's codes (scale 0) or of its scales
 * (scale 1: coordinates are blocks) against the reference quantizer. */
static int64_t check_quant(const qref *q, const reshard_fragment_info_t *f, const unsigned char *buf, int scale,
                           const char *name, const char *label, int rank, int64_t bad) {
  const int nd = f->ndim, r = nd - 2, c = nd - 1;
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= f->extent[d];
  /* the amax of the blocks the fragment meets, computed once each:
   * [leading index within the fragment][block row][block column] */
  int64_t lead = 1;
  for (int d = 0; d < r; d++) lead *= f->extent[d];
  const int64_t b0 = scale ? f->start[r] : f->start[r] / q->block[0];
  const int64_t b1 = scale ? f->start[c] : f->start[c] / q->block[1];
  const int64_t nb0 = scale ? f->extent[r] : (f->start[r] + f->extent[r] - 1) / q->block[0] - b0 + 1;
  const int64_t nb1 = scale ? f->extent[c] : (f->start[c] + f->extent[c] - 1) / q->block[1] - b1 + 1;
  double *amax = malloc((size_t)(lead * nb0 * nb1) * sizeof *amax + 1);
  unsigned char *done = calloc((size_t)(lead * nb0 * nb1) + 1, 1);
  if (!amax || !done) {
    free(amax);
    free(done);
    fprintf(stderr, "%s: rank %d tensor '%s': out of memory for the check\n", label, rank, name);
    return bad + 1;
  }
  const size_t es = scale ? 4 : 1;
  for (int64_t e = 0; e < n; e++) {
    int64_t rel[RESHARD_MAX_DIMS], g[RESHARD_MAX_DIMS], rest = e, off = (int64_t)f->byte_offset, l = 0;
    for (int d = nd - 1; d >= 0; d--) rel[d] = rest % f->extent[d], rest /= f->extent[d];
    for (int d = 0; d < nd; d++) {
      g[d] = f->start[d] + rel[d];
      off += rel[d] * f->strides[d] * (int64_t)es;
      if (d < r) l = l * f->extent[d] + rel[d];
    }
    /* the block: its coordinates, and its first element's */
    const int64_t bi = scale ? g[r] : g[r] / q->block[0], bj = scale ? g[c] : g[c] / q->block[1];
    const int64_t k = (l * nb0 + (bi - b0)) * nb1 + (bj - b1);
    int64_t first[RESHARD_MAX_DIMS];
    memcpy(first, g, sizeof first);
    first[r] = bi * q->block[0], first[c] = bj * q->block[1];
    if (!done[k]) amax[k] = q_amax(q, first), done[k] = 1;
    float want_scale;
    int64_t want = rs_ref_quant_e4m3(scale ? 0.0f : (float)q_value(q, g), (float)amax[k], &want_scale);
    const unsigned char *at = buf + off;
    int wrong;
    if (scale) {
      float got;
      memcpy(&got, at, 4);
      wrong = want_scale != want_scale ? got == got : memcmp(&got, &want_scale, 4) != 0;
    } else {
      wrong = want < 0 ? !rs_ref_is_nan(RESHARD_FP8_E4M3, at[0]) : at[0] != (unsigned char)want;
    }
    if (wrong) {
      if (bad < 5)
        fprintf(stderr, "%s: rank %d tensor '%s' %s %lld wrong (quantized to fp8 blocks)\n", label, rank, name,
                scale ? "scale" : "element", (long long)e);
      bad++;
    }
  }
  free(amax);
  free(done);
  return bad;
}

/* Whether dst tensor t is a weight the plan quantizes (role 1) or its
 * scales (role 2), and its reference. */
static int quant_role(const reshard_layout_t *L, const reshard_layout_t *src, int t, uint64_t step, qref *q) {
  const int n = reshard_layout_num_tensors(L);
  for (int w = 0; w < n; w++) {
    int64_t blk[2];
    int sid;
    if (reshard_layout_tensor_block(L, w, blk, &sid) || !blk[0] || (w != t && sid != t)) continue;
    const char *name;
    int s;
    int64_t sblk[2];
    if (reshard_layout_tensor_info(L, w, &name, NULL, &q->nd, q->shape) ||
        reshard_layout_find_tensor(src, name, &s) || reshard_layout_tensor_block(src, s, sblk, NULL) || sblk[0] ||
        reshard_layout_tensor_info(src, s, NULL, &q->sdt, NULL, NULL)) {
      rs_error_clear();
      return 0;
    }
    q->seed = tensor_seed(name, step);
    q->ses = reshard_dtype_size(q->sdt);
    q->block[0] = blk[0], q->block[1] = blk[1];
    return w == t ? 1 : 2;
  }
  return 0;
}

int64_t reshard_selftest_check(const reshard_selftest_t *s, const reshard_layout_t *L, int rank,
                      uint64_t step, const char *label) {
  return reshard_selftest_check_from(s, L, NULL, rank, step, label);
}

int64_t reshard_selftest_check_from(const reshard_selftest_t *s, const reshard_layout_t *L,
                                    const reshard_layout_t *src, int rank, uint64_t step, const char *label) {
  int64_t bad = 0;
  for (size_t i = 0; i < s->nfrags; i++) {
    elem_ctx c = {0};
    c.buf = s->ptr[s->frags[i].buffer_id];
    c.label = label;
    c.rank = rank;
    c.bad = bad;
    qref q;
    int role = src ? quant_role(L, src, s->frags[i].tensor_id, step, &q) : 0;
    if (role) {
      const char *name = "";
      reshard_layout_tensor_info(L, s->frags[i].tensor_id, &name, NULL, NULL, NULL);
      bad = check_quant(&q, &s->frags[i], c.buf, role == 2, name, label, rank, bad);
      continue;
    }
    if (src) { /* the tensor's dtype on the source side, where it differs */
      const char *name = NULL;
      int id = -1;
      reshard_layout_tensor_info(L, s->frags[i].tensor_id, &name, &c.ddt, NULL, NULL);
      if (name && reshard_layout_find_tensor(src, name, &id) == RESHARD_SUCCESS &&
          reshard_layout_tensor_info(src, id, NULL, &c.sdt, NULL, NULL) == RESHARD_SUCCESS && c.sdt != c.ddt) {
        c.cast = 1;
        c.ses = reshard_dtype_size(c.sdt);
      }
    }
    visit(L, &s->frags[i], VISIT_CHECK, step, &c);
    bad = c.bad;
  }
  for (int b = 0; b < s->nbuf; b++)
    for (size_t k = 0; k < s->bytes[b]; k++)
      if (!s->mask[b][k] && s->ptr[b][k] != RESHARD_SELFTEST_SENTINEL) {
        if (bad < 5) fprintf(stderr, "%s: rank %d buffer %d byte %zu outside fragments was written\n", label, rank, b, k);
        bad++;
      }
  return bad;
}

void reshard_selftest_free(reshard_selftest_t *s) {
  if (!s) return;
  for (int b = 0; s->ptr && b < s->nbuf; b++) {
    rs_bulk_free(s->ptr[b]);
    if (s->mask) rs_bulk_free(s->mask[b]);
  }
  free(s->ptr);
  free(s->mask);
  free(s->bytes);
  free(s->frags);
  memset(s, 0, sizeof *s);
}
