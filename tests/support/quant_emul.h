/* One fp8 quantization block as kernels/quant_kernels.cu runs it, its
 * RS_KERNEL_THREADS threads one after another: the block located, the
 * vector loops chosen (rs_qblock_vec), every thread's part of the amax
 * reduced, then every thread's codes (thread 0 the scale). The emulated
 * device (gpu/mock_device.c) and test_quant_kernel run blocks through
 * this, so what they test is the kernel's order of calls. */
#ifndef RS_TEST_SUPPORT_QUANT_EMUL_H
#define RS_TEST_SUPPORT_QUANT_EMUL_H

#include "kernels/rs_kernels.h"
#include "pack/quant_block.h"

/* Block blk of box q read at in_base; force_scalar keeps the element
 * loops. Returns whether the block took the vector loops. */
static inline int rs_emul_quant_block(const rs_qbox *q, const void *in_base, uint64_t blk, unsigned char *codes,
                                      unsigned char *scales, int force_scalar) {
  rs_qblock b;
  rs_qblock_locate(q, in_base, blk, &b);
  rs_qblock_vec(q, &b, codes);
  if (force_scalar) b.vec = 0;
  uint32_t amax = 0;
  for (unsigned th = 0; th < RS_KERNEL_THREADS; th++) {
    const uint32_t m = rs_qblock_amax_part(q, &b, th, RS_KERNEL_THREADS);
    amax = m > amax ? m : amax;
  }
  for (unsigned th = 0; th < RS_KERNEL_THREADS; th++)
    rs_qblock_write(q, &b, amax, codes, scales, th, RS_KERNEL_THREADS);
  return b.vec;
}

#endif
