/* RESHARD_FLAG_VERIFY on the device: the box sums of kernels/rs_verify.h
 * over a launch's tiles (one block per tile, grid-stride, each thread's
 * part added atomically: the sum is mod 2^64, so the order of the adds
 * does not matter), and the comparison of two arrays of sums. */
#include <cuda_runtime.h>

#include "kernels/rs_kernels.h"
#include "kernels/rs_verify.h"

namespace {

__global__ void __launch_bounds__(RS_KERNEL_THREADS)
sums_kernel(const rs_tile *__restrict__ tiles, uint64_t ntiles, const rs_copy *__restrict__ copies,
            const rs_vbox *__restrict__ vboxes, const rs_vtensor *__restrict__ vtensors, void *const *src_tab,
            void *const *dst_tab, int dst_side, uint64_t *sums, uint32_t desc_base) {
  for (uint64_t i = blockIdx.x; i < ntiles; i += gridDim.x) {
    const rs_tile t = tiles[i];
    const rs_copy *c = &copies[t.desc];
    const rs_vbox *v = &vboxes[t.desc];
    const unsigned char *base = (const unsigned char *)(dst_side ? dst_tab[c->dst_buf] : src_tab[c->src_buf]);
    uint64_t s = rs_tile_sum(c, &t, base, dst_side, v, &vtensors[v->tensor], threadIdx.x, blockDim.x);
    if (s) atomicAdd((unsigned long long *)&sums[t.desc - desc_base], (unsigned long long)s);
  }
}

__global__ void compare_kernel(const uint64_t *mine, const uint64_t *theirs, uint32_t n, uint32_t desc0,
                               uint32_t kind, rs_dev_agree *st) {
  rs_verify_compare(mine, theirs, n, desc0, kind, st);
}

} // namespace

extern "C" int rs_cuda_verify_sums(const rs_tile *tiles, uint64_t ntiles, const rs_copy *copies,
                                   const rs_vbox *vboxes, const rs_vtensor *vtensors, void *const *src_tab,
                                   void *const *dst_tab, int dst_side, uint64_t *sums, uint32_t desc_base,
                                   void *stream) {
  if (ntiles == 0) return (int)cudaSuccess;
  const uint64_t max_blocks = 65536;
  unsigned blocks = (unsigned)(ntiles < max_blocks ? ntiles : max_blocks);
  sums_kernel<<<blocks, RS_KERNEL_THREADS, 0, (cudaStream_t)stream>>>(tiles, ntiles, copies, vboxes, vtensors, src_tab,
                                                                      dst_tab, dst_side, sums, desc_base);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_verify_compare(const uint64_t *mine, const uint64_t *theirs, uint32_t n, uint32_t desc0,
                                      uint32_t kind, rs_dev_agree *st, void *stream) {
  if (n == 0) return (int)cudaSuccess;
  compare_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(mine, theirs, n, desc0, kind, st);
  return (int)cudaGetLastError();
}
