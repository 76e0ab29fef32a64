/* Checked 64-bit arithmetic: every shape product, byte size, offset and
 * stride in reshard goes through these, so that overflow is an error and
 * never a wrong address. */
#ifndef RS_COMMON_CHECKED_H
#define RS_COMMON_CHECKED_H

#include <stdbool.h>
#include <stdint.h>

/* Each returns true on overflow and leaves *out unspecified. */
static inline bool rs_mul_overflow_i64(int64_t a, int64_t b, int64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}
static inline bool rs_add_overflow_i64(int64_t a, int64_t b, int64_t *out) {
  return __builtin_add_overflow(a, b, out);
}
static inline bool rs_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}
static inline bool rs_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_add_overflow(a, b, out);
}

static inline int64_t rs_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t rs_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t rs_ceil_div_i64(int64_t a, int64_t b) {
  return a / b + (a % b != 0);
}

#endif
