/* Strided N-D box copies on host memory (see copy.h). */
#include "pack/copy.h"

#include "pack/convert.h"

#include <assert.h>
#include <string.h>

/* An empty box: kept as one outer dim of extent 0 rather than encoded in
 * run_bytes, so that run_bytes stays > 0 as copy.h promises and every
 * consumer (host loops, CUDA kernels) naturally iterates zero times. */
static void make_empty(rs_copy *c, size_t elem_size) {
  c->ndim = 1;
  c->extent[0] = 0;
  c->src_stride[0] = 0;
  c->dst_stride[0] = 0;
  c->run_bytes = elem_size;
}

/* rs_copy_init with each side's element size: ses on the source, des on
 * the destination (equal but for a cast). run_bytes counts the source. */
static void init_sized(rs_copy *c, int ndim, const int64_t *extent,
                       size_t ses, size_t des, int32_t src_buf, uint64_t src_off,
                       const int64_t *src_stride_elems, int32_t dst_buf,
                       uint64_t dst_off, const int64_t *dst_stride_elems) {
  const size_t elem_size = ses;
  memset(c, 0, sizeof(*c));
  c->src_off = src_off;
  c->dst_off = dst_off;
  c->src_buf = src_buf;
  c->dst_buf = dst_buf;
  c->run_bytes = elem_size;

  assert(ndim >= 0 && ndim <= RS_COPY_MAX_DIMS);
  if (ndim < 0 || ndim > RS_COPY_MAX_DIMS) {
    /* Out-of-contract input must not index past the fixed arrays; copying
     * nothing is the least harmful outcome in release builds. */
    make_empty(c, elem_size);
    return;
  }

  const int64_t es = (int64_t)elem_size;
  int n = 0;
  for (int i = 0; i < ndim; i++) {
    if (extent[i] <= 0) {
      make_empty(c, elem_size);
      return;
    }
    /* A unit dim contributes no offset, and leaving it in would stop its
     * neighbours from merging. */
    if (extent[i] == 1)
      continue;
    const int64_t ss = src_stride_elems[i] * es;
    const int64_t ds = dst_stride_elems[i] * (int64_t)des;
    /* Merging into the previously kept dim (rather than pairwise over the
     * input) collapses whole chains of contiguous dims in one pass. */
    if (n > 0 && c->src_stride[n - 1] == ss * extent[i] &&
        c->dst_stride[n - 1] == ds * extent[i]) {
      c->extent[n - 1] *= extent[i];
      c->src_stride[n - 1] = ss;
      c->dst_stride[n - 1] = ds;
      continue;
    }
    c->extent[n] = extent[i];
    c->src_stride[n] = ss;
    c->dst_stride[n] = ds;
    n++;
  }

  /* After merging, at most one dim can still be contiguous with the run;
   * a loop costs nothing and stays right if the merge rule ever changes. */
  uint64_t drun = des;
  while (n > 0 && c->src_stride[n - 1] == (int64_t)c->run_bytes &&
         c->dst_stride[n - 1] == (int64_t)drun) {
    c->run_bytes *= (uint64_t)c->extent[n - 1];
    drun *= (uint64_t)c->extent[n - 1];
    n--;
    c->extent[n] = 0;
    c->src_stride[n] = 0;
    c->dst_stride[n] = 0;
  }
  c->ndim = n;
}

void rs_copy_init(rs_copy *c, int ndim, const int64_t *extent,
                  size_t elem_size, int32_t src_buf, uint64_t src_off,
                  const int64_t *src_stride_elems, int32_t dst_buf,
                  uint64_t dst_off, const int64_t *dst_stride_elems) {
  init_sized(c, ndim, extent, elem_size, elem_size, src_buf, src_off,
             src_stride_elems, dst_buf, dst_off, dst_stride_elems);
}

