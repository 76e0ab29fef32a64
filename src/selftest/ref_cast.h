/* The self-test's reference for dtype casts: written apart from the
 * library's casts (src/pack/convert.h), in floating point rather than bit
 * manipulation, so that a check of converted weights does not grade the
 * code under test with itself. Values as doubles (every format here fits
 * one exactly); rounding by the C library's nearbyint in the default
 * rounding mode (to nearest, ties to even) at the destination's unit in
 * the last place; encodings assembled from the rounded value; NaN,
 * infinity and e4m3fn's overflow as convert.h documents them (PyTorch's
 * rules). Used by reshard_selftest_check_from and by tests/unit/test_convert.c. */
#ifndef RS_SELFTEST_REF_CAST_H
#define RS_SELFTEST_REF_CAST_H

#include <stdint.h>

#include "reshard.h"

/* The value of an element's bits in a float dtype (f32, bf16, f16,
 * fp8e4m3, fp8e5m2); NAN for any NaN pattern. */
double rs_ref_decode(reshard_dtype_t dt, uint32_t bits);

/* The bits of x (a double holding a value some float dtype can hold)
 * rounded to dt, or -1 where the result is a NaN (any NaN pattern is
 * then right). */
int64_t rs_ref_round(reshard_dtype_t dt, double x);

/* DeepSeek's per_block_cast_to_fp8 for one element, as the reference
 * computes it: x (an f32 value) times 448 / max(amax, 1e-4), both
 * operations in double and rounded once to f32 (exactly f32 arithmetic:
 * a double carries more than twice f32's precision), then rounded to
 * e4m3fn; -1 for NaN. *scale_inv (if not NULL): max(amax, 1e-4) / 448,
 * in f32. */
int64_t rs_ref_quant_e4m3(float x, float amax, float *scale_inv);

/* dt's largest finite value. */
double rs_ref_max_finite(reshard_dtype_t dt);

/* Whether bits are a NaN of dt. */
int rs_ref_is_nan(reshard_dtype_t dt, uint32_t bits);

#endif
