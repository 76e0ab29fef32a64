/* The batched copy kernel: one launch moves every tile of a round (many
 * segments of many tensors), each block taking tiles grid-stride. The tile
 * body (rs_tile.h) is shared with the host emulation in the CPU tests. */
#include <cuda_runtime.h>

#include "kernels/rs_kernels.h"

namespace {

__global__ void __launch_bounds__(RS_KERNEL_THREADS)
rs_copy_kernel(const rs_tile *__restrict__ tiles, uint64_t ntiles,
               const rs_copy *__restrict__ copies, void *const *src_tab,
               void *const *dst_tab, unsigned char *staging,
               const uint32_t *gate) {
  /* the agreement's verdict, written by an earlier kernel in stream order */
  if (gate && !*(const volatile uint32_t *)gate) return;
  for (uint64_t i = blockIdx.x; i < ntiles; i += gridDim.x) {
    const rs_tile t = tiles[i];
    const rs_copy *c = &copies[t.desc];
    const unsigned char *src = c->src_buf == RS_BUF_STAGING
                                   ? staging
                                   : (const unsigned char *)src_tab[c->src_buf];
    unsigned char *dst = c->dst_buf == RS_BUF_STAGING
                             ? staging
                             : (unsigned char *)dst_tab[c->dst_buf];
    rs_tile_copy(c, &t, src, dst, threadIdx.x, blockDim.x);
  }
}

__global__ void rs_agree_stamp_kernel(rs_dev_hdr *out, rs_dev_hdr mine) {
  *out = mine;
}

__global__ void rs_agree_check_kernel(const rs_dev_hdr *in, uint32_t n,
                                      rs_dev_hdr want, rs_dev_agree *st) {
  rs_dev_agree_check(in, n, &want, st);
}

__global__ void rs_agree_export_kernel(const rs_dev_agree *st, uint64_t *word) {
  rs_dev_agree_export(st, word);
}

__global__ void rs_agree_import_kernel(const uint64_t *word, rs_dev_hdr want,
                                       rs_dev_agree *st) {
  rs_dev_agree_import(word, &want, st);
}

__global__ void rs_agree_absorb_kernel(const rs_dev_agree *prior, rs_dev_hdr want, rs_dev_agree *st) {
  rs_dev_agree_absorb(prior, &want, st);
}

__global__ void rs_commit_select_kernel(void *const *tab, uint32_t nsrc, uint32_t ndst, const rs_dev_commit *c,
                                        void **cur) {
  rs_dev_commit_select(tab, nsrc, ndst, c, cur);
}

__global__ void rs_commit_vote_kernel(const rs_dev_agree *st, uint64_t version, uint64_t call, uint64_t *v) {
  rs_dev_commit_vote(st, version, call, v);
}

__global__ void rs_commit_flip_kernel(const uint64_t *v, rs_dev_agree *st, uint64_t version, uint64_t call,
                                      rs_dev_commit *c) {
  rs_dev_commit_flip(v, st, version, call, c);
}

} // namespace

extern "C" int rs_cuda_commit_select(void *const *tab, uint32_t nsrc, uint32_t ndst, const rs_dev_commit *c,
                                     void **cur, void *stream) {
  rs_commit_select_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(tab, nsrc, ndst, c, cur);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_commit_vote(const rs_dev_agree *st, uint64_t version, uint64_t call, uint64_t *v,
                                   void *stream) {
  rs_commit_vote_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(st, version, call, v);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_commit_flip(const uint64_t *v, rs_dev_agree *st, uint64_t version, uint64_t call,
                                   rs_dev_commit *c, void *stream) {
  rs_commit_flip_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(v, st, version, call, c);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_agree_export(const rs_dev_agree *st, uint64_t *word,
                                    void *stream) {
  rs_agree_export_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(st, word);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_agree_import(const uint64_t *word, rs_dev_hdr want,
                                    rs_dev_agree *st, void *stream) {
  rs_agree_import_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(word, want, st);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_agree_absorb(const rs_dev_agree *prior, rs_dev_hdr want, rs_dev_agree *st, void *stream) {
  rs_agree_absorb_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(prior, want, st);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_agree_stamp(rs_dev_hdr *out, rs_dev_hdr mine,
                                   void *stream) {
  rs_agree_stamp_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(out, mine);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_agree_check(const rs_dev_hdr *in, uint32_t n,
                                   rs_dev_hdr want, rs_dev_agree *st,
                                   void *stream) {
  rs_agree_check_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(in, n, want, st);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_launch_copies(const rs_tile *tiles, uint64_t ntiles,
                                     const rs_copy *copies,
                                     void *const *src_tab,
                                     void *const *dst_tab, void *staging,
                                     void *stream) {
  return rs_cuda_launch_copies_gated(tiles, ntiles, copies, src_tab, dst_tab,
                                     staging, NULL, stream);
}

extern "C" int rs_cuda_launch_copies_gated(const rs_tile *tiles,
                                           uint64_t ntiles,
                                           const rs_copy *copies,
                                           void *const *src_tab,
                                           void *const *dst_tab,
                                           void *staging,
                                           const uint32_t *gate,
                                           void *stream) {
  if (ntiles == 0) return (int)cudaSuccess;
  /* Enough blocks to fill any current GPU several times over; beyond that
   * blocks loop over tiles, which keeps gridDim.x far from its limit. */
  const uint64_t max_blocks = 65536;
  unsigned blocks = (unsigned)(ntiles < max_blocks ? ntiles : max_blocks);
  rs_copy_kernel<<<blocks, RS_KERNEL_THREADS, 0, (cudaStream_t)stream>>>(
      tiles, ntiles, copies, src_tab, dst_tab, (unsigned char *)staging, gate);
  return (int)cudaGetLastError();
}
