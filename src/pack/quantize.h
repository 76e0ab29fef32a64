/* FP8 block quantization of one box (issue 19): the host's form of the
 * step a plan with block-quantized destinations runs on its source ranks
 * before it sends (src/plan/quant.c decides the boxes, src/api/stages.c
 * runs them). The per-element arithmetic is convert.h's (rs_cvt_block_*,
 * rs_cvt_quant_e4m3), shared with the CUDA kernels, so a code computed
 * anywhere is the same byte. */
#ifndef RS_PACK_QUANTIZE_H
#define RS_PACK_QUANTIZE_H

#include <stdint.h>

#include "reshard.h"

/* A box of a weight, in its input dtype, to quantize. Its start lies on
 * block boundaries of the global tensor and its end on one or at the
 * tensor's end (ragged last blocks), so the box's blocks are the global
 * tensor's. Blocks are block[0] x block[1] over the last two dims; each
 * index of the leading dims is its own plane of blocks. */
typedef struct rs_qbox {
  int32_t ndim;     /* 2 .. RESHARD_MAX_DIMS */
  int32_t in_dtype; /* RESHARD_FP32, RESHARD_BF16 or RESHARD_FP16 */
  int32_t in_buf;   /* the caller's source buffer id, or -1: gathered */
  int32_t tensor;   /* the weight's id in the destination layout */
  uint64_t in_off;  /* bytes from the input buffer's base */
  int64_t in_stride[RESHARD_MAX_DIMS]; /* elements */
  int64_t start[RESHARD_MAX_DIMS];     /* global coordinates (messages) */
  int64_t extent[RESHARD_MAX_DIMS];
  int64_t block[2];
  uint64_t code_off;  /* the box's codes, dense row-major, 1 byte each */
  uint64_t scale_off; /* its blocks' f32 scales, dense row-major */
} rs_qbox;

/* Elements of the box, and of its scale box (blocks). */
int64_t rs_qbox_elems(const rs_qbox *q);
int64_t rs_qbox_blocks(const rs_qbox *q);

/* Quantizes the box read at in_base (+ in_off, in_stride) into
 * codes + code_off and scales + scale_off: for each block, over its
 * elements read as f32, amax = max |x| (NaN if any is NaN), then
 * rs_cvt_block_scale_inv(amax) and rs_cvt_quant_e4m3(x,
 * rs_cvt_block_factor(amax)) per element. */
void rs_quantize_box(const rs_qbox *q, const void *in_base, unsigned char *codes, unsigned char *scales);

#endif