void rs_copy_init_cvt(rs_copy *c, int ndim, const int64_t *extent,
                      reshard_dtype_t src_dtype, int32_t src_buf,
                      uint64_t src_off, const int64_t *src_stride_elems,
                      reshard_dtype_t dst_dtype, int32_t dst_buf,
                      uint64_t dst_off, const int64_t *dst_stride_elems) {
  const size_t ses = reshard_dtype_size(src_dtype), des = reshard_dtype_size(dst_dtype);
  init_sized(c, ndim, extent, ses, des, src_buf, src_off, src_stride_elems,
             dst_buf, dst_off, dst_stride_elems);
  if (src_dtype != dst_dtype) {
    assert(rs_cvt_float_dtype(src_dtype) && rs_cvt_float_dtype(dst_dtype));
    c->cvt_from = (uint8_t)(src_dtype + 1);
    c->cvt_to = (uint8_t)(dst_dtype + 1);
  }
}

uint64_t rs_copy_dst_run(const rs_copy *c) {
  if (!c->cvt_from) return c->run_bytes;
  return c->run_bytes / rs_cvt_size(c->cvt_from - 1) * rs_cvt_size(c->cvt_to - 1);
}

/* The real side's byte stride at staging unit u (a breakpoint of the
 * refinement, in staging bytes): within the staging run (run bytes) it is
 * u's elements at the real side's size (u itself without a cast); past
 * it, unit u lies in the one dim d whose staging stride divides it.
 * stage/real: the staging and real strides of c; stage_es/real_es: the
 * element sizes of the two sides (equal without a cast). */
static int64_t stride_at(const rs_copy *c, const int64_t *stage, const int64_t *real, uint64_t run, uint64_t stage_es,
                         uint64_t real_es, uint64_t u) {
  if (u < run) return (int64_t)(u / stage_es * real_es);
  for (int d = 0; d < c->ndim; d++) {
    uint64_t lo = (uint64_t)stage[d];
    if (u >= lo && u < lo * (uint64_t)c->extent[d]) return real[d] * (int64_t)(u / lo);
  }
  return 0; /* unreachable for a valid chain (checked by the caller) */
}

int rs_copy_compose(const rs_copy *s, const rs_copy *r, rs_copy *out) {
  /* A cast in one of the two (never both: one conversion per element)
   * becomes the composed copy's, between s's source and r's destination
   * element sizes; everything below counts in staging bytes. */
  const int scast = s->cvt_from != 0, rcast = r->cvt_from != 0;
  const uint64_t s_stage_es = scast ? rs_cvt_size(s->cvt_to - 1) : 1, s_real_es = scast ? rs_cvt_size(s->cvt_from - 1) : 1;
  const uint64_t r_stage_es = rcast ? rs_cvt_size(r->cvt_from - 1) : 1, r_real_es = rcast ? rs_cvt_size(r->cvt_to - 1) : 1;
  const uint64_t s_run = rs_copy_dst_run(s), total = rs_copy_bytes(s) / s_real_es * s_stage_es;
  if ((scast && rcast) || s->dst_buf != RS_BUF_STAGING || r->src_buf != RS_BUF_STAGING || s->dst_off != r->src_off ||
      total != rs_copy_bytes(r))
    return -1;
  memset(out, 0, sizeof *out);
  out->src_buf = s->src_buf;
  out->dst_buf = r->dst_buf;
  out->src_off = s->src_off;
  out->dst_off = r->dst_off;
  if (total == 0) {
    make_empty(out, 1);
    return 0;
  }
  out->cvt_from = scast ? s->cvt_from : r->cvt_from;
  out->cvt_to = scast ? s->cvt_to : r->cvt_to;
  /* The breakpoints: both runs, every dim's staging unit, the total;
   * sorted, deduplicated, each dividing the next. */
  uint64_t b[2 * RS_COPY_MAX_DIMS + 3];
  int nb = 0;
  b[nb++] = s_run;
  b[nb++] = r->run_bytes;
  b[nb++] = total;
  for (int d = 0; d < s->ndim; d++) b[nb++] = (uint64_t)s->dst_stride[d];
  for (int d = 0; d < r->ndim; d++) b[nb++] = (uint64_t)r->src_stride[d];
  for (int i = 1; i < nb; i++)
    for (int j = i; j > 0 && b[j] < b[j - 1]; j--) {
      uint64_t t = b[j];
      b[j] = b[j - 1];
      b[j - 1] = t;
    }
  int m = 0;
  for (int i = 0; i < nb; i++)
    if (!m || b[i] != b[m - 1]) b[m++] = b[i];
  for (int i = 1; i < m; i++)
    if (b[i] % b[i - 1]) return -1;
  if (m - 1 > RS_COPY_MAX_DIMS || b[0] % (scast ? s_stage_es : r_stage_es)) return -1;
  /* (a cast copy's run counts source bytes) */
  out->run_bytes = scast ? b[0] / s_stage_es * s_real_es : b[0];
  out->ndim = m - 1;
  /* dim j (outermost first) is level m-2-j: unit b[level], extent
   * b[level+1] / b[level] */
  for (int j = 0; j < m - 1; j++) {
    int lv = m - 2 - j;
    out->extent[j] = (int64_t)(b[lv + 1] / b[lv]);
    out->src_stride[j] = stride_at(s, s->dst_stride, s->src_stride, s_run, s_stage_es, s_real_es, b[lv]);
    out->dst_stride[j] = stride_at(r, r->src_stride, r->dst_stride, r->run_bytes, r_stage_es, r_real_es, b[lv]);
  }
  return 0;
}

