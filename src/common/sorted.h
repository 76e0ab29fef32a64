/* Sorted arrays of int64_t: the one comparison for sorting them and the
 * one binary search in them, for the planner's cell boundaries and the
 * layout checks' cuts. */
#ifndef RS_COMMON_SORTED_H
#define RS_COMMON_SORTED_H

#include <stddef.h>
#include <stdint.h>

/* qsort's comparison of two int64_t, ascending. */
static inline int rs_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The index of the first of the n sorted values b that is >= x (n when
 * none is). */
static inline size_t rs_lower_bound_i64(const int64_t *b, size_t n, int64_t x) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (b[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

#endif
