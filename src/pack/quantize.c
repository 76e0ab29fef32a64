/* FP8 block quantization of one box (see quantize.h). */
#include "pack/quantize.h"

#include "pack/quant_block.h"

int64_t rs_qbox_elems(const rs_qbox *q) {
  int64_t n = 1;
  for (int d = 0; d < q->ndim; d++) n *= q->extent[d];
  return n;
}

int64_t rs_qbox_blocks(const rs_qbox *q) { return (int64_t)rs_qblock_count(q); }

/* One thread over a box: contiguous bf16 blocks in runs along a block
 * row (below), every other block as one thread of the kernel's
 * (pack/quant_block.h). Blocks of one run: */
#define RS_QRUN 16

/* Compiled for several x86-64 levels, the best picked at load time (an
 * ifunc): the row loops vectorize 4, 8 or 16 lanes wide, and quant_bench
 * measured 1.84, 1.35 and 0.71 ns an element for SSE2 (the baseline every
 * build targets), AVX2 and x86-64-v4 on this project's VM. Not under
 * ThreadSanitizer, whose runtime is not up yet when the loader calls the
 * (instrumented) resolver: the process dies before main. GCC only. */
#if defined(__SANITIZE_THREAD__)
#define RS_QUANT_CLONES
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define RS_QUANT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else /* (clang 14's clones are not found by other files' calls: not there) */
#define RS_QUANT_CLONES
#endif

RS_QUANT_CLONES void rs_quantize_box(const rs_qbox *q, const void *in_base, unsigned char *codes, unsigned char *scales) {
  const uint64_t n = rs_qblock_count(q);
  rs_qblock b[RS_QRUN];
  for (uint64_t k = 0; k < n;) {
    rs_qblock_locate(q, in_base, k, &b[0]);
    if (q->in_dtype != RESHARD_BF16 || b[0].cs != 2) {
      rs_qblock_write(q, &b[0], rs_qblock_amax_part(q, &b[0], 0, 1), codes, scales, 0, 1);
      k++;
      continue;
    }
    /* Contiguous bf16: up to RS_QRUN blocks side by side along a block
     * row, each row read left to right across them, once for the maxima
     * and once for the codes. Block by block, a block's rows lie a whole
     * tensor row apart, and every one of them costs a cache miss and a TLB
     * miss the hardware prefetcher does not see coming (measured in
     * bench/quant_bench: 2.2 ns an element that way). The same row
     * helpers as rs_qblock_write's host path: the same bytes. */
    int g = 1;
    while (g < RS_QRUN && k + (uint64_t)g < n) {
      rs_qblock_locate(q, in_base, k + (uint64_t)g, &b[g]);
      if (b[g].in != b[0].in || b[g].r0 != b[0].r0) break;
      g++;
    }
    int16_t m[RS_QRUN] = {0};
    for (int64_t i = b[0].r0; i < b[0].r1; i++) {
      const unsigned char *row = b[0].in + i * b[0].rs;
      for (int x = 0; x < g; x++) {
        const int16_t r = rs_qrow_amax_bf16(row, b[x].c0, b[x].c1);
        m[x] = r > m[x] ? r : m[x];
      }
    }
    float factor[RS_QRUN];
    int finite = 0;
    for (int x = 0; x < g; x++) {
      const uint32_t bits = (uint32_t)(uint16_t)m[x] << 16;
      if (bits >= 0x7f800000u) { /* an infinity or a NaN: the block's own path */
        rs_qblock_write(q, &b[x], bits, codes, scales, 0, 1);
        factor[x] = 0;
        continue;
      }
      rs_qblock_put_scale(&b[x], bits, scales);
      factor[x] = rs_cvt_block_factor(rs_qblock_amax(bits));
      finite |= 1 << x;
    }
    unsigned char *out = codes + b[0].code_at;
    for (int64_t i = b[0].r0; finite && i < b[0].r1; i++) {
      const unsigned char *row = b[0].in + i * b[0].rs;
      for (int x = 0; x < g; x++)
        if (finite >> x & 1) rs_qrow_quant_bf16(row, out + i * b[0].cols, b[x].c0, b[x].c1, factor[x]);
    }
    k += (uint64_t)g;
  }
}
