/* The self-test's reference casts (see ref_cast.h). */
#include "selftest/ref_cast.h"

#include <math.h>
#include <string.h>

typedef struct ref_fmt {
  int ebits, mbits, ieee;
} ref_fmt;

static ref_fmt fmt_of(reshard_dtype_t dt) {
  switch (dt) {
  case RESHARD_FP32: return (ref_fmt){8, 23, 1};
  case RESHARD_BF16: return (ref_fmt){8, 7, 1};
  case RESHARD_FP16: return (ref_fmt){5, 10, 1};
  case RESHARD_FP8_E5M2: return (ref_fmt){5, 2, 1};
  default: return (ref_fmt){4, 3, 0}; /* fp8 e4m3fn: no infinities, one NaN */
  }
}

static int bias_of(ref_fmt f) { return (1 << (f.ebits - 1)) - 1; }

/* The largest finite value: all-ones exponent minus one (IEEE), or, for
 * e4m3fn, the all-ones exponent with every mantissa bit but the last. */
static double max_finite(ref_fmt f) {
  int top = (1 << f.ebits) - 1;
  if (f.ieee) return ldexp(2.0 - ldexp(1.0, -f.mbits), top - 1 - bias_of(f));
  return ldexp(2.0 - ldexp(2.0, -f.mbits), top - bias_of(f));
}

double rs_ref_max_finite(reshard_dtype_t dt) { return max_finite(fmt_of(dt)); }

int rs_ref_is_nan(reshard_dtype_t dt, uint32_t v) {
  ref_fmt f = fmt_of(dt);
  int nbits = 1 + f.ebits + f.mbits;
  uint32_t mag = v & (uint32_t)((1ull << (nbits - 1)) - 1), top = (1u << f.ebits) - 1;
  if (f.ieee) return (mag >> f.mbits) == top && (mag & ((1u << f.mbits) - 1));
  return mag == (uint32_t)((1ull << (nbits - 1)) - 1);
}

double rs_ref_decode(reshard_dtype_t dt, uint32_t v) {
  ref_fmt f = fmt_of(dt);
  int nbits = 1 + f.ebits + f.mbits;
  double sign = (v >> (nbits - 1)) & 1 ? -1.0 : 1.0;
  uint32_t field = (v >> f.mbits) & ((1u << f.ebits) - 1), mant = v & ((1u << f.mbits) - 1);
  if (rs_ref_is_nan(dt, v)) return NAN;
  if (f.ieee && field == (1u << f.ebits) - 1) return sign * INFINITY;
  if (field == 0) return sign * ldexp((double)mant, 1 - bias_of(f) - f.mbits);
  return sign * ldexp((double)((1u << f.mbits) | mant), (int)field - bias_of(f) - f.mbits);
}

int64_t rs_ref_round(reshard_dtype_t dt, double x) {
  ref_fmt f = fmt_of(dt);
  int nbits = 1 + f.ebits + f.mbits;
  uint32_t sign = signbit(x) ? 1u << (nbits - 1) : 0;
  uint32_t inf = ((1u << f.ebits) - 1) << f.mbits;
  if (isnan(x)) return -1;
  double a = fabs(x);
  if (isinf(a)) return f.ieee ? (int64_t)(sign | inf) : -1;
  if (a == 0) return sign;
  int e;
  frexp(a, &e); /* a = m x 2^e, m in [0.5, 1): exponent e - 1 */
  int emin = 1 - bias_of(f), E = e - 1;
  int ulp = (E > emin ? E : emin) - f.mbits;
  double r = ldexp(nearbyint(ldexp(a, -ulp)), ulp); /* the scaled value is exact in a double */
  if (r > max_finite(f)) return f.ieee ? (int64_t)(sign | inf) : -1;
  if (r == 0) return sign;
  if (r < ldexp(1.0, emin)) return sign | (uint32_t)ldexp(r, -(emin - f.mbits)); /* subnormal */
  frexp(r, &e);
  E = e - 1;
  uint32_t mant = (uint32_t)(ldexp(r, f.mbits - E) - ldexp(1.0, f.mbits));
  return sign | ((uint32_t)(E + bias_of(f)) << f.mbits) | mant;
}

int64_t rs_ref_quant_e4m3(float x, float amax, float *scale_inv) {
  double a = amax < 1e-4f ? (double)1e-4f : (double)amax; /* NaN stays NaN */
  float factor = (float)(448.0 / a);
  if (scale_inv) *scale_inv = (float)(a / 448.0);
  return rs_ref_round(RESHARD_FP8_E4M3, (double)(float)((double)x * (double)factor));
}
