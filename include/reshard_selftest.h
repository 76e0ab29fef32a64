/*
 * reshard self-test: prove a layout before wiring real weights.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Every element gets a value that is a function of (tensor name, step,
 * global row-major index), independent of any layout, so a destination can
 * be checked without knowing where its bytes came from; bytes of a buffer
 * outside its fragments (padding, gaps) are filled with a sentinel and
 * must stay so. Part of libreshard; the tools, tests and examples use it.
 *
 *   reshard_selftest_t src, dst;
 *   reshard_selftest_alloc(&src, src_layout, rank, step);  sources filled
 *   reshard_selftest_alloc(&dst, dst_layout, rank, -1);    sentinel only
 *   ... execute the plan with src.ptr / dst.ptr (and their bytes) ...
 *   int64_t wrong = reshard_selftest_check(&dst, dst_layout, rank, step, "sync");
 *   reshard_selftest_free(&src);  reshard_selftest_free(&dst);
 */
#ifndef RESHARD_SELFTEST_H
#define RESHARD_SELFTEST_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RESHARD_SELFTEST_SENTINEL 0xA5

/* One rank's buffers for one side of a layout. ptr, bytes and nbuf are
 * the caller's to read (ptr[b] NULL where the rank holds nothing of
 * buffer b); the rest is the library's. */
typedef struct reshard_selftest {
  int nbuf;
  unsigned char **ptr;
  size_t *bytes;
  unsigned char **mask; /* 1 where a fragment element lives */
  reshard_fragment_info_t *frags;
  size_t nfrags;
} reshard_selftest_t;

/* What the self-test writes into the elements of float tensors (bf16,
 * f16, f32, f64, fp8). Process-wide; set it before allocating, filling or
 * checking (the tools' --values).
 *
 * RESHARD_SELFTEST_BITS (the default): every byte comes from the hash, so
 * every bit pattern occurs, NaNs and infinities included: what byte-exact
 * tests of moves and casts want. A fp8 block of such values almost
 * always holds a NaN, so quantization takes its NaN path.
 * RESHARD_SELFTEST_FINITE: finite weight-like values, with a random sign
 * and mantissa and a magnitude under 1 that falls off geometrically (half
 * the values in [1/2, 1), a quarter in [1/4, 1/2), ...), clamped at the
 * dtype's smallest normal: blocks then quantize as trained weights do
 * (nearly every code an e4m3 normal, a thin tail of tiny values rarely
 * reaching its subnormals). What the timing of a converting
 * or quantizing sync should use. Other dtypes keep the hash's bytes. */
typedef enum reshard_selftest_values {
  RESHARD_SELFTEST_BITS = 0,
  RESHARD_SELFTEST_FINITE = 1
} reshard_selftest_values_t;
void reshard_selftest_set_values(reshard_selftest_values_t v);
reshard_selftest_values_t reshard_selftest_get_values(void);

/* The bytes of element `linear` (global row-major index) of tensor `name`
 * at `step`, as RESHARD_SELFTEST_BITS writes them (every dtype). */
void reshard_selftest_expected(const char *name, uint64_t step, int64_t linear,
                               size_t esize, unsigned char *out);

/* Allocates this rank's buffers of layout L (the sizes of
 * reshard_layout_buffer_bytes), sentinel-filled; when fill_step >= 0 also
 * writes that step's values into every fragment. On failure
 * (RESHARD_ERROR_OUT_OF_MEMORY, or the layout's own error) *s holds
 * nothing: free it all the same. */
reshard_result_t reshard_selftest_alloc(reshard_selftest_t *s,
                                        const reshard_layout_t *L, int rank,
                                        int64_t fill_step);
/* Writes step's values into every fragment (a "training" update). */
void reshard_selftest_fill(reshard_selftest_t *s, const reshard_layout_t *L,
                           uint64_t step);
/* Wrong fragment elements plus modified bytes outside fragments (0: all
 * correct); prints the first few to stderr with the tensor name, prefixed
 * by label. */
int64_t reshard_selftest_check(const reshard_selftest_t *s,
                               const reshard_layout_t *L, int rank,
                               uint64_t step, const char *label);
/* reshard_selftest_check of a destination whose tensors may have another
 * dtype in the source layout src (converted in flight: f32, bf16, f16,
 * fp8e4m3, fp8e5m2): such a tensor's element must be the source's value
 * (reshard_selftest_expected at the source's size) cast to the
 * destination's dtype by the self-test's own reference, written apart
 * from the library's casts (to nearest, ties to even; a NaN where the
 * cast gives NaN may be any NaN). A destination weight declared with
 * reshard_layout_add_tensor_blocked whose source is not blocked is
 * checked as quantized (each code and each scale against the self-test's
 * reference quantizer, from the source's values over the whole block).
 * src NULL: reshard_selftest_check. */
int64_t reshard_selftest_check_from(const reshard_selftest_t *s,
                                    const reshard_layout_t *L,
                                    const reshard_layout_t *src, int rank,
                                    uint64_t step, const char *label);
void reshard_selftest_free(reshard_selftest_t *s); /* zeroed: NULL-safe */

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_SELFTEST_H */
