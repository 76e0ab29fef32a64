/* Random rs_copy descriptors for the kernel tests (CPU emulation and GPU),
 * C and CUDA C++ alike: boxes of random dims inside padded tensors whose
 * dims are laid out in random order (transposes), element sizes from 1 to
 * 16 bytes, reversed dims (negative strides) and byte offsets that break
 * every alignment, and casts between float dtypes. Each descriptor gets its own source and destination
 * region, so a batch of them has disjoint writes. */
#ifndef RS_TESTS_GPU_RAND_COPIES_H
#define RS_TESTS_GPU_RAND_COPIES_H

#include <stdint.h>

#include "pack/copy.h"

static inline uint64_t rc_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}
static inline int64_t rc_range(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rc_rand(s) % (uint64_t)(hi - lo + 1));
}

/* Lays out a box of `extent` inside a padded tensor: element strides (in a
 * random dim order, some reversed) and the byte offset of the box's first
 * element; returns the tensor's bytes. */
static inline uint64_t rc_side(uint64_t *s, int nd, const int64_t *extent,
                               int64_t esize, int64_t *stride,
                               uint64_t *off) {
  int64_t shape[RS_COPY_MAX_DIMS], start[RS_COPY_MAX_DIMS];
  int order[RS_COPY_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    start[d] = rc_range(s, 0, 2);
    shape[d] = extent[d] + start[d] + rc_range(s, 0, 2);
    order[d] = d;
  }
  /* Fisher-Yates over the dims: which one is innermost in memory. Half of
   * the time keep row-major, the layout of most real tensors. */
  if (rc_rand(s) & 1)
    for (int d = nd - 1; d > 0; d--) {
      int j = (int)rc_range(s, 0, d), t = order[d];
      order[d] = order[j];
      order[j] = t;
    }
  int64_t st = 1;
  for (int i = nd - 1; i >= 0; i--) {
    stride[order[i]] = st;
    st *= shape[order[i]];
  }
  uint64_t o = 0;
  for (int d = 0; d < nd; d++) {
    o += (uint64_t)(start[d] * stride[d] * esize);
    if (rc_range(s, 0, 4) == 0) { /* reversed dim */
      o += (uint64_t)((extent[d] - 1) * stride[d] * esize);
      stride[d] = -stride[d];
    }
  }
  *off = o;
  return (uint64_t)(st * esize);
}

/* One random descriptor whose source lies in [src_base, src_base + *src_len)
 * and destination in [dst_base, dst_base + *dst_len) (both at most a few
 * hundred KiB); misaligned by up to 15 bytes on each side. */
static inline void rc_copy(uint64_t *s, uint64_t src_base, uint64_t dst_base,
                           rs_copy *c, uint64_t *src_len,
                           uint64_t *dst_len) {
  static const int64_t esizes[] = {1, 2, 4, 8, 16, 3, 6, 12};
  int64_t es = esizes[rc_range(s, 0, 7)];
  int nd = (int)rc_range(s, 1, 4);
  int64_t extent[RS_COPY_MAX_DIMS], ss[RS_COPY_MAX_DIMS], ds[RS_COPY_MAX_DIMS];
  for (int d = 0; d < nd; d++)
    extent[d] = rc_range(s, 1, d == nd - 1 ? 70 : 7);
  if (rc_range(s, 0, 9) == 0) extent[nd - 1] = rc_range(s, 1000, 9000); /* long runs */
  /* a quarter of them cast between two float dtypes (src/pack/convert.h) */
  static const reshard_dtype_t floats[] = {RESHARD_FP32, RESHARD_BF16, RESHARD_FP16, RESHARD_FP8_E4M3,
                                           RESHARD_FP8_E5M2};
  int cast = rc_range(s, 0, 3) == 0;
  int fi = (int)rc_range(s, 0, 4), ti = (fi + (int)rc_range(s, 1, 4)) % 5; /* two different dtypes */
  reshard_dtype_t from = floats[fi], to = floats[ti];
  int64_t des = cast ? (int64_t)reshard_dtype_size(to) : es;
  if (cast) es = (int64_t)reshard_dtype_size(from);
  uint64_t so, dof;
  uint64_t sl = rc_side(s, nd, extent, es, ss, &so);
  uint64_t dl = rc_side(s, nd, extent, des, ds, &dof);
  uint64_t smis = (uint64_t)rc_range(s, 0, 15), dmis = (uint64_t)rc_range(s, 0, 15);
  if (rc_range(s, 0, 2) == 0) smis = dmis = 0; /* aligned: the vector path */
  if (cast)
    rs_copy_init_cvt(c, nd, extent, from, 0, src_base + smis + so, ss, to, 0, dst_base + dmis + dof, ds);
  else
    rs_copy_init(c, nd, extent, (size_t)es, 0, src_base + smis + so, ss, 0,
                 dst_base + dmis + dof, ds);
  *src_len = sl + 16;
  *dst_len = dl + 16;
}

#endif
