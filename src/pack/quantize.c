/* FP8 block quantization of one box (see quantize.h). */
#include "pack/quantize.h"

#include <string.h>

#include "pack/convert.h"

int64_t rs_qbox_elems(const rs_qbox *q) {
  int64_t n = 1;
  for (int d = 0; d < q->ndim; d++) n *= q->extent[d];
  return n;
}

static int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); } /* a >= 0, no overflow */

int64_t rs_qbox_blocks(const rs_qbox *q) {
  int64_t n = 1;
  for (int d = 0; d < q->ndim - 2; d++) n *= q->extent[d];
  return n * cdiv(q->extent[q->ndim - 2], q->block[0]) * cdiv(q->extent[q->ndim - 1], q->block[1]);
}

/* Element (i, j) of a plane as f32 bits: bf16 is f32's upper half, the
 * others widen exactly (convert.h). */
static inline uint32_t load_f32(const unsigned char *p, int dtype) {
  if (dtype == RESHARD_BF16) return ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
  if (dtype == RESHARD_FP32) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  return rs_cvt_widen_f32((uint32_t)p[0] | (uint32_t)p[1] << 8, rs_cvt_fmt_of(RESHARD_FP16));
}

/* One plane (the last two dims at one leading index): in points at its
 * first element, codes and scales at its outputs. */
static void plane(const rs_qbox *q, const unsigned char *in, unsigned char *codes, unsigned char *scales) {
  const int nd = q->ndim, dt = q->in_dtype;
  const int64_t R = q->extent[nd - 2], C = q->extent[nd - 1];
  const int64_t es = dt == RESHARD_FP32 ? 4 : 2;
  const int64_t rs = q->in_stride[nd - 2] * es, cs = q->in_stride[nd - 1] * es;
  const int64_t nbc = cdiv(C, q->block[1]);
  for (int64_t r0 = 0; r0 < R; r0 += q->block[0]) {
    const int64_t r1 = r0 + q->block[0] < R ? r0 + q->block[0] : R;
    for (int64_t c0 = 0; c0 < C; c0 += q->block[1]) {
      const int64_t c1 = c0 + q->block[1] < C ? c0 + q->block[1] : C;
      /* amax over the block: |x| as bits orders like the values, and every
       * NaN's bits lie above infinity's, so the largest bits are amax, or
       * say the block holds a NaN (amax NaN then, as PyTorch's amax) */
      uint32_t amax_bits = 0;
      for (int64_t i = r0; i < r1; i++)
        for (int64_t j = c0; j < c1; j++) {
          const uint32_t a = load_f32(in + i * rs + j * cs, dt) & 0x7fffffffu;
          amax_bits = a > amax_bits ? a : amax_bits;
        }
      const float amax = rs_cvt_bits_f32(amax_bits > 0x7f800000u ? 0x7fc00000u : amax_bits);
      const float factor = rs_cvt_block_factor(amax), scale = rs_cvt_block_scale_inv(amax);
      memcpy(scales + 4 * ((r0 / q->block[0]) * nbc + c0 / q->block[1]), &scale, 4);
      for (int64_t i = r0; i < r1; i++)
        for (int64_t j = c0; j < c1; j++) {
          codes[i * C + j] = (unsigned char)rs_cvt_quant_e4m3(rs_cvt_bits_f32(load_f32(in + i * rs + j * cs, dt)), factor);
        }
    }
  }
}

void rs_quantize_box(const rs_qbox *q, const void *in_base, unsigned char *codes, unsigned char *scales) {
  const int nd = q->ndim;
  const int64_t es = q->in_dtype == RESHARD_FP32 ? 4 : 2;
  const int64_t plane_codes = q->extent[nd - 2] * q->extent[nd - 1];
  const int64_t plane_blocks = cdiv(q->extent[nd - 2], q->block[0]) * cdiv(q->extent[nd - 1], q->block[1]);
  int64_t idx[RESHARD_MAX_DIMS] = {0};
  for (int d = 0; d < nd; d++)
    if (q->extent[d] == 0) return;
  for (int64_t p = 0;; p++) {
    int64_t off = (int64_t)q->in_off;
    for (int d = 0; d < nd - 2; d++) off += idx[d] * q->in_stride[d] * es;
    plane(q, (const unsigned char *)in_base + off, codes + q->code_off + p * plane_codes,
          scales + q->scale_off + 4 * p * plane_blocks);
    int d = nd - 3;
    while (d >= 0 && ++idx[d] == q->extent[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}