uint64_t rs_copy_bytes(const rs_copy *c) {
  uint64_t total = c->run_bytes;
  for (int i = 0; i < c->ndim; i++)
    total *= c->extent[i] > 0 ? (uint64_t)c->extent[i] : 0;
  return total;
}

/* Copies the innermost outer dim: n runs of rb bytes. Offsets are computed
 * as base + i * stride instead of by bumping pointers so that no pointer is
 * ever formed outside the box (negative or past-the-end strides would
 * otherwise be undefined behaviour). Small runs are element-wise copies of
 * transposed layouts, where a libc memcpy call per element dominates; a
 * constant-size memcpy compiles to one load and one store. */
#define RS_COPY_LINE_FIXED(size)                                   \
  for (int64_t i = 0; i < n; i++)                                  \
    memcpy(d + i * ds, s + i * ss, (size));                        \
  break

static void copy_line(unsigned char *d, int64_t ds, const unsigned char *s,
                      int64_t ss, int64_t n, uint64_t rb) {
  switch (rb) {
  case 1:
    RS_COPY_LINE_FIXED(1);
  case 2:
    RS_COPY_LINE_FIXED(2);
  case 4:
    RS_COPY_LINE_FIXED(4);
  case 8:
    RS_COPY_LINE_FIXED(8);
  case 16:
    RS_COPY_LINE_FIXED(16);
  default:
    RS_COPY_LINE_FIXED(rb);
  }
}

#undef RS_COPY_LINE_FIXED

/* A cast's innermost outer dim: n runs, each of ne elements of ses bytes
 * in, des bytes out. One loop per dtype pair, each with rs_cvt_elem's
 * dtypes as constants, so that the compiler folds the format decisions
 * out of the loop (a generic loop paid them per element: 1.9 x slower on
 * an f32 -> bf16 sync). */
#define RS_CVT_LOOP(F, T)                                                       \
  case (F) * 8 + (T):                                                           \
    for (int64_t i = 0; i < n; i++)                                             \
      for (uint64_t e = 0; e < ne; e++)                                         \
        rs_cvt_elem((T), d + i * ds + (int64_t)(e * des), (F), s + i * ss + (int64_t)(e * ses)); \
    break

