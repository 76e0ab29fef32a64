/* The host's fp8 block quantizer (src/pack/quantize.c) on one core:
 * ns per element and GB/s of bytes read and written once (2 in, 1 code
 * out per bf16 element, and the scales), against memcpy of the same
 * bf16 bytes in the same process, as a ratio. Values are finite and
 * weight-like (a few magnitudes, some small enough for e4m3's
 * subnormals), so every block takes the finite path, as real weights do;
 * one run with a NaN in every block shows the NaN path.
 * Usage: quant_bench [rows cols [block]]   (default 4096 4096 128) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reshard_internal.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The best of 5 runs of one quantization of the box, in seconds. */
static double time_box(const rs_qbox *q, const void *in, unsigned char *codes, unsigned char *scales) {
  double best = 1e30;
  for (int it = 0; it < 5; it++) {
    double t0 = now_s();
    rs_quantize_box(q, in, codes, scales);
    double t = now_s() - t0;
    best = t < best ? t : best;
  }
  return best;
}

int main(int argc, char **argv) {
  const int64_t R = argc > 2 ? atoll(argv[1]) : 4096, C = argc > 2 ? atoll(argv[2]) : 4096;
  const int64_t B = argc > 3 ? atoll(argv[3]) : 128;
  if (R <= 0 || C <= 0 || B <= 0) {
    fprintf(stderr, "usage: quant_bench [rows cols [block]]\n");
    return 2;
  }
  const size_t n = (size_t)(R * C);
  uint16_t *in = malloc(2 * n), *copy = malloc(2 * n);
  unsigned char *codes = malloc(n), *scales = malloc(4 * (n / (size_t)(B * B) + (size_t)(R + C) + 1));
  if (!in || !copy || !codes || !scales) {
    fprintf(stderr, "quant_bench: out of memory\n");
    return 1;
  }
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    /* bf16: sign, exponent 2^-20 .. 2^1 (weights and their small tail), mantissa */
    const uint32_t e = 107 + (uint32_t)((s >> 40) % 22), m = (uint32_t)(s >> 33) & 0x7f;
    in[i] = (uint16_t)(((s >> 63) << 15) | (e << 7) | m);
  }
  rs_qbox q;
  memset(&q, 0, sizeof q);
  q.ndim = 2;
  q.in_dtype = RESHARD_BF16;
  q.in_stride[0] = C, q.in_stride[1] = 1;
  q.extent[0] = R, q.extent[1] = C;
  q.block[0] = q.block[1] = B;
  const double bytes = 3.0 * (double)n + 4.0 * (double)rs_qbox_blocks(&q);
  double tm = 1e30;
  for (int it = 0; it < 5; it++) {
    double t0 = now_s();
    memcpy(copy, in, 2 * n);
    double t = now_s() - t0;
    tm = t < tm ? t : tm;
  }
  const double tq = time_box(&q, in, codes, scales);
  unsigned sum = 0;
  for (size_t i = 0; i < n; i++) sum = sum * 31u + codes[i];
  for (int64_t i = 0; i < R; i += B) /* a NaN in every block */
    for (int64_t j = 0; j < C; j += B) in[i * C + j] = 0x7fc1;
  const double tn = time_box(&q, in, codes, scales);
  printf("quant_bench: %lld x %lld bf16, %lld x %lld blocks, one core\n", (long long)R, (long long)C, (long long)B,
         (long long)B);
  printf("  memcpy of the bf16 bytes:   %.3f ms, %.2f GB/s read + written\n", tm * 1e3, 4.0 * (double)n / tm / 1e9);
  printf("  quantize, finite blocks:    %.3f ms, %.2f ns/element, %.2f GB/s read + written, %.2f x memcpy's time "
         "(codes checksum %08x)\n",
         tq * 1e3, tq * 1e9 / (double)n, bytes / tq / 1e9, tq / tm, sum);
  printf("  quantize, a NaN every block: %.3f ms, %.2f ns/element\n", tn * 1e3, tn * 1e9 / (double)n);
  free(in);
  free(copy);
  free(codes);
  free(scales);
  return 0;
}
