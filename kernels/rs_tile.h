/* One tile of a batched copy: the unit of work of one thread block, shared
 * by the CUDA kernels (kernels/copy_kernels.cu) and the host code that
 * builds tiles (src/device/tiles.c) and emulates them in the CPU tests.
 *
 * This header is C11 and CUDA C++ at once: under nvcc the tile body is a
 * __host__ __device__ function, so the CPU tests run the very code the GPU
 * runs, one simulated thread after another.
 *
 * A tile covers runs [run0, run0 + nruns) of one rs_copy descriptor (runs
 * numbered row-major over its outer dims) and, inside each of them, bytes
 * [b0, b1). Either nruns > 1 and [b0, b1) = [0, run_bytes) (whole runs), or
 * nruns == 1 and the range is a 16-byte-aligned slice of one long run.
 * For a cast descriptor the bytes are the source run's. */
#ifndef RS_KERNELS_RS_TILE_H
#define RS_KERNELS_RS_TILE_H

#include <stdint.h>
#include <string.h>

#include "pack/convert.h"
#include "pack/copy.h"

#ifdef __CUDACC__
#define RS_HD __host__ __device__ __forceinline__
#else
#define RS_HD static inline
#endif

typedef struct rs_tile {
  uint64_t run0;
  uint64_t nruns;
  uint64_t b0, b1;
  uint32_t desc; /* index into the launch's descriptor array */
  uint32_t pad;
} rs_tile;

/* Byte offsets of run r (row-major over the outer dims): 64-bit all the
 * way, since boxes beyond 2^31 elements are normal. */
RS_HD void rs_tile_run_offsets(const rs_copy *c, uint64_t r, int64_t *so,
                               int64_t *dof) {
  int64_t s = 0, d = 0;
  /* The outermost dim takes what is left of r: no division (and none at
   * all for the common single-dim descriptor). */
  for (int k = c->ndim - 1; k > 0; k--) {
    uint64_t e = (uint64_t)c->extent[k];
    uint64_t i = r % e;
    r /= e;
    s += (int64_t)i * c->src_stride[k];
    d += (int64_t)i * c->dst_stride[k];
  }
  if (c->ndim > 0) {
    s += (int64_t)r * c->src_stride[0];
    d += (int64_t)r * c->dst_stride[0];
  }
  *so = s;
  *dof = d;
}

/* The widest access (16, 8, 4, 2 or 1 bytes) that every address of the
 * tile is aligned to: both bases with their offsets, every stride, the run
 * length and the tile's byte range. Strides may be negative: two's
 * complement keeps their low bits meaningful. */
RS_HD unsigned rs_tile_width(const rs_copy *c, const rs_tile *t,
                             const unsigned char *src,
                             const unsigned char *dst) {
  uint64_t bits = (uint64_t)(uintptr_t)(src + c->src_off) |
                  (uint64_t)(uintptr_t)(dst + c->dst_off) | c->run_bytes |
                  t->b0 | t->b1;
  for (int k = 0; k < c->ndim; k++)
    bits |= (uint64_t)c->src_stride[k] | (uint64_t)c->dst_stride[k];
  if (!(bits & 15)) return 16;
  if (!(bits & 7)) return 8;
  if (!(bits & 3)) return 4;
  if (!(bits & 1)) return 2;
  return 1;
}

RS_HD void rs_tile_unit(unsigned char *d, const unsigned char *s,
                        unsigned w) {
#ifdef __CUDA_ARCH__
  switch (w) {
  case 16: *(uint4 *)d = *(const uint4 *)s; break;
  case 8: *(uint2 *)d = *(const uint2 *)s; break;
  case 4: *(uint32_t *)d = *(const uint32_t *)s; break;
  case 2: *(uint16_t *)d = *(const uint16_t *)s; break;
  default: *d = *s; break;
  }
#else
#ifdef RS_TILE_CHECK_ALIGN
  /* The CPU emulation checks what the GPU would fault on. */
  RS_TILE_CHECK_ALIGN(d, s, w);
#endif
  switch (w) {
  case 16: memcpy(d, s, 16); break;
  case 8: memcpy(d, s, 8); break;
  case 4: memcpy(d, s, 4); break;
  case 2: memcpy(d, s, 2); break;
  default: *d = *s; break;
  }
#endif
}

/* A cast descriptor's share of tile t for thread `tid`: element by
 * element (src/pack/convert.h reads and writes bytes, so no alignment is
 * needed). The tile's byte range counts source bytes, cut at multiples of
 * 16, so it starts and ends on whole elements. */
RS_HD void rs_tile_cast(const rs_copy *c, const rs_tile *t,
                        const unsigned char *src, unsigned char *dst,
                        unsigned tid, unsigned nthreads) {
  const int from = c->cvt_from - 1, to = c->cvt_to - 1;
  const uint64_t ses = rs_cvt_size(from), des = rs_cvt_size(to);
  const uint64_t e0 = t->b0 / ses, ne = (t->b1 - t->b0) / ses;
  const uint64_t total = t->nruns * ne;
  for (uint64_t i = tid; i < total; i += nthreads) {
    uint64_t r = i / ne, e = e0 + (i - r * ne);
    int64_t so, dof;
    rs_tile_run_offsets(c, t->run0 + r, &so, &dof);
    rs_cvt_elem(to, dst + c->dst_off + dof + (int64_t)(e * des), from,
                src + c->src_off + so + (int64_t)(e * ses));
  }
}

/* Thread `tid` of `nthreads` copies its share of tile t. Long runs (at
 * least one unit per thread) are walked run by run, the threads striding
 * inside each run, so the per-run offset math is paid once per run; short
 * runs (transposes: a few bytes each) give each thread whole units and
 * decompose the run index per unit. Addresses are formed as base + 64-bit
 * offset only for bytes inside the box. */
RS_HD void rs_tile_copy(const rs_copy *c, const rs_tile *t,
                        const unsigned char *src, unsigned char *dst,
                        unsigned tid, unsigned nthreads) {
  if (c->cvt_from) {
    rs_tile_cast(c, t, src, dst, tid, nthreads);
    return;
  }
  const unsigned w = rs_tile_width(c, t, src, dst);
  const uint64_t units = (t->b1 - t->b0) / w;
  const unsigned char *s0 = src + c->src_off + t->b0;
  unsigned char *d0 = dst + c->dst_off + t->b0;
  if (units == 0) return;
  if (units >= nthreads) {
    for (uint64_t r = 0; r < t->nruns; r++) {
      int64_t so, dof;
      rs_tile_run_offsets(c, t->run0 + r, &so, &dof);
      for (uint64_t u = tid; u < units; u += nthreads)
        rs_tile_unit(d0 + dof + (int64_t)(u * w), s0 + so + (int64_t)(u * w),
                     w);
    }
    return;
  }
  const uint64_t total = t->nruns * units;
  for (uint64_t i = tid; i < total; i += nthreads) {
    uint64_t r = i / units, u = i - r * units;
    int64_t so, dof;
    rs_tile_run_offsets(c, t->run0 + r, &so, &dof);
    rs_tile_unit(d0 + dof + (int64_t)(u * w), s0 + so + (int64_t)(u * w), w);
  }
}

#endif
