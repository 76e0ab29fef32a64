/* FP8 block quantization on the device (issue 19): one thread block per
 * quantization block, grid-stride over every block of a rank's boxes. The
 * block's body is src/pack/quant_block.h, the host's too: the partial
 * maxima of the threads are reduced in shared memory between its two
 * passes (|x| as bits orders like the values, so an integer max). The
 * CPU tests (tests/support/quant_emul.h: the emulated device and
 * test_quant_kernel) run the same calls in the same order, a thread at a
 * time. */
#include <cuda_runtime.h>

#include "kernels/rs_kernels.h"
#include "pack/quant_block.h"

namespace {

__global__ void __launch_bounds__(RS_KERNEL_THREADS)
quant_kernel(const rs_qbox *__restrict__ boxes, const uint64_t *__restrict__ bstart, uint32_t nboxes, uint64_t nblocks,
             void *const *tab, const void *gather, unsigned char *codes, unsigned char *scales) {
  __shared__ unsigned amax;
  __shared__ uint32_t box;
  __shared__ rs_qblock sb;
  for (uint64_t g = blockIdx.x; g < nblocks; g += gridDim.x) {
    /* One thread finds the block (a search and 64-bit divisions: as many
     * instructions as quantizing a thread's share of it, if every warp
     * did them) and whether its threads take 8 elements at a time. */
    if (threadIdx.x == 0) {
      const uint32_t lo = rs_qblock_box(bstart, nboxes, g);
      const rs_qbox *q = &boxes[lo];
      rs_qblock_locate(q, q->in_buf < 0 ? gather : tab[q->in_buf], g - bstart[lo], &sb);
      rs_qblock_vec(q, &sb, codes);
      box = lo;
      amax = 0;
    }
    __syncthreads();
    const rs_qbox *q = &boxes[box];
    const rs_qblock b = sb;
    const uint32_t m = rs_qblock_amax_part(q, &b, threadIdx.x, blockDim.x);
    if (m) atomicMax(&amax, m);
    __syncthreads();
    rs_qblock_write(q, &b, amax, codes, scales, threadIdx.x, blockDim.x);
    __syncthreads(); /* amax, box and sb are set for the next block */
  }
}

} // namespace

extern "C" int rs_cuda_quantize(const rs_qbox *boxes, const uint64_t *bstart, uint32_t nboxes, uint64_t nblocks,
                                void *const *tab, const void *gather, void *codes, void *scales, void *stream) {
  if (nblocks == 0) return (int)cudaSuccess;
  const uint64_t max_blocks = 65536;
  unsigned grid = (unsigned)(nblocks < max_blocks ? nblocks : max_blocks);
  quant_kernel<<<grid, RS_KERNEL_THREADS, 0, (cudaStream_t)stream>>>(
      boxes, bstart, nboxes, nblocks, tab, gather, (unsigned char *)codes, (unsigned char *)scales);
  return (int)cudaGetLastError();
}
