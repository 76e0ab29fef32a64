#include "common/vec.h"

#include <stdint.h>
#include <stdlib.h>

#include "common/alloc.h"

int rs_vec_reserve(void **ptr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap : 16;
  while (n < need) {
    if (n > SIZE_MAX / 2) return -1;
    n *= 2;
  }
  if (n > SIZE_MAX / elem) return -1;
  void *p = rs_realloc(*ptr, n * elem);
  if (!p) return -1;
  *ptr = p;
  *cap = n;
  return 0;
}
