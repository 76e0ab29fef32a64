/* FP8 block quantization of one box (see quantize.h). */
#include "pack/quantize.h"

#include "pack/quant_block.h"

int64_t rs_qbox_elems(const rs_qbox *q) {
  int64_t n = 1;
  for (int d = 0; d < q->ndim; d++) n *= q->extent[d];
  return n;
}

int64_t rs_qbox_blocks(const rs_qbox *q) { return (int64_t)rs_qblock_count(q); }

/* Block by block, as one thread of the kernel's (pack/quant_block.h). */
void rs_quantize_box(const rs_qbox *q, const void *in_base, unsigned char *codes, unsigned char *scales) {
  const uint64_t n = rs_qblock_count(q);
  for (uint64_t k = 0; k < n; k++) {
    rs_qblock b;
    rs_qblock_locate(q, in_base, k, &b);
    rs_qblock_write(q, &b, rs_qblock_amax_part(q, &b, 0, 1), codes, scales, 0, 1);
  }
}
