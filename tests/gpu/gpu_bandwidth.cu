/* Bandwidth of the batched copy kernel against cudaMemcpy device to
 * device, for segment lengths from 64 B to 1 MiB: pack (strided gather of
 * segments into dense staging) and unpack (the reverse), each as one
 * descriptor with many runs and as one descriptor per segment (up to 64k
 * descriptors in one launch, the many-tensors case). GB/s counts bytes
 * moved once (read + write would double it). Then the fp8 block
 * quantize kernel's bandwidth, read + written, against cudaMemcpy's
 * read + written. Exit 77 without a device. */
#include <stdint.h>
#include <string.h>
#include <vector>

extern "C" {
#include "device/device.h"
#include "pack/copy.h"
#include "pack/quantize.h"
}
#include "gpu/gpu_common.h"
#include "kernels/rs_kernels.h"

static const uint64_t TOTAL = 256ull << 20; /* bytes per pass */

/* Milliseconds of `reps` enqueues of `launch` on st (after one to warm
 * up), timed with events. */
template <class F> static float time_reps(cudaStream_t st, int reps, F launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  launch();
  CK(cudaEventRecord(a, st));
  for (int i = 0; i < reps; i++) launch();
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

/* One pass over `segs` segments of `len` bytes; the strided side has a gap
 * of one segment between segments. Returns GB/s. */
static double run(unsigned char *strided, unsigned char *dense, uint64_t len, bool pack, bool per_seg,
                  cudaStream_t st) {
  uint64_t segs = TOTAL / len;
  std::vector<rs_copy> c;
  if (per_seg) {
    uint64_t nd = segs < 65536 ? segs : 65536, per = segs / nd;
    c.resize(nd);
    for (uint64_t i = 0; i < nd; i++) {
      int64_t e[2] = {(int64_t)per, (int64_t)len}, ss[2] = {(int64_t)(2 * len), 1}, ds[2] = {(int64_t)len, 1};
      uint64_t so = i * per * 2 * len, d = i * per * len;
      if (pack) rs_copy_init(&c[i], 2, e, 1, 0, so, ss, RS_BUF_STAGING, d, ds);
      else rs_copy_init(&c[i], 2, e, 1, RS_BUF_STAGING, d, ds, 0, so, ss);
    }
  } else {
    c.resize(1);
    int64_t e[2] = {(int64_t)segs, (int64_t)len}, ss[2] = {(int64_t)(2 * len), 1}, ds[2] = {(int64_t)len, 1};
    if (pack) rs_copy_init(&c[0], 2, e, 1, 0, 0, ss, RS_BUF_STAGING, 0, ds);
    else rs_copy_init(&c[0], 2, e, 1, RS_BUF_STAGING, 0, ds, 0, 0, ss);
  }
  uint64_t nt = rs_tiles_count(c.data(), c.size(), RS_TILE_BYTES);
  std::vector<rs_tile> t(nt);
  rs_tiles_build(c.data(), c.size(), 0, RS_TILE_BYTES, t.data());
  rs_copy *dc;
  rs_tile *dt;
  void **tab;
  CK(cudaMalloc(&dc, c.size() * sizeof(rs_copy)));
  CK(cudaMalloc(&dt, nt * sizeof(rs_tile)));
  CK(cudaMalloc(&tab, sizeof(void *)));
  CK(cudaMemcpy(dc, c.data(), c.size() * sizeof(rs_copy), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt, t.data(), nt * sizeof(rs_tile), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(tab, &strided, sizeof(void *), cudaMemcpyHostToDevice));
  const int reps = 10;
  float ms = time_reps(st, reps, [&] { CK((cudaError_t)rs_cuda_launch_copies(dt, nt, dc, tab, tab, dense, st)); });
  cudaFree(dc);
  cudaFree(dt);
  cudaFree(tab);
  return (double)TOTAL * reps / (ms * 1e-3) / 1e9;
}

static double memcpy_bw(unsigned char *x, unsigned char *y, cudaStream_t st) {
  float ms = time_reps(st, 10, [&] { CK(cudaMemcpyAsync(y, x, TOTAL, cudaMemcpyDeviceToDevice, st)); });
  return (double)TOTAL * 10 / (ms * 1e-3) / 1e9;
}

/* FP8 block quantization of one bf16 box of TOTAL bytes (TOTAL / 2
 * elements, rows of 8192, 128 x 128 blocks): GB/s of bytes read and
 * written once (2 in + 1 code per element, and the scales), and the same
 * ratio's reference: cudaMemcpy's read + written, 2 x its GB/s. */
static double quant_bw(unsigned char *in, unsigned char *out, cudaStream_t st) {
  rs_qbox q;
  memset(&q, 0, sizeof q);
  q.ndim = 2;
  q.in_dtype = RESHARD_BF16;
  q.in_buf = 0;
  q.extent[1] = 8192;
  q.extent[0] = (int64_t)(TOTAL / 2 / 8192);
  q.in_stride[0] = 8192, q.in_stride[1] = 1;
  q.block[0] = q.block[1] = 128;
  const uint64_t elems = (uint64_t)rs_qbox_elems(&q), blocks = (uint64_t)rs_qbox_blocks(&q);
  q.code_off = 0;
  q.scale_off = elems;
  uint64_t bs[2] = {0, blocks};
  rs_qbox *dq;
  uint64_t *dbs;
  void **tab;
  CK(cudaMalloc(&dq, sizeof q));
  CK(cudaMalloc(&dbs, sizeof bs));
  CK(cudaMalloc(&tab, sizeof(void *)));
  CK(cudaMemcpy(dq, &q, sizeof q, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dbs, bs, sizeof bs, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(tab, &in, sizeof(void *), cudaMemcpyHostToDevice));
  float ms = time_reps(st, 10, [&] { CK((cudaError_t)rs_cuda_quantize(dq, dbs, 1, blocks, tab, NULL, out, out, st)); });
  cudaFree(dq);
  cudaFree(dbs);
  cudaFree(tab);
  return (double)(3 * elems + 4 * blocks) * 10 / (ms * 1e-3) / 1e9;
}

int main() {
  gpu_require_device("gpu_bandwidth");
  unsigned char *strided, *dense;
  CK(cudaMalloc(&strided, 2 * TOTAL));
  CK(cudaMalloc(&dense, TOTAL));
  CK(cudaMemset(strided, 1, 2 * TOTAL));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  double mc = memcpy_bw(strided, dense, st);
  printf("bandwidth, GB/s (%llu MiB per pass; cudaMemcpy D2D of the same bytes: %.0f)\n",
         (unsigned long long)(TOTAL >> 20), mc);
  printf("%10s %10s %10s %14s %14s %8s\n", "segment", "pack", "unpack", "pack/desc-seg", "unpack/desc-seg", "pack/memcpy");
  for (uint64_t len = 64; len <= (1u << 20); len *= 4) {
    double p = run(strided, dense, len, true, false, st);
    double u = run(strided, dense, len, false, false, st);
    double ps = run(strided, dense, len, true, true, st);
    double us = run(strided, dense, len, false, true, st);
    char lab[32];
    if (len >= (1u << 20)) snprintf(lab, sizeof lab, "%llu MiB", (unsigned long long)(len >> 20));
    else if (len >= 1024) snprintf(lab, sizeof lab, "%llu KiB", (unsigned long long)(len >> 10));
    else snprintf(lab, sizeof lab, "%llu B", (unsigned long long)len);
    printf("%10s %10.0f %10.0f %14.0f %14.0f %7.0f%%\n", lab, p, u, ps, us, 100 * p / mc);
  }
  /* (dense holds TOTAL / 2 codes and the scales after them) */
  CK(cudaMemset(strided, 0x3f, TOTAL));
  double qb = quant_bw(strided, dense, st);
  printf("fp8 block quantize (bf16, 128 x 128 blocks): %.0f GB/s read + written, %.0f%% of cudaMemcpy's %.0f "
         "(issue 19's target: >= 70%%)\n", qb, 100 * qb / (2 * mc), 2 * mc);
  cudaFree(strided);
  cudaFree(dense);
  cudaStreamDestroy(st);
  return 0;
}