static void convert_line(unsigned char *d, int64_t ds, const unsigned char *s,
                         int64_t ss, int64_t n, uint64_t ne, int from, size_t ses,
                         int to, size_t des) {
  enum { F32 = RESHARD_FP32, B16 = RESHARD_BF16, F16 = RESHARD_FP16, E4 = RESHARD_FP8_E4M3, E5 = RESHARD_FP8_E5M2 };
  switch (from * 8 + to) {
    RS_CVT_LOOP(F32, B16); RS_CVT_LOOP(F32, F16); RS_CVT_LOOP(F32, E4); RS_CVT_LOOP(F32, E5);
    RS_CVT_LOOP(B16, F32); RS_CVT_LOOP(B16, F16); RS_CVT_LOOP(B16, E4); RS_CVT_LOOP(B16, E5);
    RS_CVT_LOOP(F16, F32); RS_CVT_LOOP(F16, B16); RS_CVT_LOOP(F16, E4); RS_CVT_LOOP(F16, E5);
    RS_CVT_LOOP(E4, F32); RS_CVT_LOOP(E4, B16); RS_CVT_LOOP(E4, F16); RS_CVT_LOOP(E4, E5);
    RS_CVT_LOOP(E5, F32); RS_CVT_LOOP(E5, B16); RS_CVT_LOOP(E5, F16); RS_CVT_LOOP(E5, E4);
  default: /* not a pair rs_copy_init_cvt builds */
    for (int64_t i = 0; i < n; i++)
      for (uint64_t e = 0; e < ne; e++)
        rs_cvt_elem(to, d + i * ds + (int64_t)(e * des), from, s + i * ss + (int64_t)(e * ses));
  }
}

#undef RS_CVT_LOOP

/* One innermost outer dim of c: copied, or cast element by element. */
static void run_line(const rs_copy *c, unsigned char *d, int64_t ds, const unsigned char *s, int64_t ss, int64_t n) {
  if (!c->cvt_from) {
    copy_line(d, ds, s, ss, n, c->run_bytes);
    return;
  }
  const int from = c->cvt_from - 1, to = c->cvt_to - 1;
  const size_t ses = rs_cvt_size(from), des = rs_cvt_size(to);
  convert_line(d, ds, s, ss, n, c->run_bytes / ses, from, ses, to, des);
}

#ifdef RESHARD_SIMGRID_BUILD
int rs_copy_skip = 0;
#endif

void rs_copy_run(const rs_copy *c, const void *src_base, void *dst_base) {
#ifdef RESHARD_SIMGRID_BUILD
  if (rs_copy_skip) return;
#endif
  const unsigned char *s = (const unsigned char *)src_base + c->src_off;
  unsigned char *d = (unsigned char *)dst_base + c->dst_off;
  const int nd = c->ndim;

  assert(nd >= 0 && nd <= RS_COPY_MAX_DIMS);
  if (nd < 0 || nd > RS_COPY_MAX_DIMS)
    return;
  /* The odometer below assumes every dim has at least one index. */
  for (int k = 0; k < nd; k++)
    if (c->extent[k] <= 0)
      return;

  if (nd == 0) {
    run_line(c, d, 0, s, 0, 1);
    return;
  }
  const int in = nd - 1;
  const int64_t n_in = c->extent[in];
  const int64_t ss_in = c->src_stride[in];
  const int64_t ds_in = c->dst_stride[in];
  if (nd == 1) {
    run_line(c, d, ds_in, s, ss_in, n_in);
    return;
  }
  if (nd == 2) {
    for (int64_t i = 0; i < c->extent[0]; i++)
      run_line(c, d + i * c->dst_stride[0], ds_in, s + i * c->src_stride[0],
               ss_in, n_in);
    return;
  }

  /* Odometer over dims 0..nd-2: between two runs it costs one increment
   * and compare in the common case, where recursion would pay a call per
   * level per run. Byte offsets are kept as integers and updated
   * incrementally, for the same no-stray-pointer reason as copy_line. */
  int64_t idx[RS_COPY_MAX_DIMS] = {0};
  int64_t so = 0, doff = 0;
  for (;;) {
    run_line(c, d + doff, ds_in, s + so, ss_in, n_in);
    int k = in - 1;
    for (; k >= 0; k--) {
      if (++idx[k] < c->extent[k]) {
        so += c->src_stride[k];
        doff += c->dst_stride[k];
        break;
      }
      idx[k] = 0;
      so -= (c->extent[k] - 1) * c->src_stride[k];
      doff -= (c->extent[k] - 1) * c->dst_stride[k];
    }
    if (k < 0)
      return;
  }
}
